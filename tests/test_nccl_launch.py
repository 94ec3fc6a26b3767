"""The benchmark launch setup: detection from log headers, the launch floor, its closed form and its checks."""
import pytest

from flowsim.errors import ConfigError
from flowsim.nccl_models import CommLayout, predict
from flowsim.nccl_models.launch import HOST_LAUNCH_S, check_gpus_per_process, launch_floor_s, with_launch_floor
from flowsim.validation.nccl_tests import (
    LaunchStatement, apply_launch_floor, compare_nccl_tests, launch_statement_of, read_nccl_tests,
)

H100 = CommLayout(8, 1, compute_capability=90, scaleup_Bps=450e9, scaleup_links=18, nvls=True)
GB200 = CommLayout(4, 1, compute_capability=100, scaleup_Bps=900e9, scaleup_links=18, nvls=True, cpu="arm")


# --- detection: every header style of shared/data/nccl-tests, and what is not a statement ------------------

@pytest.mark.parametrize("line, count, evidence", [
    ("# HARDWARE: 8x H100 SXM, single process -g 8 (nThread 1 nGpus 8)", 8, "nThread 1 nGpus 8"),
    ("# nThread 1 nGpus 4 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20", 4,
     "nThread 1 nGpus 4"),
    ("# HARDWARE: 1 node, 8x H100 80GB HBM3 SXM (HGX, NVSwitch), single process -g 8; NCCL 2.26.2", 8,
     "single process -g 8"),
    ("# NCCL 2.20.5; benchmark runs a single process of all_reduce_perf over all local GPUs (-g 8)", 8,
     "single process of all_reduce_perf over all local GPUs (-g 8)"),
    ('# a setup note "./build/all_reduce_perf -b 8 -e 128M -f 2 -g 8", host "dkh")', 8, "-g 8"),
    ("#   mpirun -np 16 -npernode 8, all_reduce_perf -b 8 -e 8G -f 2 -g 1; NCCL version/env not shown", 1, "-g 1"),
    ("# HARDWARE: 2 nodes x 8x NVIDIA H100; 16 ranks (1 proc/GPU, MPI)", 1, "1 proc/GPU"),
    ("# launched with one process per GPU", 1, "one process per GPU"),
])
def test_launch_statement_header_styles(line, count, evidence):
    assert launch_statement_of([line]) == LaunchStatement(count, evidence)


@pytest.mark.parametrize("line", [
    "# NCCL 2.25.1, CUDA 12.8; all_reduce_perf in-place busbw, \"Ring algorithm\", n=4 GPUs (single host; "
    "see Azure/AI-benchmarking-guide issue #7: only 4 GPUs tested)",
    "# HARDWARE: Azure ND A100 v4 (96asr_v4-class), 1 node, 8x NVIDIA A100-SXM4-80GB",
    "# host nccl-g8 ran it",
])
def test_headers_without_a_launch_statement_are_unknown(line):
    assert launch_statement_of([line]) == LaunchStatement(None, None)


def test_banner_outranks_the_command_line():
    assert launch_statement_of(["# ran -g 4", "# nThread 1 nGpus 8"]).gpus_per_process == 8


# Per section: the first section's statement comes from the file header, a later one only from its own
# comments (not inherited). None: not stated.
STATED = {
    "a100_8gpu_allreduce_azure_nda100v4.txt": {0: None},
    "a100_8gpu_allreduce_sxm4_80gb_g8.txt": {0: 8},
    "gb200_4gpu_allreduce_ring_azure_ndgb200v6.txt": {0: None},
    "h100_16gpu_2node_alltoall_xxrjun.txt": {0: 1, 1: None},
    "h100_16gpu_2node_gcp_a3mega_allreduce.txt": {0: 1},
    "h100_8gpu_allgather_ring_together.txt": {0: 8},
    "h100_8gpu_allreduce_nvls_together.txt": {0: 8},
    "h100_8gpu_allreduce_ring_together.txt": {0: 8},
    "h100_8gpu_and_2node_degraded_ncclTests_issue290.txt": {0: 8, 1: None, 2: None},
    "h100_8gpu_reducescatter_ring_together.txt": {0: 8},
    "h200_8gpu_allreduce_nvls_azure_ndh200v5.txt": {0: 8},
    "mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt": {0: 1, 1: None, 2: 1, 3: None, 4: None, 5: None},
    "mi355x_8gpu_rccl_allreduce_alltoall_oci.txt": {0: 8, 1: None},
}


@pytest.mark.parametrize("name", sorted(STATED))
def test_every_shipped_log_states_what_the_table_says(shared_data, name):
    log = read_nccl_tests(shared_data / "nccl-tests" / name, op="allreduce")
    assert {s: st.gpus_per_process for s, st in log.launch.items()} == STATED[name]


# --- the floor -----------------------------------------------------------------------------------------

def test_eight_gpus_per_process_closed_form():
    """8 GPUs per thread: an 8-byte AllReduce takes exactly 8 x HOST_LAUNCH_S (the model's 15 us is below it)."""
    est = predict("allreduce", 8, H100, algo="ring")
    floored = with_launch_floor(est, 8)
    assert est.time_s < 8 * HOST_LAUNCH_S
    assert floored.time_s == pytest.approx(8 * HOST_LAUNCH_S, rel=1e-12)
    assert floored.busbw_Bps == pytest.approx(8 * 2 * 7 / 8 / (8 * HOST_LAUNCH_S))
    assert floored.algbw_Bps == pytest.approx(8 / (8 * HOST_LAUNCH_S))
    assert floored.runner_up_time_s == max(est.runner_up_time_s, 8 * HOST_LAUNCH_S)
    assert (floored.algo, floored.proto, floored.n_ctas) == (est.algo, est.proto, est.n_ctas)


@pytest.mark.parametrize("size", [8, 64 * 1024, 2**20, 2**30])
def test_no_floor_with_one_gpu_per_process(size):
    est = predict("allreduce", size, H100)
    assert launch_floor_s(1) == 0.0
    assert with_launch_floor(est, 1) is est


def test_floor_leaves_long_collectives_alone():
    est = predict("allreduce", 2**30, H100)
    assert est.time_s > launch_floor_s(8)
    assert with_launch_floor(est, 8) is est
    assert launch_floor_s(4) == pytest.approx(4 * HOST_LAUNCH_S)


@pytest.mark.parametrize("value, message", [
    (0, "gpus_per_process: must be an integer >= 1 (got 0)"),
    (-2, "gpus_per_process: must be an integer >= 1"),
    ("x", "gpus_per_process: must be an integer >= 1 (got x)"),
    (1.5, "gpus_per_process: must be an integer >= 1"),
    (True, "gpus_per_process: must be an integer >= 1"),
    (9, "gpus_per_process: must not exceed the communicator's 8 GPU(s) per node"),
])
def test_bad_gpus_per_process(value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_gpus_per_process(value, 8)


def test_gpus_per_process_text_is_accepted():
    assert check_gpus_per_process("8", 8) == 8 and check_gpus_per_process(1, 1) == 1


# --- comparisons -----------------------------------------------------------------------------------------

def test_compare_uses_the_stated_setup(shared_data):
    log = read_nccl_tests(shared_data / "nccl-tests" / "h100_8gpu_allreduce_ring_together.txt")
    cmp = compare_nccl_tests(log, H100, algo="ring")
    assert cmp.launch == ({"section": 0, "gpus_per_process": 8, "source": "stated in the log",
                           "evidence": "nThread 1 nGpus 8", "floor_s": 8 * HOST_LAUNCH_S},)
    small = cmp.rows[cmp.rows["size_bytes"] == 8].iloc[0]
    assert small["predicted_time_s"] == pytest.approx(8 * HOST_LAUNCH_S)
    assert small["predicted_busbw_Bps"] == pytest.approx(8 * 1.75 / (8 * HOST_LAUNCH_S))
    assert cmp.summary.median_abs_error_small < 0.25
    assert apply_launch_floor(cmp, cmp.launch).rows.equals(cmp.rows)  # idempotent


def test_override_and_unknown_setup(shared_data):
    log = read_nccl_tests(shared_data / "nccl-tests" / "gb200_4gpu_allreduce_ring_azure_ndgb200v6.txt")
    unknown = compare_nccl_tests(log, GB200, algo="ring")
    assert unknown.launch[0]["gpus_per_process"] is None and unknown.launch[0]["source"] == "not stated in the log"
    assert (unknown.rows["launch_floor_s"] == 0).all()
    given = compare_nccl_tests(log, GB200, algo="ring", gpus_per_process=4)
    assert given.launch[0]["source"] == "given" and given.launch[0]["floor_s"] == pytest.approx(4 * HOST_LAUNCH_S)
    assert given.summary.median_abs_error_small < unknown.summary.median_abs_error_small
    with pytest.raises(ConfigError, match="gpus_per_process: must not exceed the communicator's 4 GPU"):
        compare_nccl_tests(log, GB200, gpus_per_process=8)


def test_one_process_per_gpu_log_is_not_floored(shared_data):
    mi300x = CommLayout(8, 1, compute_capability=94, vendor="amd", scaleup_kind="xgmi_mesh", scaleup_Bps=448e9,
                        scaleup_links=7, cpu="amd")
    log = read_nccl_tests(shared_data / "nccl-tests" / "mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt")
    cmp = compare_nccl_tests(log, mi300x, sections=[0])
    assert cmp.launch[0]["gpus_per_process"] == 1 and cmp.launch[0]["floor_s"] == 0.0
    model = [predict("allreduce", s, mi300x).time_s for s in cmp.rows["size_bytes"]]
    assert list(cmp.rows["predicted_time_s"]) == pytest.approx(model)
