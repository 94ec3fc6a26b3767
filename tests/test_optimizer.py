"""The optimizer step per implementation (flowsim.step.optimizer): bytes, kernels and the host after its sync."""
import numpy as np
import pytest

import flowsim
from flowsim.config.training import OPTIMIZER_IMPLS
from flowsim.errors import ConfigError
from flowsim.step.host import optimizer_end_s
from flowsim.step.optimizer import (BYTES_PER_PARAM, FOREACH_BYTES_PER_PARAM, LOOP_BYTES_PER_PARAM,
                                    weight_tensors)

JOB = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=8, dp=8, zero_stage=3, seq=2048)


def _opt(**kw):
    return flowsim.simulate(JOB, **kw).stages[0].optimizer_s


def test_bytes_per_parameter_of_each_implementation():
    assert set(BYTES_PER_PARAM) == set(OPTIMIZER_IMPLS)
    assert FOREACH_BYTES_PER_PARAM == 84 and LOOP_BYTES_PER_PARAM == 92
    fused, foreach, loop = (_opt(optimizer_impl=i) for i in OPTIMIZER_IMPLS)
    # memory-bound: the step scales with the bytes per parameter
    assert foreach / fused == pytest.approx(84 / BYTES_PER_PARAM["fused"], rel=1e-6)
    assert loop / fused == pytest.approx(92 / BYTES_PER_PARAM["fused"], rel=1e-6)
    assert _opt() == fused  # empty: fused


def test_host_cost_of_the_step_after_its_sync():
    # 1,000 kernels of 1 us each issued in 4 us: the CPU's pace, plus the last kernel
    assert optimizer_end_s(1e-3, 1000, 4e-6) == pytest.approx(1000 * 4e-6 + 1e-6)
    # long kernels: only the first one's issue is exposed
    assert optimizer_end_s(1.0, 10, 4e-6) == pytest.approx(1.0 + 4e-6)
    assert np.allclose(optimizer_end_s(np.array([1.0, 1e-3]), np.array([10, 1000]), 4e-6),
                       [1.0 + 4e-6, 4e-3 + 1e-6])
    # a per-tensor loop on a host model: nine kernels per weight tensor, never faster than its bytes
    loop = _opt(optimizer_impl="for_loop", host_overhead="eager")
    assert loop >= _opt(optimizer_impl="for_loop")


def test_weight_tensors_of_a_llama_layer():
    from flowsim.model.workload import build_workload

    wl = build_workload(flowsim.build_config(JOB))
    # qkv, attention output, fc1, fc2 and two RMSNorms
    assert weight_tensors(wl.layer, False, False) == 6
    assert weight_tensors(wl.layer, True, True) == 12


def test_profiles_state_their_optimizer_and_bad_values_are_named():
    def impl(**kw):
        return flowsim.build_config(JOB, **kw).training.optimizer_impl

    assert impl(framework="llm-foundry") == "for_loop"
    assert impl(framework="torchtitan", framework_version="torchtitan-2024-12") == "foreach"
    assert impl(framework="megatron-lm") == "fused"
    with pytest.raises(ConfigError, match="optimizer_impl: must be one of fused, foreach, for_loop"):
        flowsim.build_config(JOB, optimizer_impl="sgd")
