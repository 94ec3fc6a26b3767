"""Workload op tables: FLOP counts against Megatron-LM's formula, TP sharding, communication volumes."""
import pytest

from flowsim.config import build_config
from flowsim.model.workload import build_workload, model_flops_per_token, padded_vocab

GPT = dict(model="gpt3-175b", cluster="dgx-h100")


def _flops(opset, phase=None, kind=None):
    c = opset.compute
    sel = c["phase"].isin(["fwd", "bwd"]) if phase is None else c["phase"] == phase
    if kind:
        sel &= c["kind"] == kind
    return float((c["flops"] * c["count"])[sel].sum())


def test_gemm_flops_equal_megatron_formula():
    # Narayanan et al. 2021 eq. (3) without recompute: F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
    # Its GEMM part is 72 B s l h^2 (1 + V/(12 l h)); the attention part 72 B s l h^2 * s/(6h) = 12 B s^2 l h
    # counts non-causal scores with backward = 2 x forward.
    cfg = build_config(**GPT, gpus=8, dp=8, mbs=1, gbs=8)
    wl = build_workload(cfg)
    B, s, l, h = 1, 2048, 96, 12288
    V = padded_vocab(cfg)
    gemm = l * _flops(wl.layer, kind="gemm") + _flops(wl.head, kind="gemm")
    assert gemm == pytest.approx(72 * B * s * l * h**2 * (1 + V / (12 * l * h)), rel=1e-12)
    # attention forward: 4 B s^2 h for non-causal scores, half of it computed with the causal mask
    assert _flops(wl.layer, "fwd", "attn_fwd") == pytest.approx(4 * B * s**2 * h / 2, rel=1e-12)


def test_model_flops_per_token_convention():
    cfg = build_config(**GPT, gpus=8, dp=8, gbs=8)
    l, h, s, V = 96, 12288, 2048, 51200
    # 6 N (N = 12 l h^2 transformer weights + h V head) + causal attention 6 * l * s * h
    assert model_flops_per_token(cfg) == pytest.approx(6 * (12 * l * h**2 + h * V) + 6 * l * s * h, rel=1e-12)


def test_tensor_parallel_shards_gemms_and_adds_collectives():
    one = build_workload(build_config(**GPT, gpus=8, dp=8, gbs=8))
    tp8 = build_workload(build_config(**GPT, gpus=8, tp=8, gbs=1))
    assert _flops(tp8.layer, kind="gemm") == pytest.approx(_flops(one.layer, kind="gemm") / 8, rel=1e-12)
    ar = tp8.layer.comms
    # no sequence parallelism: one all-reduce of the [s*b, h] activation per block and direction
    assert [c.op for c in ar] == ["allreduce"] * 4
    assert all(c.size_bytes == 2048 * 12288 * 2 for c in ar)
    sp = build_workload(build_config(**GPT, gpus=8, tp=8, gbs=1, sp=True)).layer.comms
    assert sorted(c.op for c in sp) == ["allgather"] * 6 + ["reducescatter"] * 4
    assert sum(c.overlap == "dgrad" for c in sp) == 2


def test_recompute_adds_forward_again():
    base = build_workload(build_config(**GPT, gpus=8, tp=8, gbs=1))
    full = build_workload(build_config(**GPT, gpus=8, tp=8, gbs=1, recompute="full"))
    sel = build_workload(build_config(**GPT, gpus=8, tp=8, gbs=1, recompute="selective"))
    assert _flops(full.layer, "recompute") == pytest.approx(_flops(base.layer, "fwd"), rel=1e-12)
    assert _flops(sel.layer, "recompute") == pytest.approx(_flops(base.layer, "fwd", "attn_fwd"), rel=1e-12)
    assert full.chunk_recompute_layers.sum() == 96 and base.chunk_recompute_layers.sum() == 0
    assert sum(c.phase == "recompute" for c in full.layer.comms) == 2


def test_pipeline_stage_parameters_sum_to_model():
    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, pp=4, dp=2, gbs=8)
    wl = build_workload(cfg)
    # untied Llama: every stage's transformer layers plus embedding (stage 0) and head (last stage)
    assert sum(wl.stage_params) == pytest.approx(cfg.model.num_parameters() - 0, rel=1e-3)
    assert wl.stage_params[0] > wl.stage_params[1] == wl.stage_params[2] < wl.stage_params[3]


def test_unfused_attention_computes_the_full_square():
    # Without FlashAttention Megatron-LM computes all s x s scores: Q K^T and P V are 2 * 2 b a s^2 d / t
    cfg = build_config(**GPT, gpus=8, tp=8, gbs=1, use_flash_attn=False)
    wl = build_workload(cfg)
    c = wl.layer.compute
    fwd = c[(c["phase"] == "fwd") & c["name"].isin(["attn_scores", "attn_context"])]
    b, s, h, t = 1, 2048, 12288, 8
    assert float(fwd["flops"].sum()) == pytest.approx(4 * b * s * s * h / t, rel=1e-12)
    # backward runs four batched GEMMs of the same size
    bwd = c[(c["phase"] == "bwd") & c["name"].str.match(r"attn_(scores|context)")]
    assert float(bwd[bwd["kind"] == "gemm"]["flops"].sum()) == pytest.approx(8 * b * s * s * h / t, rel=1e-12)


def test_uneven_pipeline_splits():
    from flowsim.model.workload import chunk_layer_counts
    # Megatron-LM's Llama-3.1-405B recipe: 126 layers + embedding + loss = 128 = 8 stages x 8 chunks x 2
    cfg = build_config(model="llama3.1-405b", cluster="dgx-h100", gpus=64, tp=8, pp=8, vpp=8, gbs=64,
                       account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    c = chunk_layer_counts(cfg)
    assert c.sum() == 126 and c[0, 0] == 1 and c[7, 7] == 1 and (c[1:7] == 2).all()
    # balanced: 70 layers over 12 stages (BLOOM) -> 5 or 6 per stage, the first stage 5
    bloom = build_config(num_layers=70, hidden_size=14336, num_attention_heads=112, cluster="dgx-a100", gpus=96,
                         tp=8, pp=12, gbs=12, pipeline_layer_split="balanced")
    b = chunk_layer_counts(bloom)[:, 0]
    assert b.sum() == 70 and b[0] == 5 and set(b) == {5, 6}


def test_context_parallel_traffic():
    kw = dict(model="llama3-8b", cluster="dgx-h100", gpus=32, tp=2, cp=4, gbs=4, seq=32768, sp=True)
    b, s_local, g, d = 1, 32768 // 4, 8 // 2, 128
    kv = 2 * b * s_local * g * d * 2  # this GPU's K and V, bf16
    ring = [c for c in build_workload(build_config(**kw)).layer.comms if c.group == "cp"]
    assert [(c.op, c.phase, c.count, c.size_bytes) for c in ring] == [
        ("sendrecv", "fwd", 3, kv), ("sendrecv", "bwd", 3, 2 * kv)]
    ag = [c for c in build_workload(build_config(**kw, cp_comm_type="all_gather")).layer.comms if c.group == "cp"]
    assert [(c.op, c.phase, c.size_bytes) for c in ag] == [
        ("allgather", "fwd", 4 * kv), ("allgather", "bwd", 4 * kv), ("reducescatter", "bwd", 4 * kv)]
