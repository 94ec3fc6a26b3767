"""`flowsim estimate` and `flowsim.simulate`: outputs, JSON keys, traces, error handling."""
import json

import pytest
from click.testing import CliRunner

import flowsim
from flowsim.cli import main

ARGS = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--pp", "2", "--gbs", "32",
        "--sp"]


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def test_table_output(runner):
    res = runner.invoke(main, ["estimate", *ARGS])
    assert res.exit_code == 0, res.output
    assert "step time" in res.output and "MFU" in res.output and "TP comm s" in res.output
    assert "NCCL algo/proto" in res.output


def test_json_keys_and_consistency(runner):
    res = runner.invoke(main, ["estimate", *ARGS, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert {"step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory_gb_per_gpu", "breakdown",
            "fits_memory", "stages", "collectives", "config"} <= set(d)
    r = flowsim.simulate(model="llama3-8b", cluster="dgx-h100", gpus=16, tp=2, pp=2, gbs=32, sp=True)
    assert d["step_time_s"] == pytest.approx(r.step_time_s)
    # tokens/s is the step's tokens over its time
    assert d["tokens_per_s"] == pytest.approx(32 * 8192 / r.step_time_s)
    # the slowest stage's breakdown adds up to the step time
    b = r.breakdown()
    assert sum(v for k, v in b.items() if k != "stage") == pytest.approx(r.step_time_s, rel=1e-9)


def test_bad_input_is_one_line_exit_2(runner):
    res = runner.invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                               "--tp", "3"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "Error: num_gpus: must be divisible by tp*pp*cp (got 8 and 3*1*1)"]
    res = runner.invoke(main, ["estimate", "--model", "nope", "--cluster", "dgx-h100"])
    assert res.exit_code == 2 and res.output.startswith("Error: model: unknown preset; known: ")
    res = runner.invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--set", "foo=1"])
    assert res.exit_code == 2 and "foo: unknown key" in res.output
    res = runner.invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--ep", "2",
                               "--gpus", "8"])
    assert res.exit_code == 2 and "needs a mixture-of-experts model" in res.output


def test_does_not_fit_is_a_result(runner):
    res = runner.invoke(main, ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8",
                               "--gbs", "8", "--json"])
    assert res.exit_code == 0
    d = json.loads(res.stdout)
    assert d["fits_memory"] is False and d["memory_gb_per_gpu"] > d["memory_capacity_gb"]


def test_chrome_trace_is_valid_trace_event_format(runner, tmp_path):
    out = tmp_path / "step.json"
    res = runner.invoke(main, ["estimate", *ARGS, "--trace", str(out)])
    assert res.exit_code == 0, res.output
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    assert trace["displayTimeUnit"] in ("ms", "ns")
    for e in events:  # Trace Event Format: every event has a phase, a name and a process
        assert {"ph", "name", "pid"} <= set(e)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0 and "tid" in e
        else:
            assert e["ph"] == "M" and e["name"] in ("process_name", "thread_name")
    names = {e["name"] for e in events}
    assert {"process_name", "qkv", "attention", "optimizer", "tp:allgather"} <= names
    # two stages, gbs 32 / dp 4 = 8 micro-batches: a forward and a backward pass each
    passes = [e for e in events if e.get("cat") in ("fwd", "bwd")]
    assert len(passes) == 2 * 2 * (32 // 4)


def test_chrome_trace_expands_the_layer_each_chunk_runs():
    from flowsim.export.trace import chrome_trace

    # Qwen3-235B: every layer is MoE, so the first micro-batch's passes show expert GEMMs and the
    # all-to-alls; with selective recompute its backward starts with the re-run attention kernel
    r = flowsim.simulate(dict(model="qwen3-235b-a22b", cluster="dgx-h100", gpus=64, pp=4, ep=16, gbs=64,
                              recompute="selective", pipeline_layer_split="balanced"))
    events = [e for e in chrome_trace(r)["traceEvents"] if e["ph"] == "X" and e["pid"] == 0]
    names = [e["name"] for e in events]
    assert "expert_fc1" in names and "ep:alltoall" in names and "fc1" not in names
    first_bwd = names.index("bwd mb0 c0")
    assert names[first_bwd + 1] == "attention (recompute)"


@pytest.mark.parametrize("kw", [
    dict(model="gpt3-175b", cluster="dgx-h100", gpus=1024, tp=8, pp=8, gbs=1536, sp=True, recompute="full"),
    dict(model="llama3-8b", cluster="dgx-h100", gpus=32, tp=2, pp=4, vpp=2, gbs=64, sp=True),
    dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=64, pp=4, ep=8, gbs=128, schedule="dualpipe"),
])
def test_kernel_seconds_add_up_to_each_stage_compute(kw):
    from flowsim.export.breakdown import compute_by_kind, kernel_seconds

    r = flowsim.simulate(kw)
    for st in r.stages:
        k = kernel_seconds(r, st.stage)
        assert k["total_s"].sum() == pytest.approx(st.compute_s, rel=1e-9)
        assert sum(compute_by_kind(r, st.stage).values()) == pytest.approx(st.compute_s, rel=1e-9)
        assert k["total_s"].is_monotonic_decreasing and k["share"].sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"^stage: must be in"):
        kernel_seconds(r, len(r.stages))


def test_estimate_breakdown_flag():
    args = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--pp", "2",
            "--gbs", "32", "--sp", "--breakdown"]
    out = CliRunner().invoke(main, args).output
    assert "where the time goes (stage" in out and "compute: GEMM" in out and "top 12 kernels" in out
    res = json.loads(CliRunner().invoke(main, args + ["--json"]).output)
    w = res["where"]
    assert sum(w["compute_by_kind_s"].values()) == pytest.approx(w["components_s"]["compute"])
    assert len(w["top_kernels"]) == 12 and w["stage"] == res["breakdown"]["stage"]
