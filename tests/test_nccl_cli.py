"""``flowsim collective`` and ``flowsim validate-nccl`` through click's CliRunner."""
import json

import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.cli.collective import parse_sizes
from flowsim.nccl_models.launch import HOST_LAUNCH_S


def run(*args):
    return CliRunner().invoke(main, list(args))


def _rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip() and not line.startswith("#")]


def test_collective_table_in_nccl_tests_layout():
    r = run("collective", "--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "1M:2M")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[1].startswith("# nThread 1 nGpus 1 minBytes 1048576 maxBytes 2097152")
    assert lines[2] == "# NCCL version 2.30.7"
    assert lines[5].split() == ["#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                                "time", "algbw", "busbw", "#wrong"]
    rows = _rows(r.output)
    # one H100 node: Ring/LL at 1 MiB, NVLS/Simple at 2 MiB; count = 1 MiB / 4 B; in-place = out-of-place
    assert rows[0][:5] == ["1048576", "262144", "float", "sum", "-1"] and rows[0][-2:] == ["#", "Ring/LL"]
    assert rows[0][5:9] == rows[0][9:13] and rows[0][8] == "0"
    assert rows[1][-1] == "NVLS/Simple"
    assert lines[-2].startswith("# Avg bus bandwidth    : ")


def test_collective_json_and_per_rank_count():
    r = run("collective", "--op", "allgather", "--cluster", "dgx-h100", "--nodes", "2", "--sizes", "64M", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    row = out["rows"][0]
    assert out["layout"]["n_ranks"] == 16 and out["layout"]["n_nodes"] == 2
    assert row["count"] == 64 * 2**20 // (4 * 16)  # nccl-tests: per-rank count for allgather
    assert row["busbw_Bps"] == pytest.approx(row["algbw_Bps"] * 15 / 16)


def test_collective_explain_prints_cost_table():
    r = run("collective", "--op", "allreduce", "--cluster", "dgx-a100", "--sizes", "1M", "--explain")
    assert r.exit_code == 0, r.output
    assert "cost table for 1048576 B" in r.output
    assert "NVLS needs NVSwitch with NVLink SHARP and SM >= 90" in r.output


def test_collective_overrides_and_cluster_options():
    r = run("collective", "--op", "allreduce", "--cluster", "dgx-h100", "--nodes", "2", "--nic-gbps", "200",
            "--algo", "ring", "--proto", "simple", "--sizes", "1G", "--json")
    row = json.loads(r.output)["rows"][0]
    assert (row["algo"], row["proto"]) == ("Ring", "Simple")


@pytest.mark.parametrize("args, message", [
    (["--op", "allreduce", "--cluster", "dgx-a100", "--algo", "nvls", "--sizes", "1M"],
     "Error: algo: cannot run allreduce on 8 ranks over 1 node(s) with this override (NVLS: NVLS needs NVSwitch"),
    (["--op", "allgather", "--cluster", "dgx-h100", "--nodes", "2", "--algo", "pat", "--sizes", "1M"],
     "PAT: PAT needs one rank per node"),
    (["--op", "allreduce", "--cluster", "dgx-h100", "--algo", "rings", "--sizes", "1M"],
     "Error: algo: unknown algorithm 'rings'"),
    (["--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "0"], "Error: --sizes: sizes must be > 0 (got 0)"),
    (["--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "8G:1G"], "Error: --sizes: MIN must not exceed MAX"),
    (["--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "1T"], "Error: --sizes: sizes are integers"),
    (["--op", "allreduce", "--cluster", "dgx-z"], "Error: cluster: unknown preset"),
    (["--op", "alltoall", "--cluster", "dgx-h100", "--explain"], "Error: --explain: alltoall is point-to-point"),
])
def test_collective_bad_input_is_one_line_exit_2(args, message):
    r = run("collective", *args)
    assert r.exit_code == 2
    assert message in r.output
    assert "Traceback" not in r.output


def test_unknown_op_is_a_usage_error():
    r = run("collective", "--op", "gather", "--cluster", "dgx-h100")
    assert r.exit_code == 2 and "'gather' is not one of" in r.output


def test_parse_sizes_doubles_with_binary_suffixes():
    assert parse_sizes("8:64") == [8, 16, 32, 64]
    assert parse_sizes("1K:4K") == [1024, 2048, 4096]
    assert parse_sizes("8G") == [8 * 2**30]


def test_validate_nccl_table_and_summary(shared_data):
    log = shared_data / "nccl-tests" / "h100_8gpu_allreduce_ring_together.txt"
    r = run("validate-nccl", str(log), "--cluster", "dgx-h100", "--algo", "ring")
    assert r.exit_code == 0, r.output
    assert "busbw error %" in r.output
    assert "sizes >= 1 MiB: 14 rows, median |busbw error|" in r.output


def test_validate_nccl_json(shared_data):
    log = shared_data / "nccl-tests" / "mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt"
    r = run("validate-nccl", str(log), "--cluster", "dgx-h100", "--gpu", "mi300x", "--cpu", "amd", "--nodes", "2",
            "--section", "3", "--algo", "ring", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["summary"]["n_large"] == 3 and out["summary"]["median_abs_error_large"] < 0.05
    assert {row["section"] for row in out["rows"]} == {3}


def test_validate_nccl_bad_log(tmp_path):
    f = tmp_path / "empty.log"
    f.write_text("# only comments\n")
    r = run("validate-nccl", str(f), "--cluster", "dgx-h100", "--op", "allreduce")
    assert r.exit_code == 2 and "Error: log: no nccl-tests result rows found" in r.output


# --- launch setup (--gpus-per-process) -----------------------------------------------------------------

def test_collective_gpus_per_process_floor_in_table_and_json():
    r = run("collective", "--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "8", "--gpus-per-process", "8",
            "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["launch"] == {"gpus_per_process": 8, "floor_s": pytest.approx(8 * HOST_LAUNCH_S),
                             "source": "--gpus-per-process"}
    assert out["rows"][0]["time_s"] == pytest.approx(8 * HOST_LAUNCH_S)
    text = run("collective", "--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "8", "--gpus-per-process", "8")
    assert "8 GPUs per process: launch floor 36.6 us" in text.output.splitlines()[0]
    assert "nThread 1 nGpus 8" in text.output.splitlines()[1]
    assert _rows(text.output)[0][5] == "36.560"


def test_collective_default_is_one_process_per_gpu():
    r = run("collective", "--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "8", "--json")
    out = json.loads(r.output)
    assert out["launch"]["gpus_per_process"] == 1 and out["launch"]["floor_s"] == 0.0
    assert out["rows"][0]["time_s"] < 20e-6  # NCCL's Ring/LL latency, no floor
    text = run("collective", "--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "8").output
    assert "1 GPU per process: no launch floor" in text


def test_collective_flow_engine_takes_the_floor():
    r = run("collective", "--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "8", "--engine", "flow",
            "--gpus-per-process", "8", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["rows"][0]["time_s"] == pytest.approx(8 * HOST_LAUNCH_S)


def test_validate_nccl_prints_the_stated_setup(shared_data):
    log = shared_data / "nccl-tests" / "h100_8gpu_allreduce_ring_together.txt"
    r = run("validate-nccl", str(log), "--cluster", "dgx-h100", "--algo", "ring")
    assert r.exit_code == 0, r.output
    assert ('# section 0: 8 GPUs per process: launch floor 36.6 us (stated in the log "nThread 1 nGpus 8")'
            in r.output.splitlines())
    out = json.loads(run("validate-nccl", str(log), "--cluster", "dgx-h100", "--algo", "ring", "--json").output)
    assert out["launch"][0]["gpus_per_process"] == 8 and out["summary"]["median_abs_error_small"] < 0.25
    assert out["rows"][0]["launch_floor_s"] == pytest.approx(8 * HOST_LAUNCH_S)


def test_validate_nccl_unknown_setup_and_override(shared_data):
    log = str(shared_data / "nccl-tests" / "gb200_4gpu_allreduce_ring_azure_ndgb200v6.txt")
    r = run("validate-nccl", log, "--cluster", "gb200-nvl72", "--algo", "ring")
    assert "# section 0: launch setup unknown: no launch floor (not stated in the log)" in r.output.splitlines()
    r = run("validate-nccl", log, "--cluster", "gb200-nvl72", "--algo", "ring", "--gpus-per-process", "4", "--json")
    out = json.loads(r.output)
    assert out["launch"][0] == {"section": 0, "gpus_per_process": 4, "source": "given", "evidence": None,
                                "floor_s": pytest.approx(4 * HOST_LAUNCH_S)}
    flow = run("validate-nccl", log, "--cluster", "gb200-nvl72", "--algo", "ring", "--gpus-per-process", "4",
               "--engine", "flow", "--json")
    rows = json.loads(flow.output)["rows"]
    assert min(row["predicted_time_s"] for row in rows) == pytest.approx(4 * HOST_LAUNCH_S)


@pytest.mark.parametrize("command, value, message", [
    ("collective", "0", "Error: gpus_per_process: must be an integer >= 1 (got 0)"),
    ("collective", "two", "Error: gpus_per_process: must be an integer >= 1 (got two)"),
    ("collective", "16", "Error: gpus_per_process: must not exceed the communicator's 8 GPU(s) per node"),
    ("validate-nccl", "-1", "Error: gpus_per_process: must be an integer >= 1 (got -1)"),
])
def test_bad_gpus_per_process_is_one_line_exit_2(shared_data, command, value, message):
    head = (["collective", "--op", "allreduce", "--sizes", "8"] if command == "collective" else
            ["validate-nccl", str(shared_data / "nccl-tests" / "h100_8gpu_allreduce_ring_together.txt")])
    r = run(*head, "--cluster", "dgx-h100", f"--gpus-per-process={value}")
    assert r.exit_code == 2
    assert r.output.startswith(message) and len(r.output.strip().splitlines()) == 1


# --- round trip: flowsim collective prints a log that validate-nccl reads back -----------------------------

@pytest.mark.parametrize("args", [
    ["--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "8:4G"],
    ["--op", "allreduce", "--cluster", "dgx-h100", "--nodes", "2", "--algo", "ring,tree", "--proto", "^ll",
     "--sizes", "1K:1G"],
    ["--op", "allgather", "--cluster", "dgx-a100", "--nodes", "2", "--sizes", "64K:256M"],
    ["--op", "reducescatter", "--cluster", "dgx-h100", "--sizes", "1M:64M", "--gpus-per-process", "8"],
    ["--op", "broadcast", "--cluster", "dgx-b200", "--sizes", "8:8M"],
    ["--op", "reduce", "--cluster", "dgx-h100", "--sizes", "1M"],
    ["--op", "alltoall", "--cluster", "dgx-h100", "--nodes", "2", "--sizes", "1M:16M"],
    ["--op", "sendrecv", "--cluster", "dgx-h100", "--nodes", "2", "--sizes", "1M:16M"],
    ["--op", "allreduce", "--cluster", "dgx-h100", "--nodes", "2", "--sizes", "1M:64M", "--engine", "flow"],
    ["--op", "allreduce", "--cluster", "dgx-h100", "--sizes", "1M:64M", "--nccl-version", "2.19"],
    ["--op", "allreduce", "--cluster", "dgx-h100", "--nodes", "8", "--collnet", "--sizes", "64K:8G"],
    ["--op", "allreduce", "--cluster", "dgx-h100", "--nodes", "8", "--collnet", "--algo", "collnetchain",
     "--sizes", "16M:1G", "--engine", "flow"],
    ["--op", "allreduce", "--cluster", "gb200-nvl72", "--nodes", "36", "--algo", "^nvls,nvlstree",
     "--sizes", "1M:8G"],
    ["--op", "allreduce", "--cluster", "gb200-nvl72", "--nodes", "25", "--sizes", "1M:1G"],  # racks of 72 + 28
], ids=lambda a: "-".join(a[1::2][:4]))
def test_round_trip_has_no_error(tmp_path, args):
    printed = run("collective", *args)
    assert printed.exit_code == 0, printed.output
    log = tmp_path / "x.txt"
    log.write_text(printed.output)
    cluster = [a for pair in zip(*[iter([x for x in args if x != "--collnet"])] * 2)
               if pair[0] in ("--cluster", "--nodes", "--engine") for a in pair]
    back = run("validate-nccl", str(log), *cluster, "--json")
    assert back.exit_code == 0, back.output
    out = json.loads(back.output)
    assert out["skipped"] == [] and len(out["rows"]) == len(_rows(printed.output))
    for row, printed_row in zip(out["rows"], _rows(printed.output)):
        assert abs(row["busbw_error"]) < 1e-4, row
        assert f"{row['algo']}/{row['proto']}" == printed_row[-1]


def test_collective_names_uneven_racks():
    """2,496 GPUs (624 trays) fill 34 NVL72 racks and 12 trays of a 35th: NCCL's nodes are listed by size."""
    out = run("collective", "--op", "allreduce", "--cluster", "gb200-nvl72", "--nodes", "624", "--sizes", "1G")
    assert out.exit_code == 0, out.output
    assert "allreduce on 2496 ranks, 34 x 72 + 1 x 48, 48 NIC(s)/node;" in out.output.splitlines()[0]


def test_estimate_runs_on_uneven_nvl72_racks():
    """A training job on 2,496 GB200 (34 full racks and 48 GPUs of a 35th) is a valid cluster: its DP group of
    624 ranks (18 per full rack, 12 on the partial one) runs NVLSTree."""
    out = run("estimate", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--gpus", "2496", "--tp", "4",
              "--gbs", "624", "--json")
    assert out.exit_code == 0, out.output
    dp = [c for c in json.loads(out.output)["collectives"] if c["group"] == "dp"]
    assert dp and all(c["n_ranks"] == 624 and c["algo"] == "NVLSTree" for c in dp)
