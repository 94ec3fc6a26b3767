"""SimAI workload reader, SimAI-Analytical compatibility mode and flowsim's own prediction."""
import csv
import json

import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import load_preset
from flowsim.errors import ConfigError
from flowsim.units import GiB, MiB, US
from flowsim.validation import simai_ratio
from flowsim.validation.aicb_log import compare_aicb_log
from flowsim.validation.simai_analytical import SimaiSystem, collective_time_ns, simulate_analytical
from flowsim.validation.simai_flowsim import breakdown_rows, simulate_flowsim, split_blocks
from flowsim.validation.simai_workload import SimaiComm, parse_workload, read_workload

HEADER = ("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 1 pp: 2 vpp: 1 ga: 2 all_gpus: 16 "
          "checkpoints: 0 checkpoint_initiates: 0 pp_comm 8388608")
LINES = [
    "grad_gather -1 1 NONE 0 1 NONE 0 1 ALLGATHER 67108864 100",
    "embedding_layer -1 1000 ALLREDUCE 16777216 1 NONE 0 2000 NONE 0 100",
    "attention_column -1 30000 ALLGATHER 16777216 30000 REDUCESCATTER 16777216 30000 NONE 0 100",
    "embedding_layer -1 1000 ALLREDUCE 16777216 1 NONE 0 2000 NONE 0 100",
    "attention_column -1 30000 ALLGATHER 16777216 30000 REDUCESCATTER 16777216 30000 NONE 0 100",
]
SIMAI_ARGS = ["-g", "9216", "-nv", "360", "-nic", "48.5", "-n_p_s", "8", "-g_p_s", "8"]
# 8 NICs and 8 GPUs per server, SimAI's example flags (simai-notes 3.5)
SYSTEM = SimaiSystem(num_gpus=9216, nvlink_GBps=360, nic_GBps=48.5, nics_per_server=8, gpus_per_server=8)


def small_workload(lines=LINES, declared=None, tail="\n"):
    return parse_workload("\n".join([HEADER, str(declared or len(lines)), *lines]) + tail)


@pytest.fixture(scope="module")
def example(shared_data):
    return read_workload(shared_data / "simai" / "workload_analytical.txt")


def test_example_header(example):
    assert (example.tp, example.ep, example.pp, example.vpp, example.ga, example.all_gpus) == (2, 16, 12, 8, 24, 9216)
    assert example.pp_comm_bytes == 50331648 and len(example.layers) == 1789 and example.skipped_lines == 0
    moe = example.layers[5]
    assert moe.name == "moe_grad_norm2" and moe.wg_comm == SimaiComm("reducescatter", "DP_EP", 38654705664)


def test_simai_analytical_reproduces_published_total(example):
    """SimAI PR #294: results/example-EndToEnd.csv Total time 7,545,619 us; breakdown from simai-notes 3.5."""
    r = simulate_analytical(example, SYSTEM)
    assert r.total_s / US == pytest.approx(7_545_619, rel=1e-3)
    assert round(r.total_s / US) == 7_545_619
    expected_us = {"compute_s": 4_542_795, "exposed_ep_s": 1_222_811, "exposed_dp_ep_s": 1_067_010,
                   "exposed_tp_s": 326_686, "exposed_dp_s": 40_332, "bubble_s": 345_984, "exposed_pp_s": 0}
    for key, us in expected_us.items():
        assert getattr(r, key) / US == pytest.approx(us, abs=1), key


def test_collective_times_by_hand():
    sizes = {"TP": 2, "EP": 16, "DP": 384, "DP_EP": 24}
    # DP_EP 24 ranks, TP*EP = 32 > 8 GPUs/server: one NIC, busbw 48.5; ratio 1 (DP traffic)
    # 36 GiB / 48.5 * 23/24 s = 711,340,206 ns
    rs = SimaiComm("reducescatter", "DP_EP", 36 * GiB)
    assert collective_time_ns(rs, "wg", sizes, 2, 16, SYSTEM) == int(36 / 48.5 * 1e9 * 23 / 24)
    # TP 2 AllReduce of 48 MiB on one server: busbw nv = 360, ratio 1, x2: 2 * 48/1024/360 * 1/2 s = 130,208 ns
    ar = SimaiComm("allreduce", "TP", 48 * MiB)
    assert collective_time_ns(ar, "fwd", sizes, 2, 16, SYSTEM) == int(48 / 1024 / 360 * 1e9)
    # TP AllGather of 48 MiB: nvlink_ratio column 1 Node, interpolated between 32 MiB (.55) and 64 MiB (.65)
    # = .60, normalised by the 16 GiB row .81: 48/1024 / (360 * .60/.81) * 1/2 s = 87,890 ns
    ag = SimaiComm("allgather", "TP", 48 * MiB)
    assert collective_time_ns(ag, "fwd", sizes, 2, 16, SYSTEM) == int(48 / 1024 / (360 * 0.60 / 0.81) * 1e9 / 2)
    # small messages: 1 B < size < 1 MiB -> table by group size (TP 2: 10 us); forward 4 B is raised to 4096 B
    assert collective_time_ns(SimaiComm("allreduce", "TP", 4), "fwd", sizes, 2, 16, SYSTEM) == 10_000
    assert collective_time_ns(SimaiComm("allreduce", "DP", 4096), "wg", {**sizes, "DP": 3}, 2, 16, SYSTEM) == 0


def test_ratio_tables_match_simai_files(shared_data):
    for name, table in (("nic", simai_ratio.NIC_RATIO), ("nvlink", simai_ratio.NVLINK_RATIO),
                        ("ata", simai_ratio.ATA_RATIO)):
        with open(shared_data / "simai" / f"{name}_ratio.csv") as f:
            rows = list(csv.reader(f))
        assert tuple(h.strip() for h in rows[0][1:]) == tuple(c.strip() for c in simai_ratio.COLUMNS)
        for (size, values), row in zip(table, rows[1:], strict=True):
            assert size == int(row[0])
            assert values == tuple(float(v) if v else None for v in row[1:])


def test_bad_field_count_names_line():
    bad = [*LINES[:2], "attention_column -1 30000 ALLGATHER 16777216 30000 REDUCESCATTER", *LINES[3:]]
    with pytest.raises(ConfigError, match=r"line 5: a layer line has 12 fields .* \(got 7 fields\)"):
        small_workload(bad)


def test_unknown_collective_names_line_and_field():
    bad = [*LINES[:2], LINES[2].replace("REDUCESCATTER", "REDUCE_SCATTER"), *LINES[3:]]
    with pytest.raises(ConfigError, match=r"line 5 ig_comm_type: unknown collective.*\(got REDUCE_SCATTER\)"):
        small_workload(bad)


def test_non_integer_names_field():
    bad = [LINES[0].replace(" 1 NONE", " x NONE", 1), *LINES[1:]]
    with pytest.raises(ConfigError, match=r"line 3 fwd_compute_ns: must be an integer \(got x\)"):
        small_workload(bad)


def test_partial_file_counts_skipped_lines():
    # 5 declared lines; the file stops in the middle of the 5th (no final newline): 4 read, 1 skipped
    w = small_workload([*LINES[:4], "attention_column -1 30000 ALLGATHER"], declared=5, tail="")
    assert (len(w.layers), w.skipped_lines) == (4, 1)
    # declared 7 but only 5 present
    assert small_workload(LINES, declared=7).skipped_lines == 2


def test_flowsim_blocks_and_compute():
    w = small_workload()
    blocks, step = split_blocks(w)
    assert [len(b) for b in blocks] == [2, 2] and [s.name for s in step] == ["grad_gather"]
    f = load_preset("clusters", "dgx-h100")
    r = simulate_flowsim(w, ClusterConfig(**{**f, "num_gpus": 16}))
    # compute: grad_gather 1+1+1 ns + 2 x ((1000+1+2000) + 3 x 30000) ns = 3 + 2 x 93,001 = 186,005 ns
    assert r.compute_s == pytest.approx(186_005e-9)
    assert r.num_microbatches == 2 and r.p2p_time_s > 0
    # 1F1B with 2 stages and 2 micro-batches: one forward + one backward of idle per stage at least
    assert r.bubble_s > 0 and r.total_s > r.compute_s + r.exposed_tp_s


def test_flowsim_on_example_explains_difference(example):
    f = load_preset("clusters", "dgx-h100")
    r = simulate_flowsim(example, ClusterConfig(**{**f, "num_gpus": 9216}))
    a = simulate_analytical(example, SYSTEM)
    rows = {row["part"]: row for row in breakdown_rows(a, r)}
    assert rows["compute"]["difference_us"] == 0
    # the parts add up on both sides
    parts = [k for k in rows if k != "total"]
    assert sum(rows[k]["simai_us"] for k in parts) == pytest.approx(rows["total"]["simai_us"])
    assert sum(rows[k]["flowsim_us"] for k in parts) == pytest.approx(rows["total"]["flowsim_us"], rel=1e-9)
    # 1F1B bubble with 12 stages: at least (PP-1) x one micro-batch's stage time; SimAI divides that by vpp=8
    per_mb_s = (a.compute_s + a.exposed_tp_s + a.exposed_ep_s) / example.ga
    assert r.bubble_s > 11 * per_mb_s * 0.9 > a.bubble_s


def test_cli_simai_analytical(shared_data):
    path = str(shared_data / "simai" / "workload_analytical.txt")
    res = CliRunner().invoke(main, ["simai", "run", path, "--simai-analytical", *SIMAI_ARGS])
    assert res.exit_code == 0, res.output
    assert "7545619" in res.output.replace(",", "")
    res = CliRunner().invoke(main, ["simai", "run", path, "--simai-analytical", *SIMAI_ARGS, "--json"])
    assert round(json.loads(res.output)["simai_analytical"]["total_s"] / US) == 7_545_619


def test_cli_flowsim_side_by_side(shared_data):
    path = str(shared_data / "simai" / "workload_analytical.txt")
    res = CliRunner().invoke(main, ["simai", "run", path, "--cluster", "dgx-h100", *SIMAI_ARGS])
    assert res.exit_code == 0, res.output
    assert "pipeline bubble" in res.output and "Why they differ" in res.output


def test_cli_bad_workload_is_one_line(tmp_path):
    p = tmp_path / "w.txt"
    p.write_text("\n".join([HEADER, "1", "x -1 1 NONE 0 1 NONE 0 1 BROADCAST 4 100"]) + "\n")
    res = CliRunner().invoke(main, ["simai", "run", str(p), "--simai-analytical"])
    assert res.exit_code == 2
    assert "Error: w.txt line 3 wg_comm_type: unknown collective" in res.output
    p.write_text("\n".join([HEADER, str(len(LINES)), *LINES]) + "\n")
    res = CliRunner().invoke(main, ["simai", "run", str(p)])
    assert res.exit_code == 2 and "--cluster" in res.output


def test_aicb_log_against_hand_counts(shared_data):
    """Counted in aicb_A100_example.csv with csv.DictReader: 11 CommType.epoch_end rows, 1,280 ep_group rows
    (comm_group_size None throughout), 1,920 tp_group all_gather rows of 16,777,216 B whose median
    _elapsed_time is 0.1341 ms."""
    f = load_preset("clusters", "dgx-a100")
    c = compare_aicb_log(shared_data / "simai" / "aicb_A100_example.csv", ClusterConfig(**{**f, "num_gpus": 8}), tp=2)
    assert c.skipped["not a collective"] == 11 and c.skipped["group size never stated"] == 1280
    row = c.rows[(c.rows.op == "allgather") & (c.rows.group == "tp_group") & (c.rows.size_bytes == 16 * MiB)].iloc[0]
    assert (row.n_ranks, row.calls) == (2, 1920)
    assert row.measured_s == pytest.approx(0.1341e-3, rel=1e-3)
    res = CliRunner().invoke(main, ["simai", "aicb-log", str(shared_data / "simai" / "aicb_A100_example.csv"),
                                    "--cluster", "dgx-a100", "--tp", "2"])
    assert res.exit_code == 0 and "1920" in res.output


def test_aicb_log_missing_column(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("comm_type,msg_size\nCommType.all_gather,16\n")
    with pytest.raises(ConfigError, match=r"aicb log: log.csv lacks the columns comm_group, comm_group_size"):
        compare_aicb_log(p, ClusterConfig(gpu="a100-sxm4-80gb", num_gpus=8), tp=2)
