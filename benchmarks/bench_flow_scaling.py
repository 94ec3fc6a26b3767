"""Flow-engine step cost against the explicit simulation, and how it grows with the GPU count and pipeline depth.

Run: ``python benchmarks/bench_flow_scaling.py [--repeat N] [--only TEXT] [--reference-max-gpus N]
[--baseline DIR] [--rounds R] [--no-reference]``; prints the markdown tables of docs/PERFORMANCE.md ("Flow engine
by symmetry") with the machine and its load.

Each case runs in its own process (so its peak memory is the process's max RSS), with glibc's malloc settings of
the ``flowsim`` command (:func:`flowsim.network.allocator.keep_freed_memory`): one ``flowsim.simulate`` to
build the topology and load the compiled kernels, then ``N`` re-runs of every collective (the step engine's
flow caches cleared, ``comm_engine: flow``), interleaved with ``N`` re-runs of the reference: the same code
with the explicit simulation (``netsim.simulate(symmetry=False)``) on one thread (``parallel.THREADS = 1``) and
the prepared-collective cache cleared before each run, i.e. the flow engine before issue 22. Figures are min /
median seconds over the repeats and the ratio of the medians, measured in one process back to back, so a
loaded machine inflates both sides alike. Each re-run also empties the symmetry quotients' cache
(``flowsim.network.symmetry``), so it pays its refinements as a new step of another structure would (the cache
serves sweeps and configs that share a structure). ``flowsim.config.bounds.MAX_GPUS_FLOW`` (16,384) is lifted for
the 65,536-GPU case. Cases above ``--reference-max-gpus`` GPUs (default 16,384), or all with ``--no-reference``,
run without the reference (its cost there is minutes). The step times of both paths are printed; they agree to
the event loop's tolerance (tests/test_flow_symmetry.py).

``--baseline DIR``: also run each case's re-runs with the ``flowsim`` package of ``DIR`` first on ``PYTHONPATH``
(a checkout of an earlier commit, e.g. ``git archive REV flowsim | tar -x -C DIR``: its flowsim/ engine, this
checkout's kernels and NCCL models), in ``--rounds`` processes per code (default 1) alternating with the current
code's, each with ``--repeat`` re-runs; the medians of all re-runs of each code are compared ("first" is the
smallest first call, RSS the largest).

The growth check of issue 22 ("no worse than linear in distinct link classes"): one more re-run counts what its
event loops simulate after the quotient, summed over the step's simulations: transfers, links (link classes, or
the used links where no quotient is made) and re-solves; the last column is the median re-run per 1,000 of those
links.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

GPT3 = dict(model="gpt3-175b", cluster="dgx-h100", tp=8, sp=True, distributed_optimizer=True)
HEADLINE = {
    "gpt3-175b, 1,024 H100, TP8 PP8 DP16": dict(GPT3, gpus=1024, pp=8, gbs=1536),
    "llama3.1-405b, 16,384 H100, TP8 PP16 DP128, seq 8192": dict(
        model="llama3.1-405b", cluster="dgx-h100", gpus=16384, tp=8, pp=16, gbs=2048, seq=8192, sp=True,
        distributed_optimizer=True, pipeline_layer_split="balanced", switch_radix=128),
    "deepseek-v3, 2,048 H800, PP16 EP64 DP128": dict(
        model="deepseek-v3", cluster="hgx-h800", gpus=2048, pp=16, ep=64, gbs=15360, distributed_optimizer=True,
        precision="fp8", pipeline_layer_split="balanced", switch_radix=128),
}
GPUS = {f"gpt3-175b, {64 * dp:,} H100, TP8 PP8 DP{dp}": dict(GPT3, gpus=64 * dp, pp=8, gbs=96 * dp)
        for dp in (1, 4, 16, 64, 256, 1024)}
PP = {f"gpt3-175b, 1,024 H100, TP8 PP{pp} DP{128 // pp}": dict(GPT3, gpus=1024, pp=pp, gbs=1536)
      for pp in (2, 4, 8, 16, 32)}
TABLES = (("Headline cases", HEADLINE), ("Cost vs GPUs (GPT-3 175B, TP8 PP8)", GPUS),
          ("Cost vs pipeline depth (GPT-3 175B, 1,024 H100, TP8)", PP))


THREADS = None  # parallel.THREADS of this process, set by _one


def _threads_module():
    """The module holding the flow engine's ``THREADS``: flowsim.network.parallel, or netsim in a --baseline
    checkout before it."""
    try:
        from flowsim.network import parallel
        return parallel
    except ImportError:
        from flowsim.network import netsim
        return netsim


def _rerun(cfg, reference: bool) -> tuple:
    """Seconds of one re-run of every collective of ``cfg``, and its step time."""
    import flowsim
    from flowsim.network import collective_flows, netsim, symmetry
    from flowsim.step import flows as step_flows

    step_flows._flow.cache_clear()
    step_flows._together_s.cache_clear()
    getattr(symmetry, "_QUOTIENTS", {}).clear()  # none before the cache (a --baseline checkout)
    if reference:
        collective_flows._PREPARED.clear()
        step_flows._stage_groups_array.cache_clear()
    collective_flows.simulate = functools.partial(netsim.simulate, symmetry=not reference)
    _threads_module().THREADS = 1 if reference else THREADS
    t0 = time.perf_counter()
    r = flowsim.simulate(cfg)
    return time.perf_counter() - t0, r.step_time_s


def _one(name: str, repeat: int, reference: bool) -> dict:
    """Measure one case in this process (see the module docstring)."""
    global THREADS
    import flowsim
    from flowsim.config import bounds

    THREADS = _threads_module()._env_threads()
    try:  # glibc's malloc settings, as the flowsim command sets them (a --baseline checkout before them: none)
        from flowsim.network.allocator import keep_freed_memory
        keep_freed_memory()
    except ImportError:
        pass
    kw = {**HEADLINE, **GPUS, **PP}[name]
    bounds.MAX_GPUS_FLOW = max(bounds.MAX_GPUS_FLOW, kw["gpus"])  # the 65,536-GPU case is past the CLI's bound
    cfg = flowsim.build_config(**kw, comm_engine="flow")
    t0 = time.perf_counter()
    flowsim.simulate(cfg)
    first = time.perf_counter() - t0
    fast, ref, steps = [], [], set()
    for i in range(repeat):
        order = (False, True) if i % 2 == 0 else (True, False)
        for is_ref in order if reference else (False,):
            s, step = _rerun(cfg, is_ref)
            (ref if is_ref else fast).append(s)
            steps.add((is_ref, step))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"name": name, "gpus": kw["gpus"], "first_s": first, "fast_s": fast, "ref_s": ref,
            "steps": sorted(steps), "max_rss_mb": rss_mb, "classes": _classes(cfg)}


def _classes(cfg) -> list:
    """Sums over one re-run's event loops (``netsim._run``, after the quotient) of the transfers, the links (link
    classes, or the used links where no quotient is made) and the re-solves they simulate; ``[]`` for code
    before ``netsim._used_links`` (a --baseline checkout, which hands the event loop every link)."""
    from flowsim.network import netsim

    if not hasattr(netsim, "_used_links"):
        return []
    run, sums = netsim._run, [0, 0, 0]

    def counted(capacity_Bps, route_ptr, *rest):
        out = run(capacity_Bps, route_ptr, *rest)
        sums[0] += route_ptr.size - 1
        sums[1] += capacity_Bps.size
        sums[2] += int(out[3])
        return out

    netsim._run = counted
    try:
        _rerun(cfg, False)
    finally:
        netsim._run = run
    return sums


def _fmt(xs: list) -> str:
    return f"{min(xs):.3f} / {statistics.median(xs):.3f}" if xs else "-"


def _case(cmd: list, env: dict | None = None) -> dict:
    """The JSON of one ``--case`` subprocess (``env``: variables added to this one's)."""
    run = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, **(env or {})})
    return json.loads(run.stdout.splitlines()[-1])


def main() -> None:
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)
        return
    repeat = int(args[args.index("--repeat") + 1]) if "--repeat" in args else 3
    if "--case" in args:
        name = args[args.index("--case") + 1]
        print(json.dumps(_one(name, repeat, "--reference" in args)))
        return
    only = args[args.index("--only") + 1] if "--only" in args else ""
    ref_max = int(args[args.index("--reference-max-gpus") + 1]) if "--reference-max-gpus" in args else 16384
    ref_max = 0 if "--no-reference" in args else ref_max
    baseline = os.path.abspath(args[args.index("--baseline") + 1]) if "--baseline" in args else None
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 1
    print(f"machine: {platform.machine()} {platform.processor() or 'cpu'}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; load average before: {os.getloadavg()}"
          + (f"; previous code: {baseline}" if baseline else ""))
    for title, cases in TABLES:
        print(f"\n{title}\n\n| case | first s | re-run s, min / median | previous code s, min / median | "
              f"previous / re-run (medians) | reference s, min / median | reference / re-run (medians) | step s | "
              f"max RSS MB (previous) | simulated transfers / link classes / re-solves | re-run ms per 1,000 link "
              f"classes |\n|---|---|---|---|---|---|---|---|---|---|---|")
        for name, kw in cases.items():
            if only not in name:
                continue
            cmd = [sys.executable, __file__, "--case", name, "--repeat", str(repeat)]
            runs, prevs = [], []
            for r in range(rounds):  # processes of the two codes alternate, the first one swapping each round
                for is_prev in ((False, True) if r % 2 == 0 else (True, False))[:2 if baseline else 1]:
                    if is_prev:
                        prevs.append(_case(cmd, {"PYTHONPATH": baseline}))
                    else:
                        runs.append(_case(cmd + (["--reference"] if kw["gpus"] <= ref_max else [])))
            out = {k: [x for o in runs for x in o[k]] for k in ("fast_s", "ref_s", "steps")}
            out |= {"first_s": min(o["first_s"] for o in runs), "max_rss_mb": max(o["max_rss_mb"] for o in runs),
                    "classes": runs[0]["classes"]}
            prev = {k: [x for o in prevs for x in o[k]] for k in ("fast_s", "steps")}
            prev["max_rss_mb"] = max((o["max_rss_mb"] for o in prevs), default=0)
            ratio = {k: (f"{statistics.median(out[k]) / statistics.median(out['fast_s']):.1f}x" if out[k] else "-")
                     for k in ("ref_s",)}
            ratio["prev"] = (f"{statistics.median(prev['fast_s']) / statistics.median(out['fast_s']):.1f}x"
                             if prev["fast_s"] else "-")
            step = " / ".join(f"{s:.6f}" for s in sorted({s for _, s in out["steps"] + prev["steps"]}))
            rss = f"{out['max_rss_mb']:.0f}" + (f" ({prev['max_rss_mb']:.0f})" if baseline else "")
            n_t, n_l, n_s = out["classes"] or (0, 0, 0)
            per = f"{statistics.median(out['fast_s']) * 1e6 / n_l:.2f}" if n_l else "-"
            print(f"| {name} | {out['first_s']:.2f} | {_fmt(out['fast_s'])} | {_fmt(prev['fast_s'])} | "
                  f"{ratio['prev']} | {_fmt(out['ref_s'])} | {ratio['ref_s']} | {step} | {rss} | "
                  f"{n_t:,} / {n_l:,} / {n_s:,} | {per} |", flush=True)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
