"""Speed of one step estimate: gpt3-175b on 1,024 H100 (TP8 PP8 DP16, GBS 1536).

Run: ``python benchmarks/bench_estimate.py``. Prints the in-process time per config after compilation
(median of repeated ``flowsim.simulate`` calls), the same against the reference path (the op table priced with
its checks, ``op_times(trusted=False)``: the code before issue 22), interleaved call by call with min / median and
the ratio, and the wall time of the whole ``flowsim estimate`` command with the numba cache warm. Figures, the
machine and its load go into docs/PERFORMANCE.md.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time

import flowsim
import flowsim.step.simulate as step_simulate
from flowsim.kernels import op_times
from flowsim.step.simulate import simulate

ARGS = dict(model="gpt3-175b", cluster="dgx-h100", gpus=1024, tp=8, pp=8, dp=16, gbs=1536, sp=True)
CLI = ["flowsim", "estimate", "--model", "gpt3-175b", "--cluster", "dgx-h100", "--gpus", "1024", "--tp", "8",
       "--pp", "8", "--dp", "16", "--gbs", "1536", "--sp"]


def _reference_op_times(ops, gpu, **kw):
    return op_times(ops, gpu, **{**kw, "trusted": False})


def _against_reference(cfg, repeats: int) -> str:
    """``simulate`` and its reference path, alternating call by call: min / median ms of each, median ratio."""
    fast, ref = [], []
    for _ in range(repeats):
        for is_ref in (False, True):
            step_simulate.op_times = _reference_op_times if is_ref else op_times
            t0 = time.perf_counter()
            simulate(cfg)
            (ref if is_ref else fast).append(time.perf_counter() - t0)
    step_simulate.op_times = op_times
    f, r = (f"{1e3 * min(x):.2f} / {1e3 * statistics.median(x):.2f} ms" for x in (fast, ref))
    return f"simulate(cfg) {f}, reference {r}: {statistics.median(ref) / statistics.median(fast):.2f}x"


def main(repeats: int = 50) -> None:
    cfg = flowsim.build_config(**ARGS)
    simulate(cfg)  # compile / warm caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        simulate(cfg)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(repeats):
        simulate(flowsim.build_config(**ARGS))
    with_build = (time.perf_counter() - t0) / repeats
    subprocess.run(CLI, check=True, capture_output=True)  # warm the numba on-disk cache
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run(CLI, check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}, load average {os.getloadavg()}")
    print(f"simulate(cfg) median over {repeats}: {1e3 * statistics.median(times):.2f} ms")
    print(f"against the reference, {repeats} interleaved pairs: {_against_reference(cfg, repeats)}")
    print(f"build_config + simulate mean: {1e3 * with_build:.2f} ms")
    print(f"flowsim estimate command (warm cache) median of 5: {statistics.median(walls):.2f} s")


if __name__ == "__main__":
    main()
