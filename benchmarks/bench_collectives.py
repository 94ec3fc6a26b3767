"""Speed of the flow engine for collectives (flowsim.network.collective_flows); figures go to docs/PERFORMANCE.md.

Cases (issue 4): a 30-size AllReduce sweep (8 B .. 4 GiB, doubling) on 1,024 GPUs (128 DGX H100 hosts,
rail-optimised, radix 64), target < 2 s; one 4 GiB AllReduce across 16,384 GPUs (2,048 hosts, three tiers
at radix 64), target < 5 s. NCCL's choice among the algorithms with a plan (all but CollNet): Tree at small
sizes, NVLSTree from 512 MiB on 1,024 GPUs and for the 4 GiB on 16,384.
Times exclude numba compilation (one warm-up run) and the first topology build (cached); the topology build is
timed on its own. Each figure is the minimum / median of ``--repeat`` runs.

Run: ``python benchmarks/bench_collectives.py [--repeat 3]``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

from flowsim.network.collective_flows import cached_topology, run_collective
from flowsim.config.cluster import ClusterConfig
from flowsim.gpu_specs import get_gpu


def _timed(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    gpu = get_gpu("h100-sxm")

    sweep = ClusterConfig(gpu="h100-sxm", num_gpus=1024, name="dgx-h100")
    big = ClusterConfig(gpu="h100-sxm", num_gpus=16384, name="dgx-h100")
    for cluster in (sweep, big):
        t = time.perf_counter()
        topo = cached_topology(cluster, gpu)
        print(f"topology {cluster.num_gpus} GPUs: {topo.n_links} links, build {time.perf_counter() - t:.2f} s")

    sizes = [8 * 2**k for k in range(30)]
    ranks = list(range(sweep.num_gpus))
    run_collective(sweep, gpu, "allreduce", 2**26, ranks)  # warm-up (numba)

    def run_sweep():
        return [run_collective(sweep, gpu, "allreduce", s, ranks) for s in sizes]

    lo, med, res = _timed(run_sweep, args.repeat)
    algos = Counter(f"{r.algo}/{r.proto}" for r in res)
    print(f"sweep 30 sizes x 1,024 GPUs: {lo:.2f} / {med:.2f} s (target < 2 s); {sum(r.n_transfers for r in res)} "
          f"transfers; choices {dict(algos)}; 4 GiB busbw {res[-1].busbw_Bps / 1e9:.1f} GB/s")

    size = 4 * 2**30
    ranks = list(range(big.num_gpus))
    lo, med, r = _timed(lambda: run_collective(big, gpu, "allreduce", size, ranks), args.repeat)
    print(f"4 GiB AllReduce x 16,384 GPUs: {lo:.2f} / {med:.2f} s (target < 5 s); {r.algo}/{r.proto}, "
          f"{r.n_transfers} transfers, busbw {r.busbw_Bps / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
