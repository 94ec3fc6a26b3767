"""flowsim validate-comm-log over AICB's measured log (issue 18 item 5)."""
import json

import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import load_preset
from flowsim.validation.aicb_log import comm_log_summary, compare_aicb_log, harness_overhead_s

LOG = ("simai", "aicb_A100_example.csv")


def _cluster():
    return ClusterConfig(**{**load_preset("clusters", "dgx-a100"), "num_gpus": 8})


def test_harness_overhead_is_measured_on_small_calls_only(shared_data):
    overhead, calls = harness_overhead_s(shared_data.joinpath(*LOG), _cluster(), tp=2)
    # 1,427 calls below 1 MiB, of which 10 zero-byte ones (counted by csv.DictReader); 74-85 us each measured
    assert calls == 1417
    assert 60e-6 < overhead < 85e-6
    plain = compare_aicb_log(shared_data.joinpath(*LOG), _cluster(), tp=2)
    with_harness = compare_aicb_log(shared_data.joinpath(*LOG), _cluster(), tp=2, harness=True)
    assert plain.harness_overhead_s == 0.0 and with_harness.harness_overhead_s == pytest.approx(overhead)
    assert (with_harness.rows.predicted_s - plain.rows.predicted_s).to_numpy() == pytest.approx(overhead)


def test_median_time_error_per_type_within_target(shared_data):
    c = compare_aicb_log(shared_data.joinpath(*LOG), _cluster(), tp=2, harness=True)
    by_type = comm_log_summary(c, ["op"]).set_index("op")
    assert set(by_type.index) == {"allgather", "allreduce", "alltoall", "reducescatter"}
    assert (by_type.median_abs_error <= 0.10).all(), by_type
    assert by_type.loc["allgather", "calls"] == 1920 + 640 + 10


def test_cli_prints_rows_and_summaries(shared_data):
    args = ["validate-comm-log", str(shared_data.joinpath(*LOG)), "--cluster", "dgx-a100", "--tp", "2"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "# per collective type\n" in r.output and "# per collective type and group\n" in r.output
    assert "harness overhead" in r.output.splitlines()[0]
    out = json.loads(CliRunner().invoke(main, [*args, "--json", "--no-harness"]).output)
    assert out["harness_overhead_s"] == 0.0
    assert {row["op"] for row in out["by_type"]} == {"allgather", "allreduce", "alltoall", "reducescatter"}


def test_cli_bad_input_is_one_line(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("comm_type,msg_size\nCommType.all_gather,16\n")
    r = CliRunner().invoke(main, ["validate-comm-log", str(p), "--cluster", "dgx-a100", "--tp", "2"])
    assert r.exit_code == 2 and r.output.startswith("Error: aicb log: log.csv lacks the columns")
