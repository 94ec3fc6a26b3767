"""flowsim sweep: study parsing and its errors, cost arithmetic, a real local Dask cluster, plots."""
import math

import pytest
import yaml
from click.testing import CliRunner

import flowsim
from flowsim.explore import runner
from flowsim.cli import main
from flowsim.explore.pricing import CostInputs, cluster_cost, training_cost
from flowsim.explore.store import ResultStore, results_frame
from flowsim.explore.study import parse_study
from flowsim.explore.sweep import run_study

STUDY = {
    "name": "small",
    "token_budget": 1e10,
    "job": {"model": "llama2-7b", "cluster": "dgx-h100", "gpus": 16, "gbs": 32},
    "hardware": [{"name": "8x400G", "nics_per_node": 8, "nic_gbps": 400},
                 {"name": "4x100G", "nics_per_node": 4, "nic_gbps": 100}],
    "grid": {"oversubscription": [1, 2]},
    "layout": {"tp": 1, "pp": 1, "dp": 16, "zero_stage": 3, "mbs": 1},
}


def _study(**changes):
    d = {**STUDY, **changes}
    return {k: v for k, v in d.items() if v is not None}


@pytest.mark.parametrize("changes, field, rule", [
    ({"hardware": None, "grid": None}, "study", "has no points"),
    ({"hardware": []}, "hardware", "non-empty list"),
    ({"workloads": [{"name": "w", "nic_gbps": 200}]}, "nic_gbps", "contradictory study"),
    ({"tune": True}, "layout", "contradictory study"),
    ({"layout": None}, "tune", "needs tune"),
    ({"token_budget": -5}, "token_budget", "> 0"),
    ({"cost": {"nic_usd_per_gbps": -1}}, "cost.nic_usd_per_gbps", ">= 0"),
    ({"cost": {"pue": 0.5}}, "cost.pue", ">= 1"),
    ({"cost": {"gpu_usd": 1}}, "cost.gpu_usd", "unknown cost input"),
    ({"grid": {"oversubscription": []}}, "grid.oversubscription", "non-empty list"),
    ({"extra": 1}, "extra", "unknown study key"),
])
def test_bad_studies_name_the_field(changes, field, rule):
    with pytest.raises(flowsim.ConfigError) as e:
        parse_study(_study(**changes))
    assert e.value.field == field and rule in str(e.value)


def test_empty_study_file_is_one_line_exit_2(tmp_path):
    for text in ("", "name: x\nhardware:\n  - {nic_gbps: 400}\nworkloads:\n  - {nic_gbps: 200}\n"
                 "token_budget: 1e9\nlayout: {tp: 1}\n"):
        f = tmp_path / "s.yaml"
        f.write_text(text)
        r = CliRunner().invoke(main, ["sweep", str(f), "--db", str(tmp_path / "r.sqlite")])
        assert r.exit_code == 2 and r.output.count("\n") == 1 and r.output.startswith("Error: ")


def test_cost_arithmetic():
    inputs = CostInputs.from_mapping({"server_usd_per_gpu": 10_000, "nic_usd_per_gbps": 1,
                                      "switch_port_usd_per_gbps": 2, "transceiver_usd_per_gbps": 3,
                                      "switch_port_power_w": 10, "gpu_power_w": 700, "host_power_w_per_gpu": 300,
                                      "pue": 1.5, "electricity_usd_per_kwh": 0.1, "amortization_years": 1})
    # 16 GPUs = 2 hosts x 8 NICs; 8 rail leaves (one per rail) of 2 NICs each, a spine layer: 2 up-links per
    # leaf at 1:1 (1 at 2:1). Ports: 16 NIC-side + 2 x 16 up-links; transceivers: 2 x (16 + 16).
    c = cluster_cost(flowsim.build_config(STUDY["job"]).cluster, inputs)
    assert (c.nics, c.switch_ports, c.transceivers) == (16, 48, 64)
    assert c.capex_usd == {"servers": 160_000, "nics": 16 * 400, "switches": 48 * 400 * 2, "optics": 64 * 400 * 3}
    power_w = 16 * (700 + 300) + 48 * 10
    assert c.it_power_w == power_w
    assert c.usd_per_hour == pytest.approx(c.capex_total_usd / 8766 + power_w / 1e3 * 1.5 * 0.1)
    over = cluster_cost(flowsim.build_config(STUDY["job"], oversubscription=2).cluster, inputs)
    assert (over.switch_ports, over.transceivers) == (32, 48)
    t = training_cost(1e6, 16, c, 3.6e9)  # one hour
    assert t.time_to_train_s == pytest.approx(3600) and t.gpu_hours == pytest.approx(16)
    assert t.cost_usd == pytest.approx(c.usd_per_hour)
    assert t.usd_per_million_tokens == pytest.approx(c.usd_per_hour / 3600)


@pytest.fixture(scope="module")
def local_result(tmp_path_factory):
    db = tmp_path_factory.mktemp("sweep") / "r.sqlite"
    with ResultStore(db) as store:
        return run_study(parse_study(_study()), store=store, jobs=1)


def test_fixed_layout_study(local_result):
    rows = local_result.rows
    assert [(r.point.hardware, r.point.grid["oversubscription"]) for r in rows] == \
        [("8x400G", 1), ("8x400G", 2), ("4x100G", 1), ("4x100G", 2)]
    direct = flowsim.simulate(STUDY["job"], nics_per_node=4, nic_gbps=100, **STUDY["layout"])
    assert rows[2].best.step_time_s == pytest.approx(direct.step_time_s, rel=1e-12)
    assert rows[0].best.step_time_s < rows[2].best.step_time_s  # ZeRO-3 over 4x100G is slower
    assert rows[0].cost.capex_total_usd > rows[1].cost.capex_total_usd > rows[3].cost.capex_total_usd
    for r in rows:
        d = r.to_dict()
        assert d["status"] == "ok" and 0 < d["exposed_comm_share"] < 1
        assert d["cost_usd"] == pytest.approx(d["usd_per_hour"] * d["time_to_train_s"] / 3600)


def test_tuned_study_point_takes_the_fastest_fitting_layout(tmp_path):
    study = parse_study(_study(layout=None, tune={"tp": [1, 2], "pp": [1], "cp": [1], "mbs": [1], "zero": [1, 3],
                                                  "recompute": ["none"]}, grid=None, hardware=STUDY["hardware"][:1]))
    with ResultStore(tmp_path / "r.sqlite") as store:
        res = run_study(study, store=store, jobs=1)
    [row] = res.rows
    assert row.candidates == 6 and res.evaluated + res.reused == 6  # tp 1 (sp off) or 2 (sp off/on), zero 1 or 3
    job = dict(STUDY["job"], nics_per_node=8, nic_gbps=400)
    best = min((flowsim.simulate(job, tp=tp, sp=sp, mbs=1, zero_stage=z, use_distributed_optimizer=z == 1)
                for tp, sp in ((1, False), (2, False), (2, True)) for z in (1, 3)), key=lambda r: r.step_time_s)
    assert row.best.step_time_s == pytest.approx(best.step_time_s, rel=1e-12)


def test_local_dask_cluster_gives_the_same_results_into_the_same_store(tmp_path, local_result):
    distributed = pytest.importorskip("dask.distributed")
    db = tmp_path / "r.sqlite"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
        address = "dask://" + cl.scheduler_address.split("://", 1)[1]
        with ResultStore(db) as store:
            res = run_study(parse_study(_study()), store=store, scheduler=address)
    assert res.evaluated == 4
    assert [r.best.step_time_s for r in res.rows] == [r.best.step_time_s for r in local_result.rows]
    assert len(results_frame(db, "small")) == 4


def test_unreachable_scheduler_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("dask.distributed")
    monkeypatch.setattr(runner, "DASK_CONNECT_TIMEOUT_S", 1.0)
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(_study()))
    r = CliRunner().invoke(main, ["sweep", str(f), "--db", str(tmp_path / "r.sqlite"), "--scheduler",
                                  "dask://127.0.0.1:9"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "scheduler: cannot reach the Dask scheduler" in r.output
    r = CliRunner().invoke(main, ["sweep", str(f), "--db", str(tmp_path / "r.sqlite"), "--scheduler", "nohost"])
    assert r.exit_code == 2 and "dask://HOST:PORT" in r.output


def test_cli_table_csv_and_plot(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(_study()))
    png = tmp_path / "out.png"
    r = CliRunner().invoke(main, ["sweep", str(f), "--db", str(tmp_path / "r.sqlite"), "--plot", str(png),
                                  "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "8x400G" in r.output and "exposed comm %" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = CliRunner().invoke(main, ["sweep", str(f), "--db", str(tmp_path / "r.sqlite"), "--csv", "--no-progress"])
    lines = r.output.splitlines()
    assert len(lines) == 5 and "usd_per_million_tokens" in lines[0]
    assert not math.isnan(float(lines[1].split(",")[lines[0].split(",").index("step_time_s")]))
