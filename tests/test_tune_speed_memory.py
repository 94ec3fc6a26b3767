"""flowsim.step.memory.stage_memories (the stages' sums in one compiled pass, :func:`_stage_bytes`) equals, bit for
bit, the numpy pass over the stage axis it replaced (kept below as the reference), on random valid configs with the
knobs the accounting branches on and on configs of two tune spaces."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from test_memory_stages import _memory_configs

import flowsim
from flowsim.config.layout import chunks_per_stage, end_chunks, group_spans
from flowsim.errors import ConfigError
from flowsim.explore.space import LayoutSpace, enumerate_layouts
from flowsim.model import recompute
from flowsim.model.fusion import ACT_BYTES
from flowsim.model.workload import build_workload, layer_params, padded_vocab
from flowsim.step.data_parallel import grad_reduce_bytes, layer_gather_bytes
from flowsim.step.memory import (CAST_PER_CALL_FRAMEWORKS, CUDA_CONTEXT_BYTES, FP8_WEIGHT_BYTES,
                                 LOW_PRECISION_WEIGHT_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES, StageMemory,
                                 layer_activation_bytes, loss_bytes_per_logit, stage_memories)
from flowsim.step.schedule import held_microbatches


def _numpy_reference(cfg, wl) -> tuple:
    """Every stage in numpy arrays over the stage axis (flowsim.step.memory.stage_memories at d1e55cc)."""
    m, t = cfg.model, cfg.training
    params = np.asarray(wl.stage_params, dtype=np.float64)
    experts = np.asarray(wl.stage_expert_params, dtype=np.float64)
    dp = t.dp_shard
    edp = group_spans(t)["edp"][0]
    zero = max(t.zero_stage, 1 if t.use_distributed_optimizer else 0)

    def state(dense, expert, stage_from):
        return dense / (dp if zero >= stage_from else 1) + expert / (edp if zero >= stage_from else 1)

    layers, n_moe = wl.chunk_layers.sum(axis=1), wl.chunk_moe_layers.sum(axis=1)
    in_layers = (layers - n_moe) * layer_params(cfg) + n_moe * layer_params(cfg, moe=True)
    outside = params - in_layers
    low = LOW_PRECISION_WEIGHT_BYTES.get(wl.gemm_dtype, 0.0) if t.framework not in CAST_PER_CALL_FRAMEWORKS else 0.0
    fsdp2 = t.fsdp_version == 2 and zero >= 2
    if fsdp2 and zero >= 3:
        w = np.zeros_like(params)
    elif t.fp8_param_gather:
        w = state(FP8_WEIGHT_BYTES * in_layers + WEIGHT_BYTES * outside, FP8_WEIGHT_BYTES * experts, 3)
    else:
        w = state(WEIGHT_BYTES * params + low * in_layers, (WEIGHT_BYTES + low) * experts, 3)
    if zero >= 3:
        running = np.minimum(2, layers) * (in_layers + experts) / np.maximum(layers, 1)
        w = w + layer_gather_bytes(t) * running + WEIGHT_BYTES * outside
    grad = grad_reduce_bytes(t)
    if fsdp2 and not t.overlap_grad_reduce:
        g = grad * (params + experts)
    else:
        g = state(grad * params, grad * experts, 2)
    o = state(OPTIMIZER_BYTES * params, OPTIMIZER_BYTES * experts, 1)
    per_layer = layer_activation_bytes(cfg)
    if n_moe.any():
        mixed = ((layers - n_moe) * per_layer + n_moe * layer_activation_bytes(cfg, moe=True)) / np.maximum(layers, 1)
        per_layer = np.where(n_moe > 0, mixed, per_layer)
    mb = np.array(held_microbatches(t.schedule, t.pp, chunks_per_stage(t.schedule, t.vpp), cfg.num_microbatches,
                                    t.paired_1f1b))
    pol = recompute.policy(t)
    if pol == "op":
        act = mb * layers * per_layer + layer_activation_bytes(cfg, recomputed=False)
    elif pol in ("full", "every_n"):
        rec = wl.chunk_recompute_layers.sum(axis=1)
        layer_input = ACT_BYTES * cfg.microbatch_tokens * m.hidden_size / (t.tp if t.sequence_parallel else 1)
        stored = rec * layer_input + (layers - rec) * per_layer
        act = np.where(rec > 0, mb * stored + per_layer, mb * layers * per_layer)
    else:
        act = mb * layers * per_layer
    loss = cfg.microbatch_tokens * padded_vocab(cfg) / t.tp * loss_bytes_per_logit(t)
    for s in {s for s, _ in end_chunks(t.schedule, t.pp, wl.chunk_layers.shape[1])[1]}:
        act[s] += loss
    return tuple(StageMemory(weights_bytes=ws, gradients_bytes=gs, optimizer_bytes=os_, activations_bytes=acts,
                             runtime_bytes=CUDA_CONTEXT_BYTES)
                 for ws, gs, os_, acts in zip(w.tolist(), g.tolist(), o.tolist(), act.tolist()))


def _assert_bit_equal(cfg, got, ref):
    assert len(got) == len(ref) == cfg.training.pp
    for a, b in zip(got, ref):
        for name in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "runtime_bytes"):
            x, y = getattr(a, name), getattr(b, name)
            assert type(x) is type(y) and float(x).hex() == float(y).hex(), (name, x, y, cfg.training)


@st.composite
def _configs(draw) -> dict:
    """tests/test_memory_stages.py's configs, some of them with FP4 linears on B200 (a fractional weight copy)."""
    kw = draw(_memory_configs())
    if draw(st.integers(0, 3)) == 0:
        kw.update(cluster="dgx-b200", precision=draw(st.sampled_from(("nvfp4", "mxfp4"))), fp8_param_gather=False)
    return kw


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(_configs())
def test_compiled_stage_memories_equal_the_numpy_pass(kw):
    try:
        cfg = flowsim.build_config(**kw)
        wl = build_workload(cfg)
        ref = _numpy_reference(cfg, wl)
    except ConfigError:
        assume(False)
    _assert_bit_equal(cfg, stage_memories(cfg, wl), ref)


@pytest.mark.parametrize("job, tp, dims", [
    ({"model": "gpt3-175b", "cluster": "dgx-h100", "gpus": 1024, "gbs": 1536, "seq": 2048}, 8, {}),
    ({"model": "mixtral-8x7b", "cluster": "dgx-h100", "gpus": 64, "gbs": 128, "seq": 4096, "ep": 2, "sp": True}, 2,
     {"ep": (1, 2, 4)})])
def test_tune_space_memories_equal_the_numpy_pass(job, tp, dims):
    configs = enumerate_layouts(job, LayoutSpace.default(flowsim.build_config(job, tp=tp), **dims)).configs
    for cfg in configs[::23]:
        wl = build_workload(cfg)
        _assert_bit_equal(cfg, stage_memories(cfg, wl), _numpy_reference(cfg, wl))
