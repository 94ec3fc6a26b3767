"""The step core is the one place that prices collectives, shares SMs and runs the pipeline (issue 14).

Two kinds of check: the source holds one of each mechanism (grep over the package), and every front end (the
parametric model, a captured workload, a SimAI workload) runs through the core's pricer and pipeline (spies).
"""
from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest

import flowsim
import flowsim.step.core as core
from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import load_preset
from flowsim.step import CollectivePricer, PipelineProgram, StreamOp, run_pipeline, run_streams, step_end_s

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = [p for d in ("flowsim", "kernels", "gpu_specs", "nccl_models", "validation") for p in (ROOT / d).rglob("*.py")]


def _where(pattern: str) -> set:
    rx = re.compile(pattern)
    return {p.relative_to(ROOT).as_posix() for p in SOURCES if rx.search(p.read_text(encoding="utf-8"))}


def test_one_pipeline_call_one_pricer_one_sm_rule():
    # the schedule simulator is called from the core only (and defined in schedule.py)
    assert _where(r"\bsimulate_pipeline\(") - {"flowsim/step/schedule.py"} == {"flowsim/step/core.py"}
    # one class that prices collectives
    assert _where(r"(?m)^class \w*Pricer\b|^class _Comms\b") == {"flowsim/step/pricer.py"}
    # the SM-sharing arithmetic r = 1 - share lives in one module
    assert _where(r"1\.0 - share|1 - share") == {"flowsim/step/overlap.py"}
    # the host-side timeline: the tandem queue's terms in step/host.py, the CPU clock in the schedule simulator
    assert _where(r"\brepeated_block_end_s\(|\bblock_terms\(") == {"flowsim/step/host.py"}
    assert _where(r"\bcpu\[s\]") == {"flowsim/step/schedule.py"}


def test_step_core_functions_are_short_and_modules_small():
    for p in (ROOT / "flowsim" / "step").glob("*.py"):
        text = p.read_text(encoding="utf-8")
        assert text.count("\n") <= 600, f"{p.name} has {text.count(chr(10))} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and p.name != "schedule.py":
                n = node.end_lineno - node.lineno + 1
                assert n <= 60, f"{p.name}:{node.name} is {n} lines"


@pytest.fixture
def spies(monkeypatch):
    """Count the core's pipeline runs and the pricer's estimates."""
    seen = {"pipeline": 0, "priced": 0}
    pipeline, estimate = core.simulate_pipeline, CollectivePricer.estimate

    def spy_pipeline(*a, **k):
        seen["pipeline"] += 1
        return pipeline(*a, **k)

    def spy_estimate(self, *a, **k):
        seen["priced"] += 1
        return estimate(self, *a, **k)

    monkeypatch.setattr(core, "simulate_pipeline", spy_pipeline)
    monkeypatch.setattr(CollectivePricer, "estimate", spy_estimate)
    return seen


def test_parametric_and_captured_steps_run_through_the_core(spies):
    torch = pytest.importorskip("torch")  # noqa: F841
    from flowsim.capture import GPTShape, capture, gpt_example
    from flowsim.capture.program import simulate_workload

    shape = GPTShape(layers=2, hidden=256, heads=4, vocab=1024, seq=128, micro_batch=2)
    setup, step = gpt_example("ddp", 8, shape=shape)
    captured = simulate_workload(capture(step, setup=setup, world_size=8), "dgx-h100")
    assert spies["pipeline"] == 0 and spies["priced"] > 0  # one stage: no pipeline, but its collectives priced
    n = spies["priced"]
    model = dict(name="gpt-example", num_layers=2, hidden_size=256, num_attention_heads=4, ffn_hidden_size=1024,
                 vocab_size=1024, seq_length=128, activation="gelu", normalization="layernorm",
                 position_embedding="none", untie_embeddings_and_output_weights=True, add_bias_linear=True)
    param = flowsim.simulate({"model": model, "cluster": "dgx-h100"}, num_gpus=8, tp=1, pp=1, dp=8, mbs=2, gbs=16,
                             seq=128, kernel_fusion="eager")
    assert spies["pipeline"] >= 1 and spies["priced"] > n
    # the same job both ways: the same data-parallel reduction, so the same collective kind is priced
    assert {c.op for c in param.collectives} == {"allreduce"} and captured.comm_s.keys() == {"allreduce"}


def test_simai_workload_runs_through_the_core(spies, shared_data):
    from flowsim.validation.simai_flowsim import simulate_flowsim
    from flowsim.validation.simai_workload import read_workload

    w = read_workload(shared_data / "simai" / "workload_analytical.txt")
    f = load_preset("clusters", "dgx-h100")
    r = simulate_flowsim(w, ClusterConfig(**{**f, "num_gpus": 9216}))
    assert spies["pipeline"] == 1 and spies["priced"] > 0 and r.total_s > r.compute_s


def test_pipeline_program_closed_form():
    # 1F1B, p stages, m micro-batches, uniform passes f and b, free transfers: (m + p - 1) * (f + b)
    p, m, f, b = 4, 8, 1e-3, 2e-3
    run = run_pipeline(PipelineProgram("1f1b", m, np.full((p, 1), f), np.full((p, 1), b)), p2p_exposure=True)
    assert run.timeline.end_s.max() == pytest.approx((m + p - 1) * (f + b))
    assert run.pp_exposed_s == 0.0
    # GPipe with a transfer of x between stages: the forwards reach the last stage (p - 1) x later, the
    # backwards return to stage 0 (p - 1) x later still
    x = 0.1e-3
    assert run_pipeline(PipelineProgram("gpipe", m, np.full((p, 1), f), np.full((p, 1), b))).timeline.end_s.max() \
        == pytest.approx((m + p - 1) * (f + b))
    slow = run_pipeline(PipelineProgram("gpipe", m, np.full((p, 1), f), np.full((p, 1), b), p2p_s=x),
                        p2p_exposure=True)
    assert slow.pp_exposed_s == pytest.approx(2 * (p - 1) * x)
    # the last stage ends (p - 1) b before the first; a tail longer than that makes it the critical one
    end, crit = step_end_s(run.timeline, np.array([0.0, 0.0, 0.0, 10e-3]), 1e-3)
    assert crit == 3 and end == pytest.approx(run.timeline.end_s[3] + 11e-3)


def test_streams_known_answers():
    # compute 10 us, a blocking 4 us collective, compute 10 us: 24 us in a row
    ops = [StreamOp(10e-6), StreamOp(4e-6, comm=True, blocking=True), StreamOp(10e-6)]
    assert run_streams(ops).end_s_total == pytest.approx(24e-6)
    # asynchronous, waited at the end, holding a quarter of the SMs: the second compute runs at 3/4 speed for
    # the 4 us the collective lasts (3 us of work), then 7 us alone: 10 + 4 + 7 = 21 us
    ops[1] = StreamOp(4e-6, comm=True, blocking=False, share=0.25)
    run = run_streams(ops)
    assert run.end_s_total == pytest.approx(21e-6) and run.start_s[1] == pytest.approx(10e-6)
    # two streams: a blocking collective on stream 1 does not queue behind stream 0's 50 us reduction
    ops = [StreamOp(50e-6, comm=True, blocking=False, stream=0), StreamOp(1e-6),
           StreamOp(2e-6, comm=True, blocking=True, stream=1)]
    run = run_streams(ops, start_s=1.0)
    assert run.end_s[2] == pytest.approx(1.0 + 3e-6) and run.end_s_total == pytest.approx(1.0 + 50e-6)
