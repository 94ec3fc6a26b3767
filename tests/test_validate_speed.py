"""What the validate path skips or shares keeps its answers: the MoE layer count without a loop over the layers,
build_config's checks without re-checking the sections it has checked, the per-(model, training) hardware FLOPs,
and the invariant check of a row's result (done once by flowsim's simulate, still by the validate loop for a
stand-in), and the outcome of a job inside one scale-up domain, whose NIC fields flowsim's analytic step does not
read, shared by the rows that differ only in them."""
import dataclasses

import make_fast_path_data
import pytest
from fuzz_inputs import configs, layouts
from hypothesis import HealthCheck, given, settings, strategies as st

import flowsim
from flowsim.config.model import ModelConfig
from flowsim.errors import ConfigError
from flowsim.model import memo
from flowsim.step import simulate as step_simulate
from flowsim.validation.runs_predict import RowPredictor, without_nics
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


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(layouts(), st.sampled_from(((100.0, 8), (800.0, 4), (25.0, 1))))
def test_a_job_inside_one_domain_reads_no_nic_field(kw, nic):
    from flowsim.config.cluster import job_domain_size
    from flowsim.step import pricer

    try:
        cfg = flowsim.build_config(**kw)
    except ConfigError:
        return
    if job_domain_size(cfg.cluster) < cfg.cluster.num_gpus:
        return
    other = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, nic_gbps=nic[0], nics_per_node=nic[1]))
    assert without_nics(cfg) == without_nics(other)
    numbers = []
    for c in (cfg, other):  # each from cold caches: nothing shared
        memo.clear_all()
        pricer._predict.cache_clear()
        pricer._layout_key.cache_clear()
        try:
            numbers.append(make_fast_path_data.result_numbers(flowsim.simulate(c)))
        except ConfigError as e:
            numbers.append(str(e))
    assert numbers[0] == numbers[1]


def test_rows_that_differ_only_in_an_unread_nic_rate_are_simulated_once(public_rows):
    from flowsim.validation.runs_mapping import config_of_row

    by_span = {}
    for r in public_rows:
        cfg = config_of_row(r)[0]
        if cfg is not None and cfg.training.comm_engine == "analytic":
            from flowsim.config.cluster import job_domain_size

            by_span.setdefault(job_domain_size(cfg.cluster) == cfg.cluster.num_gpus, r)
    for one_domain, row in by_span.items():
        rows = [dict(row, nic_gbps_per_gpu=g) for g in (100.0, 200.0)]
        shared, alone = RowPredictor(flowsim.simulate), RowPredictor(lambda c: flowsim.simulate(c))
        assert [shared.predict(r) for r in rows] == [alone.predict(r) for r in rows]
        assert len(shared._outcomes) == (1 if one_domain else 2) and len(alone._outcomes) == 2
    assert len(by_span) == 2
