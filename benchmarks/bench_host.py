"""Cost of the host model in one step estimate: gpt3-175b on 1,024 H100 (TP8 PP8 DP16, GBS 1536), the README example.

Run: ``python benchmarks/bench_host.py``. Prints the median ``flowsim.simulate`` time without a host model and with
``host_overhead: te`` (Transformer Engine host costs), and the time of pricing the host costs of every block of the
step (:func:`flowsim.model.host_costs.block_host_s`), after compilation. Figures go into docs/PERFORMANCE.md.
"""
from __future__ import annotations

import os
import statistics
import time

import flowsim
from flowsim.model.host_costs import block_host_s
from flowsim.model.workload import build_workload

ARGS = dict(model="gpt3-175b", cluster="dgx-h100", gpus=1024, tp=8, pp=8, dp=16, gbs=1536, sp=True)


def _median_ms(fn, repeats: int) -> float:
    fn()  # compile / warm caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(repeats: int = 50) -> None:
    plain = flowsim.build_config(**ARGS)
    host = flowsim.build_config(**ARGS, host_overhead="te")
    wl = build_workload(host)
    blocks = [b.compute for b in (wl.layer, wl.moe_layer, wl.embedding, wl.head) if b is not None]
    t_plain = _median_ms(lambda: flowsim.simulate(plain), repeats)
    t_host = _median_ms(lambda: flowsim.simulate(host), repeats)
    t_costs = _median_ms(lambda: [block_host_s(b, host.training, host.cluster.cpu) for b in blocks], 4 * repeats)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"simulate, no host model      {t_plain:7.2f} ms")
    print(f"simulate, host_overhead te   {t_host:7.2f} ms  ({100 * (t_host - t_plain) / t_plain:+.1f} %)")
    print(f"host costs of the step's {len(blocks)} blocks {t_costs:7.3f} ms  "
          f"({100 * t_costs / t_plain:.1f} % of simulate)")


if __name__ == "__main__":
    main()
