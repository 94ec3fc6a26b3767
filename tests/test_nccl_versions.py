"""The NCCL release switch: parsing, the older tuning.cc behaviour, selection vs pricing, the log reader, CLI."""
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.errors import ConfigError
from flowsim.nccl_models import CommLayout, predict
from flowsim.nccl_models.constants import Algo, Arch, Coll, Proto, arch_of, max_channels
from flowsim.nccl_models.execution import run_channels
from flowsim.nccl_models.graph import graphs_of
from flowsim.nccl_models.tuning import cost_model
from flowsim.nccl_models.versions import NcclVersion, parse_nccl_version, version_from_code
from flowsim.validation.nccl_tests import nccl_version_of, read_nccl_tests

GB = 1e9
US = 1e-6
# Datasheet figures as in test_nccl_model.py: A100 SXM 12 NVLink3 links, H100 SXM 18 NVLink4 links.
A100 = dict(compute_capability=80, scaleup_Bps=300e9, scaleup_links=12, pcie_Bps=32e9)
H100 = dict(compute_capability=90, scaleup_Bps=450e9, scaleup_links=18, nvls=True)


def a100(version, **kw):
    return CommLayout(8, 1, nccl_version=version, **{**A100, **kw})


def h100(version, n_nodes=1, ppn=8):
    return CommLayout(ppn * n_nodes, n_nodes, nccl_version=version, nics_per_node=8, nic_Bps=50e9, **H100)


# --- parsing ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, version", [
    ("2.19", NcclVersion(2, 19, 0)), ("2.19.3", NcclVersion(2, 19, 3)), ("v2.18.3-1", NcclVersion(2, 18, 3)),
    ("2.18.5+cuda12.2", NcclVersion(2, 18, 5)), ("2.30.7", NcclVersion(2, 30, 7)),
])
def test_parse_versions(text, version):
    assert parse_nccl_version(text) == version


@pytest.mark.parametrize("text", ["2.17.1", "2.31", "3.0", "latest", "", "2"])
def test_unsupported_versions_raise_one_line_config_error(text):
    with pytest.raises(ConfigError, match=r"^nccl_version: must be .*2\.18 to 2\.30") as e:
        parse_nccl_version(text)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="^nccl_version"):
        a100(text)


def test_layout_stores_the_version_normalised_and_defaults_to_2_30_7():
    assert a100("2.18.5+cuda12.2").nccl_version == "2.18.5"
    assert CommLayout(8, 1, **A100).nccl_version == "2.30.7"
    assert version_from_code(21903) == "2.19.3" and version_from_code(22602) == "2.26.2"


# --- the older tuning.cc --------------------------------------------------------------------------------

def test_ring_ll_factor_is_quarter_for_allreduce_third_for_allgather_before_2_21():
    # A100, one node: ring graph 12 channels x 20 GB/s = 240 GB/s busBw; LL cap (Ampere, N1) 87.7 GB/s.
    for version in ("2.18", "2.20.5"):
        ar = cost_model(Coll.ALLREDUCE, a100(version)).algbw_Bps[Algo.RING, Proto.LL]
        ag = cost_model(Coll.ALLGATHER, a100(version)).algbw_Bps[Algo.RING, Proto.LL]
        assert ar == pytest.approx(240 * GB / 4 * 8 / 14)   # busBw / 4, algBw = busBw * n / 2(n-1)
        assert ag == pytest.approx(240 * GB / 3 * 8 / 7)    # busBw / 3, algBw = busBw * n / (n-1)
    # from 2.21: 0.5, capped at llMaxBws 87.7
    assert cost_model(Coll.ALLREDUCE, a100("2.21")).algbw_Bps[Algo.RING, Proto.LL] == pytest.approx(
        87.7 * GB * 8 / 14)


def test_ring_ll128_factor_is_0_7_with_one_rank_per_node_before_2_23():
    old, new = (CommLayout(4, 4, nics_per_node=1, nic_Bps=50e9, nccl_version=v, **H100) for v in ("2.22", "2.23"))
    ratio = (cost_model(Coll.ALLREDUCE, old).algbw_Bps[Algo.RING, Proto.LL128]
             / cost_model(Coll.ALLREDUCE, new).algbw_Bps[Algo.RING, Proto.LL128])
    assert ratio == pytest.approx(0.7 / 0.92)
    # ppn >= 2: 0.92 in both
    assert cost_model(Coll.ALLREDUCE, a100("2.18")).algbw_Bps[Algo.RING, Proto.LL128] == pytest.approx(
        cost_model(Coll.ALLREDUCE, a100("2.30")).algbw_Bps[Algo.RING, Proto.LL128])


def test_pat_unavailable_before_2_23_with_a_reason():
    layouts = {v: CommLayout(4, 4, nics_per_node=1, nic_Bps=50e9, nccl_version=v, **H100) for v in ("2.22", "2.23")}
    assert cost_model(Coll.ALLGATHER, layouts["2.22"]).reason[Algo.PAT][Proto.SIMPLE] == \
        "PAT needs NCCL >= 2.23 (modelling 2.22.0)"
    assert cost_model(Coll.ALLGATHER, layouts["2.23"]).reason[Algo.PAT][Proto.SIMPLE] is None
    with pytest.raises(ConfigError, match="PAT: PAT needs NCCL >= 2.23"):
        predict("allgather", 2**20, layouts["2.22"], algo="pat")


def test_nvls_ratio_is_five_sixths_before_2_28():
    # H100 NVLS graph: 8 heads x 60 GB/s = 480 GB/s busBw
    assert cost_model(Coll.ALLREDUCE, h100("2.27.3")).algbw_Bps[Algo.NVLS, Proto.SIMPLE] == pytest.approx(
        480 * GB * 5 / 6)
    assert cost_model(Coll.ALLREDUCE, h100("2.28")).algbw_Bps[Algo.NVLS, Proto.SIMPLE] == pytest.approx(
        480 * GB * 8 / 14)


@pytest.mark.parametrize("version, tree_simple_us", [
    ("2.18", 2 * 7 * 4.0),            # baseLat 0, hwLat NVLINK Tree/Simple 4.0 (v2.18.3)
    ("2.19", 2 * 7 * 28.0),           # baseLat 0, hwLat 28 (2.19.3-2.22.3 builds)
    ("2.23", 8.4 + 2 * 7 * 4.0),      # baseLat 8.4, hwLat 4.0 (2.23.4 build on, v2.30.7)
])
def test_tree_simple_latency_tables(version, tree_simple_us):
    lat = cost_model(Coll.ALLREDUCE, a100(version)).latency_s[Algo.TREE, Proto.SIMPLE]
    assert lat == pytest.approx(tree_simple_us * US)


def test_nvls_latency_tables():
    lat = {v: cost_model(Coll.ALLREDUCE, h100(v)).latency_s[Algo.NVLS, Proto.SIMPLE] for v in ("2.18", "2.19", "2.21")}
    assert lat == pytest.approx({"2.18": 23 * US, "2.19": 23 * US, "2.21": 25 * US})


def test_ring_allreduce_crosses_the_network_2_nnodes_times_before_2_23():
    # 2 nodes of 8 H100, Ring/LL: lat = 6.6 + (14 - nInter) x max(0.6, netOverhead 1.0) + nInter x 2.7 us
    for version, n_inter in (("2.22", 4), ("2.23", 2)):
        lat = cost_model(Coll.ALLREDUCE, h100(version, n_nodes=2)).latency_s[Algo.RING, Proto.LL]
        assert lat == pytest.approx((6.6 + (30 - n_inter) * 1.0 + n_inter * 2.7) * US)


def test_graph_differences_of_older_releases():
    assert graphs_of(h100("2.19")).intra_Bps == pytest.approx(18 * 20.0 * GB)   # SM90 NVLink 20.0 before 2.20
    assert graphs_of(h100("2.20")).intra_Bps == pytest.approx(18 * 20.6 * GB)
    assert arch_of(100, parse_nccl_version("2.23")) == Arch.HOPPER              # no Blackwell rows before 2.25
    assert arch_of(100, parse_nccl_version("2.25")) == Arch.BLACKWELL
    assert (max_channels(parse_nccl_version("2.24")), max_channels(parse_nccl_version("2.25"))) == (32, 64)


# --- selection by the release, time by the newest model -----------------------------------------------

def test_older_release_changes_the_pick_not_the_price_of_a_pick():
    # A100 2 MiB AllReduce: Ring/LL ranks first with LL at 0.5 (2.30.7), Ring/LL128 with LL at 1/4 (2.18)
    old, new = predict("allreduce", 2**21, a100("2.18")), predict("allreduce", 2**21, a100("2.30.7"))
    assert (old.proto, new.proto) == ("LL128", "LL")
    assert old.time_s == pytest.approx(predict("allreduce", 2**21, a100("2.30.7"), proto="ll128").time_s)
    # NVLS is priced at the measured-like 2.28+ rate even when 2.20 ranks it at 5/6 of its busBw
    nvls = {v: predict("allreduce", 2**30, h100(v), algo="nvls").time_s for v in ("2.20.5", "2.30.7")}
    assert nvls["2.20.5"] == pytest.approx(nvls["2.30.7"])


@pytest.mark.parametrize("size, proto, channels", [
    (32 * 2**10, Proto.LL, 1),     # Ring/LL: threshold 8 B x 8 ranks x 512 threads = 32 KiB per channel
    (256 * 2**10, Proto.LL, 8),
    (2**30, Proto.LL, 24),         # all 24 execution channels
    (64 * 2**10, Proto.SIMPLE, 2),  # Ring/Simple: 64 B x 512 threads = 32 KiB per channel
])
def test_small_messages_run_on_fewer_channels(size, proto, channels):
    layout = a100("2.19")
    assert run_channels(cost_model(Coll.ALLREDUCE, layout), layout, Algo.RING, proto, size) == channels
    est = predict("allreduce", size, layout, algo="ring", proto=proto.name.lower())
    assert est.n_ctas == channels


# --- reader and CLI ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, version", [
    ("a100_8gpu_allreduce_azure_nda100v4.txt", "2.18.5"),          # "NCCL 2.18.5, CUDA 12.5"
    ("a100_8gpu_allreduce_sxm4_80gb_g8.txt", "2.19.3"),            # "NCCL 2.19.3 (nccl-headers=21903)"
    ("h100_8gpu_allreduce_ring_together.txt", "2.26.2"),           # "NCCL: 2.26.2 (nccl-library=22602)"
    ("h200_8gpu_allreduce_nvls_azure_ndh200v5.txt", "2.20.5"),     # "NCCL 2.20.5;"
    ("gb200_4gpu_allreduce_ring_azure_ndgb200v6.txt", "2.25.1"),
    ("h100_16gpu_2node_alltoall_xxrjun.txt", None),                # "NCCL version not printed ... 2.28.7 ..."
    ("mi355x_8gpu_rccl_allreduce_alltoall_oci.txt", None),         # RCCL 2.26.6: not NCCL's tuning
])
def test_reader_takes_the_version_from_the_header(shared_data, name, version):
    assert read_nccl_tests(shared_data / "nccl-tests" / name, op="allreduce", n_ranks=8).nccl_version == version


def test_version_statement_styles():
    assert nccl_version_of(["host: NCCL INFO NCCL version 2.18.5+cuda12.2"]) == "2.18.5+cuda12.2"
    # the library nccl-tests ran with wins over the headers it was built with and over free text
    assert nccl_version_of(["# NCCL 2.19.3", "# nccl-headers=21903 nccl-library=22005"]) == "2.20.5"
    assert nccl_version_of(["# nccl-headers=21903"]) == "2.19.3"
    assert nccl_version_of(["# nccl-tests 2.13.9", "# RCCL 2.26.6"]) is None


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_validate_nccl_uses_the_log_version_unless_overridden(shared_data):
    log = str(shared_data / "nccl-tests" / "a100_8gpu_allreduce_sxm4_80gb_g8.txt")
    r = run("validate-nccl", log, "--cluster", "dgx-a100")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("# NCCL 2.19.3 modelled (stated in the log; log states 2.19.3)")
    out = json.loads(run("validate-nccl", log, "--cluster", "dgx-a100", "--nccl-version", "2.30", "--json").output)
    assert (out["nccl_version"], out["nccl_version_source"], out["log_nccl_version"]) == \
        ("2.30.0", "--nccl-version", "2.19.3")
    assert out["layout"]["nccl_version"] == "2.30.0"


def test_collective_takes_a_version_and_rejects_bad_ones():
    r = run("collective", "--op", "allreduce", "--cluster", "dgx-a100", "--sizes", "2M", "--nccl-version", "2.18")
    assert r.exit_code == 0, r.output
    rows = [line.split() for line in r.output.splitlines() if line.strip() and not line.startswith("#")]
    assert "NCCL 2.18.0" in r.output.splitlines()[0] and rows[0][-1] == "Ring/LL128"
    r = run("collective", "--op", "allreduce", "--cluster", "dgx-a100", "--sizes", "2M", "--nccl-version", "2.17")
    assert r.exit_code == 2
    assert r.output.strip() == "Error: nccl_version: must be a release from 2.18 to 2.30 (got 2.17)"
    # the flow engine runs the release's pick as flows
    r = run("collective", "--op", "allreduce", "--cluster", "dgx-a100", "--sizes", "2M", "--engine", "flow",
            "--nccl-version", "2.18")
    assert r.exit_code == 0, r.output
    assert [line for line in r.output.splitlines() if not line.startswith("#")][0].split()[-1] == "Ring/LL128"


def test_layout_replace_keeps_the_version_checked():
    with pytest.raises(ConfigError, match="^nccl_version"):
        replace(a100("2.19"), nccl_version="1.0")
