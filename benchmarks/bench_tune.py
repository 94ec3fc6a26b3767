"""Design-space exploration speed: GPT-3 175B on 1,024 H100, the default `flowsim tune` space.

Measures, on this machine:
1. enumeration and rule pruning of the whole space;
2. the memory check and simulation of every valid config through the local process pool (configs per
   second, and how many configs were simulated within the first 60 s);
3. with ``--dask``, the same configs through a local dask.distributed cluster (2 worker processes);
4. with ``--profile``, where one process spends the time of a worker's whole evaluate path (store key, memory
   check, ``flowsim.simulate``, summary; cProfile, top entries);
5. with ``--split``, where one process spends the time of a worker's evaluate path, by part, with wall-clock timers
   (cProfile charges every Python call and inflates the call-heavy parts 2-3x): store key, workload, stage memory,
   ``flowsim.simulate`` and the summary, microseconds per config of the configs given (``--sample N``: N drawn at
   random, about half of them simulated), op tables primed as the runner does, the second of two passes;
6. with ``--batch N``, ``flowsim.simulate_many`` of ``N`` candidates drawn at random from the space (every one
   simulated, no memory pruning, no store) on the local pool: the issue's "10,000 tune candidates in <= 10 s";
7. with ``--ref REV [--rounds R]``, the same run (with ``--sample`` / ``--batch`` as given) in fresh processes on
   the working tree and on the code of git revision ``REV`` (bench_estimate's ``git archive`` tree), interleaved
   round by round: min / median of wall and CPU seconds of each and the ratio of the medians (read the ratio:
   the machine is shared). Each side first runs 50 configs once (the reference tree's numba kernels compile
   into the per-user cache the first time, about a minute).

Each run uses a fresh, temporary results store, so nothing is reused. Usage::

    python benchmarks/bench_tune.py [--limit N | --sample N] [--jobs J] [--dask] [--profile] [--split] [--batch N]
                                    [--ref REV [--rounds R]] [--json]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import random
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import flowsim
from flowsim.explore.point import evaluate
from flowsim.explore.runner import run_configs
from flowsim.explore.space import LayoutSpace, enumerate_layouts
from flowsim.explore.store import ResultStore

JOB = {"model": "gpt3-175b", "cluster": "dgx-h100", "gpus": 1024, "gbs": 1536, "seq": 2048}
BUDGET_S = 60.0
ROOT = Path(__file__).resolve().parents[1]


def _run(configs, jobs, scheduler=None) -> dict:
    with tempfile.TemporaryDirectory() as d, ResultStore(os.path.join(d, "r.sqlite")) as store:
        t0 = time.perf_counter()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        rep = run_configs(configs, store=store, jobs=jobs, scheduler=scheduler, progress=True, label="bench")
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        created = sorted(store.created().values())
    first = created[0] if created else 0.0
    # rows are committed as batches finish: rows stamped within BUDGET_S of the run's first commit,
    # plus the run's start-up before that commit, approximate "simulated within 60 s" from below
    startup = wall - (created[-1] - first) if created else wall
    within = sum(1 for t in created if t - first + startup <= BUDGET_S)
    return {"configs": len(configs), "simulated": rep.evaluated, "memory_pruned": rep.memory_pruned, "wall_s": wall,
            "configs_per_s": len(configs) / wall, "simulated_per_s": rep.evaluated / wall,
            "simulated_within_60s": within,
            # CPU seconds of this (parent) process and of the local pool's workers (dask workers are not counted)
            "parent_cpu_s": _cpu(cpu1[0]) - _cpu(cpu0[0]), "workers_cpu_s": _cpu(cpu1[1]) - _cpu(cpu0[1])}


def _cpu(usage) -> float:
    return usage.ru_utime + usage.ru_stime


def _rounded(d: dict) -> dict:
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in d.items()}


def _profile(configs, n: int = 2000) -> str:
    """Profile one process's whole evaluate path (store key, memory check, simulate, summary) on ``n`` configs
    drawn at random from the space, with cold caches, as a pool worker runs it: cProfile's top entries by
    cumulative time, after an unprofiled timing of the same path."""
    from flowsim.model import memo

    sample = random.Random(0).sample(configs, min(n, len(configs)))  # a stride would alias the space's cycles
    evaluate(list(enumerate(sample[:2])), prune_memory=True)  # imports and JIT outside the figures
    memo.clear_all()
    t0 = time.perf_counter()
    out = evaluate(list(enumerate(sample)), prune_memory=True)
    plain = (time.perf_counter() - t0) / len(sample)
    fit = sum(o.status == "evaluated" for o in out)
    memo.clear_all()
    pr = cProfile.Profile()
    pr.enable()
    evaluate(list(enumerate(sample)), prune_memory=True)
    pr.disable()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("cumtime").print_stats(30)
    return (f"evaluate on {len(sample)} configs ({fit} fit and are simulated): {plain * 1e3:.2f} ms per config\n"
            f"{text.getvalue()}")


def _split(configs) -> str:
    """Microseconds per config of ``configs`` in each part of a worker's evaluate path (wall-clock timers around
    each part, the second of two passes over the configs, op tables primed)."""
    from flowsim.explore.point import PointResult, config_key
    from flowsim.gpu_specs import get_gpu
    from flowsim.model.workload import build_workload
    from flowsim.step.simulate import price_op_tables, simulate, stage_memories

    price_op_tables(configs)
    clock = time.perf_counter
    for _ in range(2):  # the first pass builds the pipeline plans and the layout caches
        took = dict.fromkeys(("store key", "workload", "stage memory", "simulate", "summary"), 0.0)
        fit = 0
        for cfg in configs:
            t0 = clock()
            key = config_key(cfg)
            t1 = clock()
            wl = build_workload(cfg)
            t2 = clock()
            peak = max(m.total_bytes for m in stage_memories(cfg, wl))
            t3 = clock()
            took["store key"] += t1 - t0
            took["workload"] += t2 - t1
            took["stage memory"] += t3 - t2
            if peak <= get_gpu(cfg.cluster.gpu).hbm_bytes:
                result = simulate(cfg)
                t4 = clock()
                PointResult.of(cfg, result, key)
                took["simulate"] += t4 - t3
                took["summary"] += clock() - t4
                fit += 1
    n = len(configs)
    parts = ", ".join(f"{name} {s / n * 1e6:.0f}" for name, s in took.items())
    return f"{n} configs ({fit} simulated), us per config: {parts}; total {sum(took.values()) / n * 1e6:.0f}"


def _batch(configs, n: int, jobs: int) -> dict:
    """``simulate_many`` of ``n`` configs drawn at random (seed 0) from ``configs``: wall and CPU seconds."""
    from flowsim.explore.runner import simulate_many

    sample = random.Random(0).sample(configs, min(n, len(configs)))
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    frame = simulate_many(sample, jobs=jobs)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"configs": len(sample), "errors": int((frame["error"] != "").sum()), "wall_s": wall,
            "configs_per_s": len(sample) / wall, "parent_cpu_s": _cpu(cpu1[0]) - _cpu(cpu0[0]),
            "workers_cpu_s": _cpu(cpu1[1]) - _cpu(cpu0[1])}


def _against(rev: str, argv: list, rounds: int) -> str:
    """This run (``argv``, less ``--ref``) in fresh processes here and at ``rev``, interleaved round by round."""
    from bench_estimate import _ref_tree

    trees = {"here": ROOT, rev: _ref_tree(rev)}

    def run(tree, args) -> dict:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, __file__, *args, "--json"], env=env, cwd=tempfile.gettempdir(),
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    for tree in trees.values():  # imports, numba cache (compiled the first time at rev)
        run(tree, ["--sample", "50"])
    got: dict = {name: [] for name in trees}
    for r in range(rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            got[name].append(run(trees[name], argv))
    lines = []
    for key in ("wall_s", "workers_cpu_s", "parent_cpu_s"):
        med = {name: statistics.median(x[key] for x in runs) for name, runs in got.items()}
        each = ", ".join(f"{name} {min(x[key] for x in runs):.1f} / {med[name]:.1f}" for name, runs in got.items())
        lines.append(f"{key} min / median: {each}; {rev} / here {med[rev] / med['here']:.2f}x")
    return f"{rounds} rounds, {got['here'][0]['configs']} configs each\n" + "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=0, help="evaluate only the first N valid configs (0 = all)")
    ap.add_argument("--jobs", type=int, default=0, help="local worker processes (0 = one per CPU)")
    ap.add_argument("--dask", action="store_true", help="also run through a local Dask cluster")
    ap.add_argument("--profile", action="store_true", help="profile the evaluate path in this process, then stop")
    ap.add_argument("--split", action="store_true", help="time the evaluate path by part in this process, then stop")
    ap.add_argument("--batch", type=int, default=0, help="simulate_many of N random candidates, then stop")
    ap.add_argument("--sample", type=int, default=0, help="evaluate N valid configs drawn at random (seed 0)")
    ap.add_argument("--ref", help="also run at this git revision, interleaved (see the module docstring)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --ref")
    ap.add_argument("--json", action="store_true", help="print the run's figures as one JSON line, last")
    args = ap.parse_args()
    if args.ref:
        argv = sys.argv[1:]
        i = argv.index("--ref")
        print(_against(args.ref, argv[:i] + argv[i + 2:], args.rounds))
        return

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, flowsim {flowsim.__version__}")
    t0 = time.perf_counter()
    space = LayoutSpace.default(flowsim.build_config(JOB, tp=8))
    enum = enumerate_layouts(JOB, space)
    t_enum = time.perf_counter() - t0
    print(f"enumeration: {enum.candidates} candidates, {len(enum.configs)} valid, pruned by rule {enum.pruned}, "
          f"{t_enum:.2f} s")
    configs = list(enum.configs[:args.limit] if args.limit else enum.configs)
    if args.sample:  # in enumeration order, as a tune walks them
        configs = [configs[i] for i in sorted(random.Random(0).sample(range(len(configs)), args.sample))]
    if args.profile:
        print(_profile(configs))
        return
    if args.split:
        print(_split(configs))
        return
    if args.batch:
        res = _batch(configs, args.batch, args.jobs)
        print("simulate_many:", _rounded(res))
        if args.json:
            print(json.dumps(res))
        return
    local = _run(configs, args.jobs)
    print("local pool:", _rounded(local))
    if args.json:
        print(json.dumps(dict(local, enumeration_s=t_enum)))
    if args.dask:
        from dask.distributed import LocalCluster
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
            res = _run(configs, 0, scheduler=cl.scheduler_address)
        print("local dask cluster (2 workers):", _rounded(res))


if __name__ == "__main__":
    main()
