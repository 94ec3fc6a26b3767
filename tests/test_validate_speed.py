"""What the validate path skips or shares keeps its answers: the MoE layer count without a loop over the layers,
build_config's checks without re-checking the sections it has checked, the per-(model, training) hardware FLOPs,
and the invariant check of a row's result (done once by flowsim's simulate, still by the validate loop for a
stand-in)."""
import dataclasses

import pytest
from fuzz_inputs import configs, layouts
from hypothesis import HealthCheck, given, settings, strategies as st

import flowsim
from flowsim.config.model import ModelConfig
from flowsim.errors import ConfigError
from flowsim.model import memo
from flowsim.step import simulate as step_simulate
from flowsim.validation.runs_predict import RowPredictor
from flowsim.validation.runs_read import read_run_records

_MODEL = ModelConfig(name="m", num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=128)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(1, 200), st.integers(0, 210), st.integers(1, 9), st.sampled_from((0, 8)))
def test_moe_layer_count_counts_the_moe_layers(layers, dense, freq, experts):
    m = dataclasses.replace(_MODEL, num_layers=layers, moe_first_k_dense=dense, moe_layer_freq=freq,
                            num_moe_experts=experts, moe_router_topk=2)
    assert m.moe_layer_count() == sum(m.moe_layer(i) for i in range(layers))


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(st.one_of(layouts(), configs()))
def test_every_config_build_config_returns_passes_the_whole_check(kw):
    try:
        cfg = flowsim.build_config(**kw)
    except ConfigError:
        return
    cfg.validate()  # the sections' own rules again, and the rules across them


def test_hardware_flops_are_shared_by_configs_that_differ_in_their_cluster():
    a, b = (flowsim.build_config(model="llama3-70b", cluster="dgx-h100", tp=8, pp=4, dp=2, gpus=64, gbs=64,
                                 nic_gbps=g) for g in (400.0, 200.0))
    memo.clear_all()
    first = flowsim.simulate(a).hardware_flops
    assert flowsim.simulate(b).hardware_flops == first and len(step_simulate._HARDWARE_FLOPS) == 1
    memo.clear_all()
    assert flowsim.simulate(b).hardware_flops == first


@pytest.fixture(scope="module")
def public_rows(shared_data):
    return read_run_records(shared_data / "curated/training_runs_public.csv")[0][:40]


def test_rows_predicted_with_flowsims_simulate_equal_those_checked_again(public_rows):
    from flowsim.step.invariants import check_result

    def checked_again(cfg):
        result = flowsim.simulate(cfg)
        check_result(result)
        return result

    assert [RowPredictor(flowsim.simulate).predict(r) for r in public_rows] \
        == [RowPredictor(checked_again).predict(r) for r in public_rows]


def test_a_stand_ins_result_that_breaks_an_invariant_skips_its_row(public_rows):
    row = next(r for r in public_rows if RowPredictor(flowsim.simulate).predict(r).reason is None)

    def broken(cfg):
        return dataclasses.replace(flowsim.simulate(cfg), step_time_s=float("nan"))

    reason = RowPredictor(broken).predict(row).reason
    assert reason.startswith("internal error: step_time_s must be finite and > 0 (got nan)")
