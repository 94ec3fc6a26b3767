"""Projections as PyTorch-native models run them (``fused_qkv`` / ``fused_gate_up`` off: separate wq/wk/wv and w1/w3
linear layers, flowsim.model.ops.split_linears) and torchao's float8 tensor parallelism (``fp8_tp_gather``: FP8
sequence-parallel all-gathers, the cast on the sequence shard, flowsim.model.ops.float8_tp_casts)."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.model.workload import build_workload

# Llama 3 8B: hidden 4096, 32 heads of 128, 8 key-value groups, ffn 14336
BASE = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=8, mbs=1, tp=2, sp=True)


def _layer(**kw):
    cfg = build_config(**{**BASE, **kw})
    wl = build_workload(cfg)
    return cfg, wl.layer.compute, wl.layer.comms


def _rows(ops, name, phase):
    return ops[(ops["name"] == name) & (ops["phase"] == phase)]


def test_split_projections_gemm_shapes_and_flops():
    cfg, fused, _ = _layer()
    _, split, comms = _layer(fused_qkv=False, fused_gate_up=False)
    tokens, h, tp = cfg.microbatch_tokens, 4096, 2
    shapes = {"q_proj": 32 * 128 // tp, "k_proj": 8 * 128 // tp, "v_proj": 8 * 128 // tp,
              "gate_proj": 14336 // tp, "up_proj": 14336 // tp}
    for name, n_out in shapes.items():
        fwd, = _rows(split, name, "fwd").itertuples()
        dgrad, = _rows(split, f"{name}.dgrad", "bwd").itertuples()
        wgrad, = _rows(split, f"{name}.wgrad", "bwd").itertuples()
        assert (fwd.m, fwd.n, fwd.k) == (tokens, n_out, h)
        assert (dgrad.m, dgrad.n, dgrad.k) == (tokens, h, n_out)
        assert (wgrad.m, wgrad.n, wgrad.k) == (h, n_out, tokens)
    gemms = lambda ops: ops[ops["kind"] == "gemm"]  # noqa: E731
    assert len(gemms(split)) == len(gemms(fused)) + 3 * 3  # qkv -> 3 GEMMs, fc1 -> 2, each fwd/dgrad/wgrad
    assert gemms(split)["flops"].sum() == pytest.approx(gemms(fused)["flops"].sum())  # same work, smaller GEMMs
    assert "qkv" not in set(split["name"]) and "qkv_grad_pack" not in set(split["name"])
    tags = {c.overlap for c in comms}
    assert {"gemm:q_proj+k_proj+v_proj", "gemm:gate_proj+up_proj",
            "gemm:q_proj.wgrad+k_proj.wgrad+v_proj.wgrad", "gemm:gate_proj.wgrad+up_proj.wgrad"} <= tags


@pytest.mark.parametrize("fusion, qkv_bytes, mlp_bytes", [("fused", 2 * 4, 2 * 3), ("eager", 2 * 3 * 2, 2 * 3)])
def test_input_gradients_summed(fusion, qkv_bytes, mlp_bytes):
    # eager: autograd adds each later gradient into the first (read 2, write 1 per add); compiled: one kernel
    cfg, ops, _ = _layer(fused_qkv=False, fused_gate_up=False, kernel_fusion=fusion)
    tokens = cfg.microbatch_tokens
    assert _rows(ops, "q_proj.dgrad_sum", "bwd")["bytes"].sum() == pytest.approx(tokens * 4096 * qkv_bytes)
    assert _rows(ops, "gate_proj.dgrad_sum", "bwd")["bytes"].sum() == pytest.approx(tokens * 4096 * mlp_bytes)
    _, fused, _ = _layer(kernel_fusion=fusion)
    assert not fused["name"].str.endswith(".dgrad_sum").any()


@pytest.mark.parametrize("fusion, casts", [("eager", 3), ("fused", 1)])
def test_fp8_input_casts_per_layer_eager_once_compiled(fusion, casts):
    # torchao Float8Linear casts its input per call; a compiled graph keeps one of the identical casts
    _, ops, _ = _layer(tp=1, sp=False, precision="fp8", fused_qkv=False, kernel_fusion=fusion)
    names = {f"{n}.cast_in" for n in ("q_proj", "k_proj", "v_proj")}
    assert len(ops[ops["name"].isin(names) & (ops["phase"] == "fwd")]) == casts


def test_split_layer_is_slower_than_fused():
    fused = flowsim.simulate({**BASE, "gpus": 8})
    split = flowsim.simulate({**BASE, "gpus": 8, "fused_qkv": False, "fused_gate_up": False})
    assert split.step_time_s > fused.step_time_s


def _tp_sizes(comms):
    return {(c.op, c.phase, c.overlap): c.size_bytes for c in comms if c.group == "tp"}


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed"])  # torchao's float8 TP; Transformer Engine 1.11
def test_fp8_tp_gathers_move_one_byte(recipe):
    fp8 = dict(precision="fp8", fp8_recipe=recipe, fused_qkv=False, fused_gate_up=False)
    cfg, ops, comms = _layer(**fp8, fp8_tp_gather=True)
    _, plain_ops, plain = _layer(**fp8)
    tokens, h, tp = cfg.microbatch_tokens, 4096, 2
    for c in comms:
        if c.group == "tp":
            assert c.size_bytes == tokens * h * (1 if c.op == "allgather" else 2), c
    assert all(c.size_bytes == tokens * h * 2 for c in plain if c.group == "tp")
    # the block input is cast once, on its sequence shard, before the gather (tensorwise: amax read 2 + cast 3 bytes)
    cast = {"tensorwise": 5, "delayed": 3}[recipe]
    for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
        casts = ops[ops["name"].isin([f"{n}.cast_in" for n in group])]
        assert len(casts) == 1 and casts["bytes"].sum() == pytest.approx(tokens // tp * h * cast)
    # the row-parallel layers' output gradients cast on the shard too; their inputs as before
    for row in ("attn_out", "fc2"):
        assert _rows(ops, f"{row}.cast_grad", "bwd")["bytes"].sum() == pytest.approx(tokens // tp * h * cast)
        assert _rows(ops, f"{row}.cast_in", "fwd")["bytes"].sum() == \
            pytest.approx(_rows(plain_ops, f"{row}.cast_in", "fwd")["bytes"].sum())


@pytest.mark.parametrize("kw", [dict(precision="fp8", fp8_recipe="rowwise"), dict(precision="bf16"),
                                dict(precision="fp8", fp8_recipe="tensorwise", sp=False)])
def test_fp8_gathers_only_with_delayed_or_tensorwise_fp8_and_sequence_parallelism(kw):
    # torchtitan runs plain TP under rowwise scaling; 16-bit linears have nothing to gather in FP8
    _, ops, comms = _layer(**kw, fp8_tp_gather=True)
    _, plain_ops, plain = _layer(**kw)
    assert _tp_sizes(comms) == _tp_sizes(plain)
    assert ops["bytes"].sum() == pytest.approx(plain_ops["bytes"].sum())


@pytest.mark.parametrize("framework, qkv, gate_up, gather", [
    ("torchtitan", False, False, True), ("pytorch-fsdp", False, False, False), ("llm-foundry", True, False, False),
    ("megatron-core", True, True, False)])
def test_profiles(framework, qkv, gate_up, gather):
    t = build_config(**BASE, framework=framework).training
    assert (t.fused_qkv, t.fused_gate_up, t.fp8_tp_gather) == (qkv, gate_up, gather)
    assert build_config(**BASE, framework=framework, fused_qkv=True).training.fused_qkv  # explicit keys win


def test_bad_value_names_the_field():
    with pytest.raises(flowsim.ConfigError, match="fused_gate_up"):
        build_config(**BASE, fused_gate_up=2)
