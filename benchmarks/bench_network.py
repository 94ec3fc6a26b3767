"""Speed of the network core: max-min solve, routing, event simulation (figures go to docs/PERFORMANCE.md).

Run: ``python benchmarks/bench_network.py`` (single process; numba compiles on the first call of each kernel,
which is excluded: every figure is the median of several runs after one warm-up run).

Cluster: 4,096 GPUs, 512 DGX-H100-like hosts (8 GPUs, NVSwitch 450 GB/s per GPU, PCIe 64 GB/s, 8 x 400 Gb/s
NICs), rail-optimised two-tier fat-tree with switch radix 128 (64 leaves of 64 down-ports, 64 spines):
16,384 directed scale-out links, 32,768 links in all with NVLink and PCIe.
"""
from __future__ import annotations

import platform
import statistics
import time

import numpy as np

from flowsim.config.cluster import ClusterConfig
from flowsim.gpu_specs import GPUSpec
from flowsim.network.maxmin import solve
from flowsim.network.maxmin_kernels import _solve_full
from flowsim.network.netsim import simulate
from flowsim.network.routing import route
from flowsim.network.topology import LinkKind, build_topology
from flowsim.units import GB, MB

REPEATS = 5


def h100_like() -> GPUSpec:
    """H100-SXM figures used by the benchmark (NVIDIA H100 datasheet: NVLink4 900 GB/s bidirectional)."""
    return GPUSpec(key="h100-bench", name="H100-like", vendor="nvidia", arch="hopper", compute_capability=90,
                   peak_flop_per_s={"bf16": 989e12}, hbm_bytes=80 * GB, hbm_Bps=3.35e12, sm_count=132,
                   clock_hz=1.98e9, l2_bytes=50e6, scaleup_kind="nvswitch", scaleup_Bps=450 * GB,
                   scaleup_links=18, nvls=True, pcie_Bps=64 * GB, tdp_w=700, sources=("benchmark",))


def timed(fn, repeats=REPEATS):
    """Wall times of ``fn()`` over ``repeats`` runs after one warm-up (compile) run.

    Returns (min seconds, median seconds, result). The minimum is the figure least disturbed by other
    processes on a shared machine; the median is printed beside it.
    """
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times), out


def main() -> None:
    cfg = ClusterConfig(gpu="h100-bench", num_gpus=4096, switch_radix=128, name="bench-4096")
    t_build, _, topo = timed(lambda: build_topology(cfg, h100_like()), 3)
    fabric = int(np.isin(topo.link_kind, [LinkKind.NIC_LEAF, LinkKind.LEAF_NIC, LinkKind.LEAF_SPINE,
                                          LinkKind.SPINE_LEAF]).sum())
    print(f"machine: {platform.machine()}, python {platform.python_version()}; times are min / median ms")
    print(f"topology: {topo}, {fabric} scale-out links; build {t_build * 1e3:.1f} ms")
    rng = np.random.default_rng(0)
    cap = topo.capacity_Bps

    print("\n# full solve, random GPU pairs, hash ECMP")
    print(f"{'flows':>8} {'hops':>8} {'route':>11} {'solve':>11} {'kernel':>11} {'levels':>7}")
    for n in (1_000, 3_000, 10_000, 30_000, 100_000):
        src = rng.integers(0, 4096, n)
        dst = rng.integers(0, 4096, n)
        tr = timed(lambda: route(topo, src, dst))
        r = tr[2]
        ts = timed(lambda: solve(cap, r.ptr, r.links))
        ones = np.ones(n)
        tk = timed(lambda: _solve_full(cap, r.ptr, r.links, ones))
        print(f"{n:>8} {r.links.size:>8} {_ms(tr)} {_ms(ts)} {_ms(tk)} {np.unique(ts[2]).size:>7}")

    print("\n# ring step: 4096 GPUs x 8 channels, GPU g -> same GPU of the next host (same rail)")
    src = np.repeat(np.arange(4096), 8)
    dst = (src + 8) % 4096
    r = route(topo, src, dst, np.tile(np.arange(8), 4096))
    ts = timed(lambda: solve(cap, r.ptr, r.links))
    rates = ts[2]
    print(f"flows {src.size}, hops {r.links.size}: solve {_ms(ts)} ms; rate {rates.min() / GB:.2f}.."
          f"{rates.max() / GB:.2f} GB/s (50 GB/s NIC / 8 channels = 6.25)")

    print("\n# event simulation (wall s, min / median of 3)")
    g = np.arange(4096)
    cases = [
        ("98,304 x 32 MB, GPU g -> g + 512 (next leaf group, same rail), 24 channels, ECMP collisions",
         np.repeat(g, 24), np.repeat((g + 512) % 4096, 24), np.tile(np.arange(24), 4096), np.full(98_304, 32 * MB)),
        ("100,000 x 16 MB, random GPU pairs", rng.integers(0, 4096, 100_000), rng.integers(0, 4096, 100_000),
         None, np.full(100_000, 16 * MB)),
    ]
    for name, src, dst, fid, size in cases:
        r = route(topo, src, dst, fid)
        tsim = timed(lambda: simulate(cap, r.ptr, r.links, size), 3)
        res = tsim[2]
        print(f"{name}: {res.n_solves} batches, makespan {res.makespan_s * 1e3:.2f} ms; "
              f"wall {tsim[0]:.3f} / {tsim[1]:.3f} s")
    # Worst case for the level-restart re-solve: random pairs through the spines (one giant component) with
    # mixed sizes, so low-rate transfers finish first and most of the component is re-filled each time.
    for n in (5_000, 20_000):
        src, dst = rng.integers(0, 4096, n), rng.integers(0, 4096, n)
        r = route(topo, src, dst)
        size = rng.integers(1, 65, n) * MB
        tsim = timed(lambda: simulate(cap, r.ptr, r.links, size), 1)
        res = tsim[2]
        print(f"{n:,} random pairs, sizes 1..64 MB (worst case): {res.n_solves} batches, wall {tsim[0]:.3f} s")

    print("\n# event simulation with dependencies: 512 rings of 8 GPUs (one per rail group), 14 dependent steps"
          " x 8 channels")
    g = np.arange(4096)
    ring_next = (g // 64) * 64 + ((g % 64) + 8) % 64  # 8 hosts per ring, same rail
    steps, ch = 14, 8
    n = 4096 * ch * steps
    src = np.tile(np.repeat(g, ch), steps)
    dst = np.tile(np.repeat(ring_next, ch), steps)
    fid = np.tile(np.arange(ch), 4096 * steps)
    per_step = 4096 * ch
    idx = np.arange(n)
    has_dep = idx >= per_step
    dep_ptr = np.r_[0, np.cumsum(has_dep)]
    dep_idx = (idx - per_step)[has_dep]
    r = route(topo, src, dst, fid)
    size = np.full(n, 4 * MB)
    tsim = timed(lambda: simulate(cap, r.ptr, r.links, size, dep_ptr=dep_ptr, dep_idx=dep_idx, latency_s=5e-6), 3)
    res = tsim[2]
    print(f"{n} transfers, {res.n_solves} batches, makespan {res.makespan_s * 1e3:.3f} ms; "
          f"wall {tsim[0]:.3f} / {tsim[1]:.3f} s")


def _ms(t) -> str:
    """'min / median' in ms, 11 characters."""
    return f"{t[0] * 1e3:>5.1f}/{t[1] * 1e3:<5.1f}"


if __name__ == "__main__":
    main()
