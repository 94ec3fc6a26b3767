"""``flowsim topo`` with a layout: which communicators, expert-parallel ones above all, cross the network."""
import json

from click.testing import CliRunner

from flowsim.cli import main


def _groups(*args):
    res = CliRunner().invoke(main, ["topo", "--gpus", "32", "--json", *args])
    assert res.exit_code == 0, res.output
    return {g["group"].split(" (")[0]: g for g in json.loads(res.stdout)["groups"]}


def test_topo_shows_where_expert_groups_land():
    new = _groups("--tp", "4", "--ep", "8")
    assert new["expert parallel"] == dict(group="expert parallel (tp-ep-dp-pp)", ranks=8, stride=1, domains=1,
                                          fabric="NVLink")
    old = _groups("--tp", "4", "--ep", "8", "--etp", "4", "--expert-rank-order", "tp-cp-ep-dp-pp")
    assert old["expert parallel"] == dict(group="expert parallel (tp-cp-ep-dp-pp)", ranks=8, stride=4, domains=4,
                                          fabric="network")
    assert new["tensor parallel"]["fabric"] == old["tensor parallel"]["fabric"] == "NVLink"
    res = CliRunner().invoke(main, ["topo", "--gpus", "32", "--tp", "4", "--ep", "8"])
    assert res.exit_code == 0 and "expert parallel (tp-ep-dp-pp)" in res.output and "NVLink domains" in res.output


def test_topo_layout_errors_are_one_line():
    for args, message in [(["--tp", "3"], "Error: --gpus: must be divisible by tp * pp * cp"),
                          (["--tp", "4", "--ep", "8", "--expert-rank-order", "tp-cp-ep-dp-pp"],
                           "Error: expert_tensor_parallel_size: must equal tensor_model_parallel_size")]:
        res = CliRunner().invoke(main, ["topo", "--gpus", "32", *args])
        assert res.exit_code == 2 and res.output.startswith(message) and res.output.count("\n") == 1, res.output


def test_estimate_states_where_expert_groups_land():
    base = ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "32", "--tp", "4", "--sp",
            "--ep", "8"]
    res = CliRunner().invoke(main, base)
    assert res.exit_code == 0, res.output
    assert ("experts etp=1 dispatcher=alltoall order=tp-ep-dp-pp: each EP group of 8 ranks (stride 1) lies inside "
            "one NVLink domain") in res.output
    res = CliRunner().invoke(main, base + ["--set", "expert_tensor_parallel_size=4", "--set",
                                           "expert_rank_order=tp-cp-ep-dp-pp"])
    assert res.exit_code == 0, res.output
    assert "(stride 4) lies across 4 NVLink domains (network)" in res.output
    dense = CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"])
    assert dense.exit_code == 0 and "experts " not in dense.output
