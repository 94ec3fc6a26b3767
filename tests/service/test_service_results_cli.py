"""`flowsim results --db URL` reads the design points tune and sweep jobs stored in the service's database, in
the same columns as the local results store."""
import pytest
from click.testing import CliRunner

pytest.importorskip("sqlalchemy")

import flowsim  # noqa: E402
from flowsim.cli import main  # noqa: E402
from flowsim.explore.point import PointResult, config_dict, config_key  # noqa: E402
from flowsim.explore.store import ResultStore, results_frame  # noqa: E402
from flowsim.service.db import open_db  # noqa: E402
from flowsim.service.store import ServiceStore, points_frame  # noqa: E402


def _points():
    out = []
    for tp in (1, 2):
        cfg = flowsim.build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=tp, gbs=32)
        key = config_key(cfg)
        out.append((config_dict(cfg), PointResult.of(cfg, flowsim.simulate(cfg), key)))
    return out


def test_results_reads_the_service_database_like_the_local_store(tmp_path):
    items = _points()
    url = f"sqlite:///{tmp_path / 'service.sqlite'}"
    engine = open_db(url)
    ServiceStore(engine).put(items, study="tune")
    engine.dispose()
    with ResultStore(tmp_path / "local.sqlite") as local:
        local.put(items, "tune")
    service, ref = points_frame(url), results_frame(tmp_path / "local.sqlite")
    assert list(service.columns) == list(ref.columns)
    same = [c for c in ref.columns if c not in ("flowsim_version", "created_s")]
    assert service[same].sort_values("tp").reset_index(drop=True).equals(ref[same].sort_values("tp").reset_index(drop=True))
    res = CliRunner().invoke(main, ["results", "--db", url, "--json"])
    assert res.exit_code == 0, res.output
    assert '"tp": 2' in res.output and '"study": "tune"' in res.output


def test_results_names_a_missing_service_database(tmp_path):
    res = CliRunner().invoke(main, ["results", "--db", f"sqlite:///{tmp_path / 'nope.sqlite'}"])
    assert res.exit_code == 2 and "--db: no such service database" in res.output
