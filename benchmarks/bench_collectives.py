"""Speed of the flow engine for collectives (flowsim.network.collective_flows); figures go to docs/PERFORMANCE.md.

Cases (issue 4): a 30-size AllReduce sweep (8 B .. 4 GiB, doubling) on 1,024 GPUs (128 DGX H100 hosts,
rail-optimised, radix 64), target < 2 s; one 4 GiB AllReduce across 16,384 GPUs (2,048 hosts, three tiers
at radix 64), target < 5 s. NCCL's choice among the algorithms with a plan (all but CollNet): Tree at small
sizes, NVLSTree from 512 MiB on 1,024 GPUs and for the 4 GiB on 16,384. Issue 18: the same 30-size sweep on 20
GB200 NVL72 racks (1,440 GPUs, 360 trays of 4, one NVLink domain per rack, 72 x 400 Gb/s NICs per rack) with
NVLS off (NCCL_NVLS_ENABLE=0, as CoreWeave ran it), target < 2 s, by the analytic model
(:func:`flowsim.nccl_models.predict` on the communicator's layout) and, with ``--flow-racks``, once by the flow
engine (seconds: 184,192 transfers per tree, see docs/PERFORMANCE.md; the first size also plans and routes);
and the analytic sweep on 2,496 GPUs (34 racks and a partial one of 48, NVLS on: uneven nodes).
Times exclude numba compilation (one warm-up run) and the first topology build (cached); the topology build is
timed on its own. Each figure is the minimum / median of ``--repeat`` runs.

Run: ``python benchmarks/bench_collectives.py [--repeat 3] [--flow-racks] [--flow-racks-sizes I,J,..] [--only-racks]``
(``--only-racks``: the 20-rack flow sweep alone, e.g. with ``PYTHONPATH`` on an earlier commit's flowsim/).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import load_preset
from flowsim.gpu_specs import get_gpu
from flowsim.nccl_models import predict
from flowsim.network.collective_flows import cached_topology, run_collective
from flowsim.network.comm_layout import group_layout


def _timed(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times), out


def _flow_racks(args) -> None:
    """The 30-size AllReduce sweep (or ``--flow-racks-sizes``) on 20 NVL72 racks by the flow engine, once, after a
    warm-up collective (numba) and the topology build; seconds per size and in all."""
    nvl = ClusterConfig(**{**load_preset("clusters", "gb200-nvl72"), "num_gpus": 1440})
    gb200 = get_gpu("gb200")
    sizes = [8 * 2**k for k in range(30)]
    if args.flow_racks_sizes:
        sizes = [sizes[int(i)] for i in args.flow_racks_sizes.split(",")]
    ranks = list(range(nvl.num_gpus))
    t = time.perf_counter()
    topo = cached_topology(nvl, gb200)
    print(f"topology 20 NVL72 racks: {topo.n_links} links, build {time.perf_counter() - t:.2f} s")
    run_collective(nvl, gb200, "allreduce", 2**40, ranks[:72], algo="^nvls,nvlstree")  # warm-up (numba)
    t0 = time.perf_counter()
    res, per = [], []
    for s in sizes:
        t = time.perf_counter()
        res.append(run_collective(nvl, gb200, "allreduce", s, ranks, algo="^nvls,nvlstree"))
        per.append(f"{s} B {res[-1].algo}/{res[-1].proto} {time.perf_counter() - t:.3f} s")
    algos = Counter(f"{r.algo}/{r.proto}" for r in res)
    print(f"sweep {len(sizes)} sizes x 20 NVL72 racks, flow engine (one run): {time.perf_counter() - t0:.2f} s; "
          f"{sum(r.n_transfers for r in res)} transfers; choices {dict(algos)}\n  " + "\n  ".join(per))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--flow-racks", action="store_true", help="also run the 20-rack sweep by the flow engine")
    parser.add_argument("--flow-racks-sizes", default="",
                        help="comma-separated indices into the 30 sizes: the 20-rack flow sweep runs only these "
                             "(to compare with an earlier commit's code through PYTHONPATH in little time)")
    parser.add_argument("--only-racks", action="store_true", help="run only the 20-rack flow sweep")
    args = parser.parse_args()
    if args.only_racks:
        _flow_racks(args)
        return
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

    nvl = ClusterConfig(**{**load_preset("clusters", "gb200-nvl72"), "num_gpus": 1440})
    gb200 = get_gpu("gb200")
    layout = group_layout(nvl, gb200, nvl.num_gpus, 1)
    lo, med, res = _timed(lambda: [predict("allreduce", s, layout, algo="^nvls,nvlstree") for s in sizes],
                          args.repeat)
    algos = Counter(f"{r.algo}/{r.proto}" for r in res)
    print(f"sweep 30 sizes x 20 NVL72 racks (1,440 GPUs), analytic: {lo * 1e3:.1f} / {med * 1e3:.1f} ms "
          f"(target < 2 s); choices {dict(algos)}; 4 GiB busbw {res[-1].busbw_Bps / 1e9:.1f} GB/s")
    uneven = ClusterConfig(**{**load_preset("clusters", "gb200-nvl72"), "num_gpus": 2496})
    layout = group_layout(uneven, gb200, uneven.num_gpus, 1)  # 34 racks of 72 and one of 48
    lo, med, res = _timed(lambda: [predict("allreduce", s, layout) for s in sizes], args.repeat)
    algos = Counter(f"{r.algo}/{r.proto}" for r in res)
    print(f"sweep 30 sizes x 35 uneven NVL72 racks (2,496 GPUs, NVLS on), analytic: {lo * 1e3:.1f} / "
          f"{med * 1e3:.1f} ms; choices {dict(algos)}; 4 GiB busbw {res[-1].busbw_Bps / 1e9:.1f} GB/s")
    if args.flow_racks:
        _flow_racks(args)

    size = 4 * 2**30
    ranks = list(range(big.num_gpus))
    lo, med, r = _timed(lambda: run_collective(big, gpu, "allreduce", size, ranks), args.repeat)
    print(f"4 GiB AllReduce x 16,384 GPUs: {lo:.2f} / {med:.2f} s (target < 5 s); {r.algo}/{r.proto}, "
          f"{r.n_transfers} transfers, busbw {r.busbw_Bps / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
