"""flowsim tune: enumeration and pruning against a naive twin, memory pruning, ranking, reasons, Pareto."""
import itertools
import json
from collections import Counter

import pytest
from click.testing import CliRunner

import flowsim
from flowsim.cli import main
from flowsim.explore.point import PointResult, peak_memory_bytes
from flowsim.explore.space import Layout, LayoutSpace, enumerate_layouts
from flowsim.explore.store import ResultStore
from flowsim.explore.tune import loss_reason, pareto_front, tune

JOB = {"model": "llama2-7b", "cluster": "dgx-h100", "gpus": 8, "gbs": 16, "seq": 4096}
SPACE = dict(tp=(1, 2, 8), pp=(1, 2), vpp=(1, 2), cp=(1, 2), mbs=(1, 3), recompute=("none", "full"),
             zero=(0, 1, 3))


@pytest.fixture(scope="module")
def space():
    return LayoutSpace.default(flowsim.build_config(JOB, gbs=8), **SPACE)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, space):
    db = tmp_path_factory.mktemp("tune") / "r.sqlite"
    with ResultStore(db) as store:
        return db, tune(JOB, space, store=store, jobs=1)


def _naive(space):
    """Every candidate built directly with build_config: (configs that pass, failures per rule field)."""
    ok, failed = [], Counter()
    for tp, pp, vpp, cp, sp, mbs, rec, zero in itertools.product(space.tp, space.pp, space.vpp, space.cp, space.sp,
                                                                  space.mbs, space.recompute, space.zero):
        if sp and tp == 1:
            continue
        scheds = ("1f1b",) if pp == 1 else ("interleaved",) if vpp > 1 else space.schedules
        for sched in scheds:
            try:
                cfg = flowsim.build_config(JOB, tp=tp, pp=pp, vpp=vpp, cp=cp, sp=sp, mbs=mbs, recompute=rec,
                                           use_distributed_optimizer=zero == 1, zero_stage=zero if zero != 1 else 0,
                                           schedule=sched)
            except flowsim.ConfigError as e:
                failed[e.field] += 1
                continue
            if zero and cfg.training.dp * cfg.training.cp == 1:
                failed["redundant"] += 1
            else:
                ok.append(cfg)
    return ok, failed


def test_enumeration_matches_direct_build_config(space):
    enum = enumerate_layouts(JOB, space)
    ok, failed = _naive(space)
    assert set(enum.configs) == set(ok)
    assert enum.pruned == dict(failed)
    assert enum.candidates == len(ok) + sum(failed.values())
    assert {"num_gpus", "global_batch_size"} <= set(failed)


def test_top_config_fits_and_ranking_agrees_with_simulate(tuned):
    _, res = tuned
    assert res.best.fits_memory and res.best.memory_bytes_per_gpu <= res.best.memory_capacity_bytes
    picks = list(res.ranked[:4]) + list(res.ranked[len(res.ranked) // 2::max(1, len(res.ranked) // 4)])
    direct = [flowsim.simulate(JOB, **p.layout.overrides()) for p in picks]
    for p, r in zip(picks, direct):
        assert r.step_time_s == pytest.approx(p.step_time_s, rel=1e-12)
        assert r.fits_memory
    times = [r.step_time_s for r in direct[:4]]
    assert times == sorted(times)
    assert all(r.step_time_s >= direct[0].step_time_s for r in direct)
    b = res.best.layout  # and the command line agrees
    args = ["estimate", "--model", JOB["model"], "--cluster", JOB["cluster"], "--gpus", "8", "--gbs", "16", "--seq",
            "4096", "--tp", str(b.tp), "--pp", str(b.pp), "--vpp", str(b.vpp), "--cp", str(b.cp), "--mbs", str(b.mbs),
            "--sp" if b.sp else "--no-sp", "--recompute", b.recompute, "--schedule", b.schedule,
            "--zero-stage", str(b.zero if b.zero != 1 else 0),
            "--distributed-optimizer" if b.zero == 1 else "--no-distributed-optimizer", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["step_time_s"] == pytest.approx(res.best.step_time_s, rel=1e-12)


def test_memory_pruned_configs_do_not_fit(tuned, space):
    _, res = tuned
    enum = enumerate_layouts(JOB, space)
    assert res.pruned["memory"] > 0
    assert res.valid == len(enum.configs) == res.pruned["memory"] + len(res.ranked)
    ranked_keys = {p.key for p in res.ranked}
    from flowsim.explore.point import config_key
    pruned = [c for c in enum.configs if config_key(c) not in ranked_keys]
    for cfg in pruned[:: max(1, len(pruned) // 5)]:
        r = flowsim.simulate(cfg)
        assert not r.fits_memory and r.memory_bytes_per_gpu == pytest.approx(peak_memory_bytes(cfg))


def test_rerun_uses_the_store_and_ranks_the_same(tuned, space, monkeypatch):
    db, res = tuned
    with ResultStore(db) as store:
        again = tune(JOB, space, store=store, jobs=2)
    assert again.evaluated == 0 and again.reused == len(res.ranked)
    assert again.pruned == res.pruned
    assert [p.key for p in again.ranked] == [p.key for p in res.ranked]

    def fail(*_):
        raise AssertionError("a stored point was recomputed")

    monkeypatch.setattr("flowsim.explore.point.simulate", fail)
    monkeypatch.setattr("flowsim.explore.point.peak_memory_bytes", fail)  # memory-pruned configs are recorded too
    with ResultStore(db) as store:
        third = tune(JOB, space, store=store, jobs=1)
    assert third.reused == len(res.ranked) and third.pruned == res.pruned


def test_tpe_search_within_budget_agrees_with_exhaustive(tmp_path, tuned, space):
    pytest.importorskip("optuna")
    from flowsim.explore.search import tpe_search
    _, exhaustive = tuned
    with ResultStore(tmp_path / "r.sqlite") as store:
        res = tpe_search(JOB, space, budget=25, store=store, seed=3)
        assert res.search == "tpe" and res.evaluated == 25 and res.reused == 0
        by_key = {p.key: p for p in exhaustive.ranked}
        assert all(by_key[p.key].step_time_s == p.step_time_s for p in res.ranked)
        assert res.best.step_time_s >= exhaustive.best.step_time_s
        again = tpe_search(JOB, space, budget=25, store=store, seed=3)
    assert again.evaluated == 0 and again.reused == 25 and [p.key for p in again.ranked] == [p.key for p in res.ranked]
    with pytest.raises(flowsim.ConfigError, match="budget: must be a positive integer"):
        tpe_search(JOB, space, budget=0)


def _point(recompute="none", **parts):
    b = {"compute_s": 1.0, "tp_comm_s": 0.0, "pp_comm_s": 0.0, "dp_comm_s": 0.0, "bubble_s": 0.0,
         "optimizer_s": 0.1}
    b.update(parts)
    lay = Layout(tp=1, pp=1, vpp=1, cp=1, ep=1, dp=8, sp=False, mbs=1, recompute=recompute, zero=1, schedule="1f1b")
    return PointResult(key=str(sorted(b.items())), layout=lay, step_time_s=sum(b.values()), tokens_per_s=1.0,
                       mfu=0.5, memory_bytes_per_gpu=1e9, memory_capacity_bytes=8e10, fits_memory=True, breakdown=b)


def test_loss_reason_names_the_component_that_grew():
    win = _point()
    assert loss_reason(_point(bubble_s=0.4, dp_comm_s=0.1), win) == ("pipeline bubble", pytest.approx(0.4))
    assert loss_reason(_point(tp_comm_s=0.2), win)[0] == "TP comm"
    assert loss_reason(_point("full", compute_s=1.3), win)[0] == "recompute"
    assert loss_reason(_point(compute_s=1.3), win)[0] == "compute"
    assert loss_reason(_point(), win) == ("tie", 0.0)


def test_pareto_front_is_exactly_the_non_dominated_points(tuned):
    _, res = tuned
    front = pareto_front(res.ranked)
    keys = {p.key for p in front}

    def weakly_better(q, p):
        return q.step_time_s <= p.step_time_s and q.memory_bytes_per_gpu <= p.memory_bytes_per_gpu

    for p in res.ranked:
        if p.key in keys:  # nothing else is at least as good on both axes and better on one
            assert not any(weakly_better(q, p) and not weakly_better(p, q) for q in res.ranked)
        else:  # some front point is at least as good on both axes
            assert any(weakly_better(q, p) for q in front)


def test_gpt3_175b_on_1024_h100_valid_space_size():
    """The default space for GPT-3 175B on 1,024 H100 (gbs 1536, seq 2048); memory is checked by the benchmark."""
    job = {"model": "gpt3-175b", "cluster": "dgx-h100", "gpus": 1024, "gbs": 1536}
    enum = enumerate_layouts(job, LayoutSpace.default(flowsim.build_config(job, tp=8)))
    assert enum.candidates == 166_656
    assert len(enum.configs) == 49_548
    assert enum.pruned == {"num_layers": 63_552, "global_batch_size": 27_828,
                           "virtual_pipeline_model_parallel_size": 18_816, "num_gpus": 6_912}


def test_cli_tune_json_and_errors(tmp_path):
    runner = CliRunner()
    args = ["tune", "--model", "llama2-7b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "16", "--tp", "8",
            "--pp", "1", "--cp", "1", "--mbs", "1", "--zero", "0", "--db", str(tmp_path / "r.sqlite"),
            "--no-progress"]
    r = runner.invoke(main, args + ["--json", "--top", "3"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["top"][0]["rank"] == 1 and d["top"][0]["fits_memory"] and d["pareto"]
    assert d["valid"] == d["fitting"] + d["pruned"].get("memory", 0)
    r = runner.invoke(main, args + ["--csv"])
    assert r.exit_code == 0 and r.output.splitlines()[0].startswith("rank,key,tp,pp")
    r = runner.invoke(main, args + ["--set", "tp=4"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "tp: is chosen by the tuner" in r.output
    r = runner.invoke(main, args[:9] + ["--tp", "3", "--pp", "1", "--db", str(tmp_path / "r.sqlite")])
    assert r.exit_code == 2 and "no layout in the search space" in r.output
