"""Cost of the host model in one step estimate: gpt3-175b on 1,024 H100 (TP8 PP8 DP16, GBS 1536), the README example.

Run: ``python benchmarks/bench_host.py``. Prints the median ``flowsim.simulate`` time without a host model and with
``host_overhead: te`` (Transformer Engine host costs), and, measured inside the same calls, the share of the host
model's own work: each pass's host terms (``flowsim.step.simulate._pass_host``: every op's host cost, the pass
chains) and the optimizer step's host part (``optimizer_s`` with the host model less without). The CPU clock inside
the pipeline schedule is part of the numba list schedule and not separable. Both on the repeated config (the host
terms and the optimizer step cached by what they read, ``_PASS_HOST`` and ``_OPTIMIZER``) and with those two caches
emptied before every call (what a config whose host terms are new pays: a runs file's row). Figures go into
docs/PERFORMANCE.md.
"""
from __future__ import annotations

import os
import statistics
import time

import flowsim
import flowsim.step.simulate as step_simulate

ARGS = dict(model="gpt3-175b", cluster="dgx-h100", gpus=1024, tp=8, pp=8, dp=16, gbs=1536, sp=True)


def _timed(fn, spent: dict, key: str):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        spent[key] += time.perf_counter() - t0
        return out
    return wrapper


def _run(cfg, repeats: int, fresh: bool = False) -> tuple:
    """Median ms of ``simulate(cfg)`` and the ms spent in the host terms and the optimizer, per call (``fresh``: the
    host-term and optimizer caches emptied before each call)."""
    spent = {"pass_host": 0.0, "optimizer": 0.0}
    orig = step_simulate._pass_host, step_simulate.optimizer_s
    step_simulate._pass_host = _timed(orig[0], spent, "pass_host")
    step_simulate.optimizer_s = _timed(orig[1], spent, "optimizer")
    try:
        flowsim.simulate(cfg)  # compile / warm caches
        spent.update(pass_host=0.0, optimizer=0.0)
        times = []
        for _ in range(repeats):
            if fresh:
                step_simulate._PASS_HOST.clear()
                step_simulate._OPTIMIZER.clear()
            t0 = time.perf_counter()
            flowsim.simulate(cfg)
            times.append(time.perf_counter() - t0)
    finally:
        step_simulate._pass_host, step_simulate.optimizer_s = orig
    return 1e3 * statistics.median(times), {k: 1e3 * v / repeats for k, v in spent.items()}, sum(times) / repeats


def main(repeats: int = 100) -> None:
    plain = flowsim.build_config(**ARGS)
    host = flowsim.build_config(**ARGS, host_overhead="te")
    print(f"load average {os.getloadavg()[0]:.1f}")
    for fresh in (False, True):
        t_plain, s_plain, _ = _run(plain, repeats, fresh)
        t_host, s_host, mean_s = _run(host, repeats, fresh)
        own = s_host["pass_host"] + s_host["optimizer"] - s_plain["optimizer"]
        print("host terms and optimizer step built anew each call:" if fresh else "repeated config (cached):")
        print(f"  simulate, no host model      {t_plain:7.2f} ms")
        print(f"  simulate, host_overhead te   {t_host:7.2f} ms  ({100 * (t_host - t_plain) / t_plain:+.1f} %)")
        print(f"  host terms {s_host['pass_host']:.3f} ms + optimizer host part "
              f"{s_host['optimizer'] - s_plain['optimizer']:.3f} ms = {100 * own / (1e3 * mean_s):.1f} % of simulate")


if __name__ == "__main__":
    main()
