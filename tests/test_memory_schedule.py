"""Memory against Korthikanti et al. 2022 and pipeline bubbles against their closed forms."""
import numpy as np
import pytest

from flowsim.config import build_config
from flowsim.step.memory import in_flight_microbatches, layer_activation_bytes, stage_memory
from flowsim.step.schedule import simulate_pipeline
from flowsim.model.workload import build_workload


def test_activation_bytes_match_korthikanti_sp_formula():
    # Korthikanti et al. 2022 eq. with sequence parallelism and no stored attention scores:
    # 34 * s * b * h / t bytes per layer (GPT-3 shapes: 4h MLP, multi-head attention, dropout).
    cfg = build_config(model="gpt3-175b", cluster="dgx-h100", gpus=64, tp=8, pp=8, gbs=8, mbs=1, sp=True)
    s, b, h, t = 2048, 1, 12288, 8
    assert layer_activation_bytes(cfg) == pytest.approx(34 * s * b * h / t, rel=1e-12)
    # without SP the norm/dropout/residual tensors (10 s b h) are replicated: 10 + 24/t
    no_sp = build_config(model="gpt3-175b", cluster="dgx-h100", gpus=64, tp=8, pp=8, gbs=8, mbs=1)
    assert layer_activation_bytes(no_sp) == pytest.approx(s * b * h * (10 + 24 / t), rel=1e-12)


def test_gradient_buffer_holds_the_reduce_dtype():
    # Megatron-core allocates main_grad in fp32 only with grad_reduce_in_fp32; a bf16 reduction keeps 2 bytes/param
    fp32 = build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, dp=8, gbs=8)
    bf16 = build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, dp=8, gbs=8, grad_reduce_dtype="bf16")
    wl = build_workload(fp32)
    n = wl.stage_params[0]
    assert stage_memory(fp32, wl, 0).gradients_bytes == pytest.approx(4 * n)
    assert stage_memory(bf16, build_workload(bf16), 0).gradients_bytes == pytest.approx(2 * n)


def test_unfused_attention_adds_score_terms():
    # Korthikanti et al. 2022 eq. (2) with tensor parallelism: s b h (10 + 24/t + 5 a s / (h t))
    cfg = build_config(model="gpt3-175b", cluster="dgx-h100", gpus=64, tp=8, pp=8, gbs=8, mbs=1,
                       use_flash_attn=False)
    s, b, h, t, a = 2048, 1, 12288, 8, 96
    assert layer_activation_bytes(cfg) == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    sel = build_config(model="gpt3-175b", cluster="dgx-h100", gpus=64, tp=8, pp=8, gbs=8, mbs=1,
                       use_flash_attn=False, recompute="selective", sp=True)
    assert layer_activation_bytes(sel) == pytest.approx(34 * s * b * h / t, rel=1e-12)


def test_model_state_bytes_follow_megatron_table():
    # Megatron-LM distributed optimizer doc: 18 bytes/param plain; 6 + 12/d with the distributed optimizer
    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, dp=8, gbs=8)
    wl = build_workload(cfg)
    n = wl.stage_params[0]
    mem = stage_memory(cfg, wl, 0)
    assert mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes == pytest.approx(18 * n)
    dist = build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, dp=8, gbs=8, distributed_optimizer=True)
    mem = stage_memory(dist, wl, 0)
    assert mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes == pytest.approx((6 + 12 / 8) * n)


def test_in_flight_microbatches():
    cfg = build_config(model="gpt3-175b", cluster="dgx-h100", gpus=64, tp=8, pp=8, gbs=64)
    assert [in_flight_microbatches(cfg, s) for s in (0, 7)] == [8, 1]
    inter = build_config(model="gpt3-175b", cluster="dgx-h100", gpus=64, tp=8, pp=8, vpp=2, gbs=64)
    assert in_flight_microbatches(inter, 0) == pytest.approx(8 * (1 + 7 / 16))
    # the last stage runs (v - 1) * p warm-up chunks (Megatron-LM), so holds ((v - 1) p + 1) / v micro-batches
    assert in_flight_microbatches(inter, 7) == pytest.approx((8 + 1) / 2)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 32), (4, 4)])
def test_1f1b_bubble_is_p_minus_1_over_m(p, m):
    f, b = 1.0, 2.0
    tl = simulate_pipeline("1f1b", m, np.full((p, 1), f), np.full((p, 1), b), 0.0)
    ideal = m * (f + b)
    assert tl.end_s.max() == pytest.approx(ideal * (1 + (p - 1) / m))
    assert np.allclose(tl.busy_s, ideal)


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (4, 4, 16), (2, 3, 4)])
def test_interleaved_bubble_is_divided_by_v(p, v, m):
    f, b = 1.0 / v, 2.0 / v
    tl = simulate_pipeline("interleaved", m, np.full((p, v), f), np.full((p, v), b), 0.0)
    ideal = m * 3.0
    assert tl.end_s.max() == pytest.approx(ideal * (1 + (p - 1) / (m * v)))


def test_gpipe_and_p2p_delay():
    p, m = 4, 8
    tl = simulate_pipeline("gpipe", m, np.ones((p, 1)), 2 * np.ones((p, 1)), 0.0)
    assert tl.end_s.max() == pytest.approx(m * 3 + (p - 1) * 3)
    # GPipe: each of the 2(p-1) hops on the critical path pays the transfer time once
    d = 0.25
    g = simulate_pipeline("gpipe", m, np.ones((p, 1)), 2 * np.ones((p, 1)), d)
    assert g.end_s.max() - tl.end_s.max() == pytest.approx(2 * (p - 1) * d)
    # strict 1F1B has no slack to absorb the transfer: the delay also enters its steady state
    one = simulate_pipeline("1f1b", m, np.ones((p, 1)), 2 * np.ones((p, 1)), d)
    one0 = simulate_pipeline("1f1b", m, np.ones((p, 1)), 2 * np.ones((p, 1)), 0.0)
    assert one.end_s.max() - one0.end_s.max() > 2 * (p - 1) * d


def test_zb_h1_bubble_is_a_third_of_1f1b():
    # Qi et al. 2024 sec. 3.1: ZB-H1's bubble (p-1)(F+B-W) is a third of 1F1B's (p-1)(F+B+W) when F=B=W
    p, m, f, b, w = 4, 8, 1.0, 1.0, 1.0
    tl = simulate_pipeline("zb-h1", m, np.full((p, 1), f), np.full((p, 1), b + w), 0.0,
                           wgrad_s=np.full((p, 1), w))
    ideal = m * (f + b + w)
    assert tl.end_s.max() == pytest.approx(ideal + (p - 1) * (f + b - w))
    assert np.allclose(tl.busy_s, ideal)
    assert tl.order.shape == (p, 3 * m, 3)


def test_zb_h1_in_a_step():
    import flowsim

    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=32, tp=2, pp=4, gbs=64, sp=True)
    one = flowsim.simulate(**base)
    zb = flowsim.simulate(**base, schedule="zb-h1")
    assert zb.step_time_s < one.step_time_s
    assert zb.stages[0].compute_s == pytest.approx(one.stages[0].compute_s)
