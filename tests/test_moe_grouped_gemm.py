"""MoE grouped GEMMs: one GEMM launch per local expert (Transformer Engine's multi-stream cuBLAS backend)."""
import pandas as pd
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import gemm_time, op_times
from flowsim.kernels.calibration import job_stack
from flowsim.model.moe import expert_tokens
from flowsim.model.ops import MAIN_GRAD_ACCUM_BYTES_PER_ELEM, gemm, wgrad_gemm
from flowsim.model.workload import build_workload

# Mixtral 8x7B (8 experts, top-2, h 4096, expert width 14336) on 8 H100 with EP 2: 4 local experts per GPU
KW = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, ep=2, gbs=8, mbs=1, moe_imbalance_factor=1.0)
H, W, LOCAL = 4096, 14336, 4


def _rows(cfg):
    c = build_workload(cfg).moe_layer.compute
    return {(r["name"], r["phase"]): r for r in c.to_dict("records") if r["name"].startswith("expert_fc")}


def test_each_local_expert_is_one_launch_of_its_own_shape():
    cfg = build_config(**KW)
    per_expert = expert_tokens(cfg, 4096)[1]  # 4096 tokens x top-2 / 8 experts, from each of the 2 EP ranks
    assert per_expert == 4096 * 2 // 8 * 2
    rows = _rows(cfg)
    fc1 = rows[("expert_fc1", "fwd")]
    assert (fc1["m"], fc1["n"], fc1["k"], fc1["batch"], fc1["count"]) == (per_expert, 2 * W, H, 1, LOCAL)
    assert fc1["flops"] == 2.0 * per_expert * 2 * W * H  # one expert's GEMM; count multiplies it
    wgrad = rows[("expert_fc2.wgrad", "bwd")]
    assert (wgrad["m"], wgrad["n"], wgrad["k"], wgrad["count"]) == (W, H, per_expert, LOCAL)
    # the layer's expert FLOPs are unchanged: 6 GEMMs of 2 m n k per local expert (fc1 gated: 2W wide)
    total = sum(r["flops"] * r["count"] for r in rows.values())
    assert total == pytest.approx(LOCAL * 3 * 2.0 * per_expert * H * (2 * W + W))


@pytest.mark.parametrize("m", [8, 64, 200, 1000])
def test_few_tokens_per_expert_cost_more_than_one_batched_launch(m):
    """Known answer: a grouped GEMM costs ``local`` single launches of the per-expert shape, so small per-expert
    m (few output tiles, a poorly filled wave each) costs more than a batched launch packing every expert's
    tiles into shared waves; with many tokens per expert the two agree within the last-wave padding."""
    gpu = get_gpu("h100-sxm")
    experts = 32
    grouped = experts * gemm_time(m, 2 * 2048, 7168, "fp8", gpu)
    batched = gemm_time(m, 2 * 2048, 7168, "fp8", gpu, batch=experts)
    assert grouped > batched
    big = 16384
    assert experts * gemm_time(big, 4096, 7168, "fp8", gpu) == pytest.approx(
        gemm_time(big, 4096, 7168, "fp8", gpu, batch=experts), rel=0.05)


def test_grouped_gemm_time_in_a_step_is_per_launch():
    """The step prices each expert row as ``count`` launches of the single-expert GEMM."""
    cfg = build_config(**KW)
    gpu = get_gpu(cfg.cluster.gpu)
    tl = flowsim.simulate(cfg).timeline
    ops = tl.ops.assign(t=tl.op_time_s)
    fc1 = ops[(ops["name"] == "expert_fc1") & (ops["phase"] == "fwd")].iloc[0]
    per_expert = expert_tokens(cfg, 4096)[1]
    t = cfg.training
    stack = job_stack(gpu, t.software_release, cfg.cluster.power_limit_w, t.calibration, t.framework_version)
    assert fc1["count"] == LOCAL
    assert fc1["t"] == pytest.approx(gemm_time(per_expert, 2 * W, H, t.linear_dtype, gpu, stack=stack))


def test_expert_weight_gradients_accumulate_into_fp32_main_grads():
    """Known answer: each expert's wgrad GEMM reads its two inputs and reads and writes the fp32 main gradient
    (Megatron's gradient accumulation fusion), 8 bytes per weight element."""
    cfg = build_config(**KW)
    per_expert = expert_tokens(cfg, 4096)[1]
    wgrad = _rows(cfg)[("expert_fc1.wgrad", "bwd")]
    eb = 1 if cfg.training.linear_dtype == "fp8" else 2
    assert wgrad["bytes"] == eb * (H * per_expert + per_expert * 2 * W) + MAIN_GRAD_ACCUM_BYTES_PER_ELEM * H * 2 * W
    assert wgrad["count"] == LOCAL


@pytest.mark.parametrize("tokens", [16, 256])
def test_few_tokens_per_expert_make_the_weight_gradient_memory_bound(tokens):
    """With few tokens per expert the accumulated weight gradient moves more bytes than its FLOPs take: the row
    is priced by its bytes (at no more than the HBM rate), slower than the same GEMM writing a 16-bit result."""
    gpu = get_gpu("h100-sxm")
    rows = [wgrad_gemm("w", 7168, 4096, tokens, "fp8"), gemm("w", 7168, 4096, tokens, "fp8", "bwd")]
    ops = pd.DataFrame(rows)[["kind", "dtype", "m", "n", "k", "batch", "flops", "bytes"]]
    accumulated, plain = op_times(ops, gpu)
    assert accumulated > plain
    assert accumulated >= rows[0]["bytes"] / gpu.hbm_Bps
