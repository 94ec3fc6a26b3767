"""flowsim.step.memory.stage_memories (every stage in one numpy pass over the stage axis, the per-config terms once)
equals the stage-by-stage accounting it replaced, kept below as the slow reference, on random valid configs."""
import math

from fuzz_inputs import layouts
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import flowsim
from flowsim.config.layout import end_chunks, group_spans
from flowsim.errors import ConfigError
from flowsim.model import recompute
from flowsim.model.fusion import ACT_BYTES
from flowsim.model.workload import build_workload, layer_params, padded_vocab
from flowsim.step.data_parallel import grad_reduce_bytes, layer_gather_bytes
from flowsim.step.memory import (CAST_PER_CALL_FRAMEWORKS, CUDA_CONTEXT_BYTES, FP8_WEIGHT_BYTES,
                                 LOW_PRECISION_WEIGHT_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES, StageMemory,
                                 in_flight_microbatches, layer_activation_bytes, loss_bytes_per_logit, stage_memories,
                                 stage_memory)


def _reference(cfg, wl, stage: int) -> StageMemory:
    """One stage, term by term in Python scalars (flowsim.step.memory.stage_memory before the vectorised pass)."""
    m, t = cfg.model, cfg.training
    params, experts = wl.stage_params[stage], wl.stage_expert_params[stage]
    dp, edp = t.dp_shard, group_spans(t)["edp"][0]
    zero = max(t.zero_stage, 1 if t.use_distributed_optimizer else 0)

    def state(dense, expert, stage_from):
        return dense / (dp if zero >= stage_from else 1) + expert / (edp if zero >= stage_from else 1)

    layers, n_moe = int(wl.chunk_layers[stage].sum()), int(wl.chunk_moe_layers[stage].sum())
    in_layers = (layers - n_moe) * layer_params(cfg) + n_moe * layer_params(cfg, moe=True)
    outside = params - in_layers
    low = LOW_PRECISION_WEIGHT_BYTES.get(wl.gemm_dtype, 0.0) if t.framework not in CAST_PER_CALL_FRAMEWORKS else 0.0
    fsdp2 = t.fsdp_version == 2 and zero >= 2
    if fsdp2 and zero >= 3:
        w = 0.0
    elif t.fp8_param_gather:
        w = state(FP8_WEIGHT_BYTES * in_layers + WEIGHT_BYTES * outside, FP8_WEIGHT_BYTES * experts, 3)
    else:
        w = state(WEIGHT_BYTES * params + low * in_layers, (WEIGHT_BYTES + low) * experts, 3)
    if zero >= 3:
        running = min(2, layers) * (in_layers + experts) / max(layers, 1)
        w += layer_gather_bytes(t) * running + WEIGHT_BYTES * outside
    if fsdp2 and not t.overlap_grad_reduce:
        g = grad_reduce_bytes(t) * (params + experts)
    else:
        g = state(grad_reduce_bytes(t) * params, grad_reduce_bytes(t) * experts, 2)
    o = state(OPTIMIZER_BYTES * params, OPTIMIZER_BYTES * experts, 1)
    per_layer = layer_activation_bytes(cfg)
    if n_moe:
        per_layer = ((layers - n_moe) * per_layer + n_moe * layer_activation_bytes(cfg, moe=True)) / max(layers, 1)
    mb = in_flight_microbatches(cfg, stage)
    rec = int(wl.chunk_recompute_layers[stage].sum()) if recompute.policy(t) in ("full", "every_n") else 0
    if recompute.policy(t) == "op":
        act = mb * layers * per_layer + layer_activation_bytes(cfg, recomputed=False)
    elif rec:
        layer_input = ACT_BYTES * cfg.microbatch_tokens * m.hidden_size / (t.tp if t.sequence_parallel else 1)
        act = mb * (rec * layer_input + (layers - rec) * per_layer) + per_layer
    else:
        act = mb * layers * per_layer
    if any(s == stage for s, _ in end_chunks(t.schedule, t.pp, wl.chunk_layers.shape[1])[1]):
        act += cfg.microbatch_tokens * padded_vocab(cfg) / t.tp * loss_bytes_per_logit(t)
    return StageMemory(weights_bytes=w, gradients_bytes=g, optimizer_bytes=o, activations_bytes=act,
                       runtime_bytes=CUDA_CONTEXT_BYTES)


@st.composite
def _memory_configs(draw) -> dict:
    """A usually valid layout (tests/fuzz_inputs.py) with the knobs the memory accounting branches on."""
    kw = draw(layouts())
    kw["zero_stage"] = draw(st.sampled_from((0, 1, 2, 3)))
    kw["fsdp_version"] = draw(st.sampled_from((1, 2)))
    kw["overlap_grad_reduce"] = draw(st.booleans())
    kw["precision"] = draw(st.sampled_from(("bf16", "bf16", "fp8")))
    kw["fp8_param_gather"] = kw["precision"] == "fp8" and draw(st.booleans())
    kw["grad_reduce_dtype"] = draw(st.sampled_from(("fp32", "bf16")))
    kw["use_flash_attn"] = draw(st.booleans())
    kw["framework"] = draw(st.sampled_from(("", "torchtitan")))
    if kw["pp"] > 1:
        kw["schedule"] = draw(st.sampled_from(("auto", "1f1b", "gpipe", "zb-h1", "dualpipe")))
        if kw["schedule"] == "dualpipe":  # an even number of micro-batches, at least 2 pp, on one chunk a stage
            kw.update(vpp=1, gbs=kw["mbs"] * kw["dp"] * 2 * kw["pp"] * draw(st.sampled_from((1, 2))))
    rec = draw(st.sampled_from(("none", "full", "full_partial", "modules", "op", "every_n")))
    if rec == "full_partial":
        kw.update(recompute="full", recompute_num_layers=draw(st.sampled_from((1, 2))))
    elif rec == "modules":
        kw.update(recompute="selective", recompute_modules=("core_attn", "mlp", "layernorm", "moe_act"))
    elif rec in ("op", "every_n"):
        kw.update(recompute="selective", selective_ac_option="op" if rec == "op" else "2")
    else:
        kw["recompute"] = rec
    return kw


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0) or a == b


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(_memory_configs())
def test_stage_memories_equal_the_stage_by_stage_reference(kw):
    try:
        cfg = flowsim.build_config(**kw)
        wl = build_workload(cfg)
        ref = [_reference(cfg, wl, s) for s in range(cfg.training.pp)]
    except ConfigError:
        assume(False)
    got = stage_memories(cfg, wl)
    assert len(got) == len(ref) == cfg.training.pp
    for s, (a, b) in enumerate(zip(got, ref)):
        for name in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "runtime_bytes"):
            x, y = getattr(a, name), getattr(b, name)
            assert type(x) is type(y) and _close(x, y), (s, name, x, y)
        assert stage_memory(cfg, wl, s) == a
