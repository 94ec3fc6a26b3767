"""The analytic step's fast path equals the slow references on random valid configurations.

Frozen reference: every number of the results of 200 seeded random valid configurations, as the analytic path
computed them before its speed work (tests/make_fast_path_data.py wrote tests/data/fast_path_expected.json.gz);
every speed change must reproduce them to 1e-9 relative.

Checked-table reference: ``flowsim.simulate``: ``flowsim.simulate`` prices the workload builder's own op table with ``op_times(trusted=True)``
(columns read without the op-table checks). Slow reference, kept here: the same call with every check of
:func:`flowsim.kernels.ops.validate_ops`, as for a user's table. Both must give the same columns, hence the
same result (to 1e-9 relative, in fact bit for bit).
"""
import gzip
import json

import make_fast_path_data
import numpy as np
import pytest
from fuzz_inputs import layouts
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import flowsim
import flowsim.step.simulate as step_simulate
from flowsim.errors import ConfigError
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
    assert not bad, f"{kw}: " + ", ".join(f"{k} {got[k]!r} != {expected[k]!r}" for k in bad[:5])


def _slow_op_times(ops, gpu, **kw):
    """The reference: op_times with the op-table checks (``trusted`` forced off)."""
    return op_times(ops, gpu, **{**kw, "trusted": False})


def _flat(d, prefix=""):
    """Numbers of a result mapping, flattened to ``{path: value}``."""
    out = {}
    items = d.items() if isinstance(d, dict) else enumerate(d)
    for k, v in items:
        if isinstance(v, (dict, list, tuple)):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out


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
    try:
        fast = flowsim.simulate(cfg).to_dict()
    except ConfigError:  # a layout valid to build but rejected by the step (e.g. a dtype the GPU lacks)
        assume(False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_simulate, "op_times", _slow_op_times)
        slow = flowsim.simulate(cfg).to_dict()
    a, b = _flat(fast), _flat(slow)
    assert a.keys() == b.keys()
    for key, value in b.items():
        assert a[key] == pytest.approx(value, rel=RTOL, abs=0.0) or (np.isnan(a[key]) and np.isnan(value)), key


def test_trusted_columns_are_validate_ops_columns():
    cfg = flowsim.build_config(model="deepseek-v3", cluster="hgx-h800", gpus=256, pp=4, ep=8, gbs=256,
                               pipeline_layer_split="balanced", precision="fp8", kernel_fusion="eager")
    wl = step_simulate.build_workload(cfg)
    ops, _ = step_simulate.ops_frame(wl)
    slow, fast = validate_ops(ops), _trusted_columns(ops)
    assert slow.keys() == fast.keys()
    for col, vals in slow.items():
        assert vals.dtype == fast[col].dtype and np.array_equal(vals, fast[col]), col
