"""The analytic step's fast path equals the slow references on random valid configurations.

Frozen reference: every number of the results of 200 seeded random valid configurations, as the analytic path
computed them before its speed work (tests/make_fast_path_data.py wrote tests/data/fast_path_expected.json.gz);
every speed change must reproduce them to 1e-9 relative.

Checked-table reference: ``flowsim.simulate`` prices the workload builder's own op table with
``op_times(trusted=True)`` (columns read without the op-table checks), once per (model, training, GPU, kernel
stack). Slow reference, kept here: the same table priced with every check of
:func:`flowsim.kernels.ops.validate_ops`, as for a user's table. Both must give the same seconds, bit for bit.
"""
import gzip
import json

import make_fast_path_data
import numpy as np
import pandas as pd
import pytest
from fuzz_inputs import layouts
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import flowsim
import flowsim.step.simulate as step_simulate
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import op_times
from flowsim.kernels.model import _trusted_columns
from flowsim.kernels.ops import validate_ops

RTOL = 1e-9
ABS_S = 1e-15  # below any physical number of a result (a femtosecond, a femtobyte): exact zeros that differ by rounding
FROZEN = json.load(gzip.open(make_fast_path_data.DATA, "rt"))


@pytest.mark.parametrize("i", range(len(FROZEN["configs"])))
def test_simulate_equals_the_frozen_results(i):
    kw, expected = FROZEN["configs"][i], FROZEN["results"][i]
    got = make_fast_path_data.result_numbers(flowsim.simulate(flowsim.build_config(**kw)))
    assert got.keys() >= expected.keys(), f"{kw}: missing {sorted(expected.keys() - got.keys())[:5]}"
    bad = [k for k, v in expected.items() if got[k] != pytest.approx(v, rel=RTOL, abs=ABS_S)]
    assert not bad, (f"{kw}: " + ", ".join(f"{k} {got[k]!r} != {expected[k]!r}" for k in bad[:5])
                     + " (a change meant to move the numbers: rerun python tests/make_fast_path_data.py)")


@st.composite
def _valid_layouts(draw):
    cfg = draw(layouts())
    if draw(st.booleans()):
        cfg["kernel_fusion"] = "eager"
    if draw(st.booleans()):
        cfg["precision"] = draw(st.sampled_from(("fp8", "fp16")))
    return cfg


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(_valid_layouts())
def test_fast_path_equals_the_slow_reference(kw):
    try:
        cfg = flowsim.build_config(**kw)
    except ConfigError:
        assume(False)
    gpu = get_gpu(cfg.cluster.gpu)
    wl, stack = step_simulate.build_workload(cfg), step_simulate._kernel_stack(cfg, gpu)
    ops, _ = step_simulate.op_columns(wl)  # the columns simulate prices; a user's table is a DataFrame
    try:
        slow = op_times(pd.DataFrame(ops), gpu, stack=stack, trusted=False)
    except ConfigError:  # a layout valid to build but rejected by the kernel model (e.g. a dtype the GPU lacks)
        assume(False)
    assert np.array_equal(step_simulate._op_seconds(cfg, wl, gpu).t_ops, slow)
    assert np.array_equal(op_times(ops, gpu, stack=stack, trusted=True), slow)


def test_trusted_columns_are_validate_ops_columns():
    cfg = flowsim.build_config(model="deepseek-v3", cluster="hgx-h800", gpus=256, pp=4, ep=8, gbs=256,
                               pipeline_layer_split="balanced", precision="fp8", kernel_fusion="eager")
    wl = step_simulate.build_workload(cfg)
    ops, _ = step_simulate.op_columns(wl)
    slow, fast = validate_ops(pd.DataFrame(ops)), _trusted_columns(ops)
    assert slow.keys() == fast.keys()
    for col, vals in slow.items():
        assert vals.dtype == fast[col].dtype and np.array_equal(vals, fast[col]), col


def test_bounded_cache_builds_once_per_key_and_drops_the_oldest():
    from flowsim.model.memo import BoundedCache

    built = []
    cache = BoundedCache(2)

    def get(key):
        return cache.get(key, lambda: built.append(key) or f"v{len(built)}")

    assert [get("a"), get("a"), get("b"), get("a")] == ["v1", "v1", "v2", "v1"]
    assert get("c") == "v3" and len(cache) == 2  # "a" (oldest) dropped
    assert get("a") == "v4" and built == ["a", "b", "c", "a"]
    assert get(("x", [1])) == "v5" and get(("x", [1])) == "v6" and len(cache) == 2  # unhashable: never kept


def test_a_reused_priced_table_repeats_its_warning():
    from flowsim.errors import FlowsimWarning

    cfg = flowsim.build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, gbs=8, precision="fp8",
                               software_release="megatron-bridge-25.11")
    for _ in range(2):  # priced, then reused
        with pytest.warns(FlowsimWarning, match=r"software_release megatron-bridge-25.11: no h100-sxm fp8 GEMM"):
            flowsim.simulate(cfg)


def test_cached_intermediates_are_read_only():
    cfg = flowsim.build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, gbs=8)
    r = flowsim.simulate(cfg)
    wl = step_simulate.build_workload(cfg)
    assert wl is step_simulate.build_workload(cfg)
    for a in (r.timeline.op_time_s, wl.chunk_layers, wl.layer.columns["flops"], wl.layer.arrays["name"],
              wl.op_table[2]["count"]):
        with pytest.raises(ValueError, match="read-only"):
            a[0] = a[0]


def _bucket_ready_reference(timeline, stage, nb):
    """bucket_ready as first written (vectorised over buckets): the slow reference of the per-chunk loop."""
    starts, ends = timeline.last_bwd_start_s[stage], timeline.last_bwd_end_s[stage]
    order = np.argsort(ends)
    per_chunk = nb // order.size + (np.arange(order.size) < nb % order.size)
    chunk = np.repeat(order, per_chunk)
    j = np.concatenate([np.arange(1, k + 1) for k in per_chunk])
    return starts[chunk] + (ends[chunk] - starts[chunk]) * j / np.repeat(per_chunk, per_chunk)


def test_bucket_ready_equals_its_reference():
    from types import SimpleNamespace

    from flowsim.step.data_parallel import bucket_ready

    rng = np.random.default_rng(22)
    for _ in range(500):
        v, stage, nb = int(rng.integers(1, 5)), int(rng.integers(0, 3)), int(rng.integers(1, 100))
        starts = rng.random((3, v)) * 10
        tl = SimpleNamespace(last_bwd_start_s=starts, last_bwd_end_s=starts + rng.random((3, v)) * 3)
        assert np.array_equal(bucket_ready(tl, stage, nb), _bucket_ready_reference(tl, stage, nb))


def test_pairwise_sum_is_numpys():
    from flowsim.step.sums import pairwise_sum

    rng = np.random.default_rng(7)
    for n in list(range(0, 300)) + [1023, 1024, 1025, 4097, 8191, 8192, 8193, 30001]:
        a = rng.random(n + 1) * 10.0 ** rng.uniform(-6, 3, n + 1)
        if n % 3 == 0:  # runs of equal bucket times, as the data-parallel streams have
            a = np.repeat(rng.random(3), [n // 2, n - n // 2, 1])
        assert pairwise_sum(a, 0, n) == a[:n].sum() and pairwise_sum(a, 1, n) == a[1:].sum()
    for p, n in ((1, 5), (3, 129), (8, 2304), (64, 1537)):  # a pipeline's busy time: rows summed along axis 1
        d = rng.random((p, n)) * 10.0 ** rng.uniform(-6, 1, (p, n))
        assert np.array_equal(d.sum(axis=1), [pairwise_sum(row, 0, n) for row in d])


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(_valid_layouts(), st.booleans(), st.sampled_from((0, 1, 2)))
def test_all_stages_exposure_equals_stage_by_stage(kw, fp8_gather, zero):
    # dp_exposed_stages (buckets priced once per set of equal stages, every stage's stream in one numba call)
    # against dp_exposed stage by stage: the same seconds bit for bit and the same calls counted for the report
    from flowsim.step.core import run_pipeline
    from flowsim.step.data_parallel import dp_exposed, dp_exposed_stages

    try:
        cfg = flowsim.build_config(**kw, zero_stage=zero, fp8_param_gather=fp8_gather and kw.get("precision") == "fp8")
        gpu = get_gpu(cfg.cluster.gpu)
        wl = step_simulate.build_workload(cfg)
        ops, spans = step_simulate.op_columns(wl)
        priced = step_simulate._op_seconds(cfg, wl, gpu)
    except ConfigError:
        assume(False)
    run = run_pipeline(step_simulate._passes(cfg, wl, step_simulate._pricer(cfg, gpu), ops, priced, spans).program)
    fast, slow = step_simulate._pricer(cfg, gpu), step_simulate._pricer(cfg, gpu)
    got = dp_exposed_stages(cfg, wl, fast, run.timeline)
    assert got == [sum(dp_exposed(cfg, wl, slow, run.timeline, s)) for s in range(cfg.training.pp)]
    assert fast.calls == slow.calls
