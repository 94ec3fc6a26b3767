"""The nccl-tests / rccl-tests log reader: layouts, sections, skipped lines, bad files."""
import pytest

from flowsim.errors import ConfigError
from flowsim.validation.nccl_tests import compare_nccl_tests, read_nccl_tests, summarize
from flowsim.nccl_models import CommLayout

H100 = CommLayout(8, 1, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18, nvls=True)


def test_standard_layout_units_and_columns(shared_data):
    log = read_nccl_tests(shared_data / "nccl-tests" / "h100_8gpu_allreduce_ring_together.txt")
    df = log.frame
    assert len(df) == 31 and set(df["op"]) == {"allreduce"} and log.skipped == ()
    last = df.iloc[-1]
    # "8589934592 2147483648 float sum -1 40848.8 210.29 368.00 0 40841.7 210.32 368.06 0"
    assert (last["size_bytes"], last["count"], last["dtype"]) == (8589934592, 2147483648, "float")
    assert last["time_s"] == pytest.approx(40848.8e-6)
    assert last["algbw_Bps"] == pytest.approx(210.29e9) and last["busbw_Bps"] == pytest.approx(368.00e9)
    assert last["time_inplace_s"] == pytest.approx(40841.7e-6)
    assert not last["time_derived"]


def test_size_busbw_layout_is_marked_derived(shared_data):
    df = read_nccl_tests(shared_data / "nccl-tests" / "a100_8gpu_allreduce_azure_nda100v4.txt").frame
    row = df[df["size_bytes"] == 8589934592].iloc[0]
    # "8589934592 231.58 64912.28 132.33": busbw measured, time derived = size * 2(n-1)/n / busbw
    assert row["busbw_Bps"] == pytest.approx(231.58e9) and row["time_s"] == pytest.approx(64912.28e-6)
    assert row["time_derived"]


def test_sections_and_ops_from_comments(shared_data):
    df = read_nccl_tests(shared_data / "nccl-tests" / "h100_16gpu_2node_alltoall_xxrjun.txt").frame
    assert df.groupby("section")["op"].first().to_dict() == {0: "alltoall", 1: "sendrecv"}
    # "N/A" in the #wrong column is accepted
    assert len(df) == 20
    mi = read_nccl_tests(shared_data / "nccl-tests" / "mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt").frame
    assert sorted(set(mi["section"])) == [0, 1, 2, 3, 4, 5]
    assert mi[mi["section"] == 3]["section_title"].iloc[0] == "2-node (16 GPUs)"


def test_op_argument_fills_in_for_unnamed_logs(shared_data, tmp_path):
    path = shared_data / "nccl-tests" / "h100_8gpu_and_2node_degraded_ncclTests_issue290.txt"
    # no collective named anywhere: all_reduce_perf's columns (redop sum, root -1, count x 4 B = size) tell it
    assert set(read_nccl_tests(path).frame["op"]) == {"allreduce"}
    assert set(read_nccl_tests(path, op="allreduce").frame["op"]) == {"allreduce"}
    f = tmp_path / "unnamed.log"  # all_gather_perf's columns (redop none) do not tell it apart from alltoall
    f.write_text("        1024            32     float    none      -1    10.00    0.10    0.09      0"
                 "    10.00    0.10    0.09      0\n")
    with pytest.raises(ConfigError, match="log: no nccl-tests result rows found"):
        read_nccl_tests(f)
    assert set(read_nccl_tests(f, op="allgather").frame["op"]) == {"allgather"}


def test_every_shared_log_parses(shared_data):
    for path in sorted((shared_data / "nccl-tests").glob("*.txt")):
        assert len(read_nccl_tests(path, n_ranks=8).frame) > 0, path.name


def test_env_lines_are_read_per_section(shared_data, tmp_path):
    sharp = read_nccl_tests(shared_data / "nccl-tests" / "h100_64gpu_8node_allreduce_sharp_collnetchain_coreweave.txt")
    assert sharp.env[0].algo == "COLLNETCHAIN" and sharp.env[0].collnet_enable is True
    rack = read_nccl_tests(shared_data / "nccl-tests" / "gb200_1440gpu_20rack_allreduce_coreweave.txt")
    assert (rack.env[0].nvls_enable, rack.env[0].collnet_enable, rack.env[0].net_gdr_c2c) == (False, False, True)
    f = tmp_path / "all_reduce.log"
    row = "        1024           256     float     sum      -1    10.00    0.10    0.18      0" \
          "    10.00    0.10    0.18      0\n"
    f.write_text("# all_reduce_perf; use NCCL_ALGO=tree to compare (prose: not a setting)\n"
                 "# ENV: NCCL_PROTO=Simple NCCL_IB_HCA=mlx5\n" + row
                 + "# second run\n# host:1:1 [0] NCCL INFO NCCL_ALGO set by environment to ring\n"
                 "# export NCCL_MAX_CTAS=4\n" + row)
    log = read_nccl_tests(f)
    assert (log.env[0].proto, log.env[0].algo, log.env[0].ignored) == ("Simple", None, ("NCCL_IB_HCA",))
    assert (log.env[1].proto, log.env[1].algo, log.env[1].max_ctas) == ("Simple", "ring", 4)
    f.write_text("# all_reduce_perf\n# ENV NCCL_NVLS_ENABLE=yes\n" + row)
    with pytest.raises(ConfigError, match="NCCL_NVLS_ENABLE: must be 0 or 1"):
        read_nccl_tests(f)


def test_unparsable_rows_are_reported_with_line_numbers(tmp_path):
    f = tmp_path / "all_reduce.log"
    f.write_text("# all_reduce_perf\n"
                 "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
                 "        1024           256     float     sum      -1    10.00    0.10    0.18      0"
                 "    10.00    0.10    0.18      0\n"
                 "host01:123:456 [0] NCCL INFO Channel 00/24 : 0 1 2 3\n"
                 "        2048           512     float     sum      -1    abc    0.10    0.18      0"
                 "    10.00    0.10    0.18      0\n")
    log = read_nccl_tests(f)
    assert len(log.frame) == 1
    assert [n for n, _ in log.skipped] == [4, 5]
    assert log.skipped[1][1] == "non-numeric time or bandwidth"


@pytest.mark.parametrize("text, message", [
    ("# nothing here\n", "log: no nccl-tests result rows found"),
    ("garbage garbage\n", "log: no nccl-tests result rows found"),
])
def test_bad_logs(tmp_path, text, message):
    f = tmp_path / "x.log"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_nccl_tests(f, op="allreduce")


def test_missing_file_and_bad_op(tmp_path):
    with pytest.raises(ConfigError, match="log: cannot read file"):
        read_nccl_tests(tmp_path / "absent.log")
    with pytest.raises(ConfigError, match="op: must be one of"):
        read_nccl_tests(tmp_path / "absent.log", op="gather")


def test_compare_and_summary(shared_data):
    log = read_nccl_tests(shared_data / "nccl-tests" / "h100_8gpu_allreduce_ring_together.txt")
    cmp = compare_nccl_tests(log, H100, algo="ring")
    row = cmp.rows.iloc[-1]
    assert row["busbw_error"] == pytest.approx(row["measured_time_s"] / row["predicted_time_s"] - 1)
    assert row["measured_busbw_Bps"] == pytest.approx(8589934592 * 1.75 / 40848.8e-6)
    assert cmp.summary.n_large + cmp.summary.n_small == len(cmp.rows) == 31
    with pytest.raises(ConfigError, match="section: not in the log"):
        compare_nccl_tests(log, H100, sections=[3])


def test_summarize_splits_at_one_mebibyte():
    s = summarize([2**20 - 1, 2**20, 2**21, 2**22], [0.5, -0.1, 0.2, -0.3])
    assert (s.n_small, s.median_abs_error_small, s.n_large) == (1, 0.5, 3)
    assert s.median_abs_error_large == pytest.approx(0.2) and s.max_abs_error_large == pytest.approx(0.3)


def test_size_busbw_rows_without_time_need_n_ranks(tmp_path):
    f = tmp_path / "azure.txt"
    f.write_text("# all_reduce_perf in-place busbw\n# size_bytes  busbw_GBps\n  1073741824  175.0\n")
    with pytest.raises(ConfigError, match="log: no nccl-tests result rows found"):
        read_nccl_tests(f)  # the only row is skipped: its time cannot be derived
    row = read_nccl_tests(f, n_ranks=8).frame.iloc[0]
    # time = size * 2(n-1)/n / busbw = 2**30 * 1.75 / 175e9
    assert row["time_s"] == pytest.approx(2**30 * 1.75 / 175e9) and row["time_derived"]
