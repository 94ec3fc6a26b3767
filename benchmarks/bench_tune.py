"""Design-space exploration speed: GPT-3 175B on 1,024 H100, the default `flowsim tune` space.

Measures, on this machine:
1. enumeration and rule pruning of the whole space;
2. the memory check and simulation of every valid config through the local process pool (configs per
   second, and how many configs were simulated within the first 60 s);
3. with ``--dask``, the same configs through a local dask.distributed cluster (2 worker processes);
4. with ``--profile``, where one process spends the time of ``flowsim.simulate`` (cProfile, top entries).

Each run uses a fresh, temporary results store, so nothing is reused. Usage::

    python benchmarks/bench_tune.py [--limit N] [--jobs J] [--dask] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import tempfile
import time

import flowsim
from flowsim.explore.point import evaluate
from flowsim.explore.runner import run_configs
from flowsim.explore.space import LayoutSpace, enumerate_layouts
from flowsim.explore.store import ResultStore

JOB = {"model": "gpt3-175b", "cluster": "dgx-h100", "gpus": 1024, "gbs": 1536, "seq": 2048}
BUDGET_S = 60.0


def _run(configs, jobs, scheduler=None) -> dict:
    with tempfile.TemporaryDirectory() as d, ResultStore(os.path.join(d, "r.sqlite")) as store:
        t0 = time.perf_counter()
        rep = run_configs(configs, store=store, jobs=jobs, scheduler=scheduler, progress=True, label="bench")
        wall = time.perf_counter() - t0
        created = sorted(store.created().values())
    first = created[0] if created else 0.0
    # rows are committed as batches finish: rows stamped within BUDGET_S of the run's first commit,
    # plus the run's start-up before that commit, approximate "simulated within 60 s" from below
    startup = wall - (created[-1] - first) if created else wall
    within = sum(1 for t in created if t - first + startup <= BUDGET_S)
    return {"configs": len(configs), "simulated": rep.evaluated, "memory_pruned": rep.memory_pruned, "wall_s": wall,
            "configs_per_s": len(configs) / wall, "simulated_per_s": rep.evaluated / wall,
            "simulated_within_60s": within}


def _rounded(d: dict) -> dict:
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in d.items()}


def _profile(configs, n: int = 300) -> str:
    """Time and profile simulate on ``n`` configs that fit, spread evenly over the space."""
    spread = configs[:: max(1, len(configs) // (4 * n))]
    fit = [o for o in evaluate(list(enumerate(spread)), prune_memory=True) if o.status == "evaluated"]
    sample = [spread[o.index] for o in fit][:: max(1, len(fit) // n)][:n]
    t0 = time.perf_counter()
    for c in sample:
        flowsim.simulate(c)
    plain = (time.perf_counter() - t0) / len(sample)
    pr = cProfile.Profile()
    pr.enable()
    for c in sample:
        flowsim.simulate(c)
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(25)
    return f"{len(sample)} simulate calls on configs that fit: {plain * 1e3:.1f} ms each\n{out.getvalue()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=0, help="evaluate only the first N valid configs (0 = all)")
    ap.add_argument("--jobs", type=int, default=0, help="local worker processes (0 = one per CPU)")
    ap.add_argument("--dask", action="store_true", help="also run through a local Dask cluster")
    ap.add_argument("--profile", action="store_true", help="profile simulate in this process, then stop")
    args = ap.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, flowsim {flowsim.__version__}")
    t0 = time.perf_counter()
    space = LayoutSpace.default(flowsim.build_config(JOB, tp=8))
    enum = enumerate_layouts(JOB, space)
    t_enum = time.perf_counter() - t0
    print(f"enumeration: {enum.candidates} candidates, {len(enum.configs)} valid, pruned by rule {enum.pruned}, "
          f"{t_enum:.2f} s")
    configs = list(enum.configs[:args.limit] if args.limit else enum.configs)
    if args.profile:
        print(_profile(configs))
        return
    local = _run(configs, args.jobs)
    print("local pool:", _rounded(local))
    if args.dask:
        from dask.distributed import LocalCluster
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
            res = _run(configs, 0, scheduler=cl.scheduler_address)
        print("local dask cluster (2 workers):", _rounded(res))


if __name__ == "__main__":
    main()
