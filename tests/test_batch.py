"""Batch API: flowsim.simulate_many (one row per config, errors as rows) and exceptions that cross process pools."""
import dataclasses
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

import flowsim
from flowsim.errors import ConfigError, FlowsimWarning
from flowsim.explore.runner import Failed, evaluate_isolated, simulate_many
from flowsim.explore.store import ResultStore
from flowsim.network.maxmin import MaxMinViolation
from flowsim.step.invariants import InvariantError

GOOD = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "tp": 2, "gbs": 16}
BAD = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "tp": 3}  # 8 GPUs not divisible by tp 3


@pytest.mark.parametrize("exc", [ConfigError("tp", "must divide num_gpus", 3), ConfigError("model", "required"),
                                 MaxMinViolation("link 3 over capacity"), InvariantError("bubble < 0"),
                                 FlowsimWarning("scaled from h100")])
def test_every_flowsim_exception_pickles_with_its_fields(exc):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    if isinstance(exc, ConfigError):
        assert (back.field, back.rule, back.got) == (exc.field, exc.rule, exc.got)


def _fork_pool(n):
    methods = multiprocessing.get_all_start_methods()
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork" if "fork" in methods else "spawn"))


def test_process_pool_with_a_bad_config_keeps_the_good_results():
    with _fork_pool(2) as pool:
        futures = [pool.submit(flowsim.simulate, c) for c in (GOOD, BAD, GOOD)]
        err = futures[1].exception(timeout=300)
        good = [futures[0].result(timeout=300), futures[2].result(timeout=300)]
    assert isinstance(err, ConfigError) and err.field == "num_gpus" and err.rule == "must be divisible by tp*pp*cp"
    assert good[0].step_time_s == good[1].step_time_s == flowsim.simulate(GOOD).step_time_s


def test_simulate_many_rows_errors_and_store(tmp_path):
    db = tmp_path / "r.sqlite"
    configs = [GOOD, BAD, dict(GOOD, tp=4, gbs=32)]
    df = simulate_many(configs, jobs=2, store=db)
    assert list(df.index) == [0, 1, 2]
    assert df.loc[0, "step_time_s"] == flowsim.simulate(GOOD).step_time_s
    assert df.loc[2, "tp"] == 4 and df.loc[0, "error"] == "" and df.loc[2, "error"] == ""
    assert df.loc[1, "error"] == "ConfigError: num_gpus: must be divisible by tp*pp*cp (got 8 and 3*1*1)"
    assert df.loc[1, "step_time_s"] != df.loc[1, "step_time_s"]  # NaN
    for col in ("step_time_s", "tokens_per_s", "memory_bytes_per_gpu", "memory_capacity_bytes", "compute_s"):
        assert col in df.columns
    with ResultStore(db) as store:
        assert len(store.keys()) == 2
    again = simulate_many(configs, jobs=1, store=db)  # read back from the store, not recomputed
    assert again.loc[0, "step_time_s"] == df.loc[0, "step_time_s"]


def test_a_config_failing_inside_the_simulation_is_a_row():
    good = flowsim.build_config(GOOD)
    broken = dataclasses.replace(good, cluster=dataclasses.replace(good.cluster, gpu="no-such-gpu"))
    out = evaluate_isolated([(0, good), (1, broken)], prune_memory=False)
    assert out[0].status == "evaluated"
    assert isinstance(out[1], Failed) and out[1].error_type == "ConfigError" and out[1].index == 1
    df = simulate_many([good, broken], jobs=1)
    assert df.loc[1, "error"].startswith("ConfigError: ") and df.loc[0, "error"] == ""
