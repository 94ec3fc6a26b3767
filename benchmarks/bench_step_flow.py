"""Speed of a whole step with the flow engine (``comm_engine: flow``), numba cache warm.

Run: ``python benchmarks/bench_step_flow.py [--scaling]``. Each case is simulated once to build its topology
and compile, then timed on a fresh process-level cache miss of the collectives, cross-kind simulations
included (the topology and the prepared collectives, plans and routes, are kept; benchmarks/bench_flow_scaling.py
measures against the code without those caches). ``--scaling`` adds how the time grows with the GPU count (GPT-3 175B,
TP8 PP8, DP 4-64) and with the pipeline depth (GPT-3 175B on 1,024 H100, TP8, PP 2-32).
Figures and the machine go into docs/PERFORMANCE.md.
"""
from __future__ import annotations

import platform
import sys
import time

import flowsim
from flowsim.step import flows as step_flows

CASES = {
    "gpt3-175b, 1,024 H100, TP8 PP8 DP16": dict(model="gpt3-175b", cluster="dgx-h100", gpus=1024, tp=8, pp=8,
                                                gbs=1536, sp=True, distributed_optimizer=True),
    "llama3.1-405b, 16,384 H100, TP8 PP16 DP128, seq 8192": dict(
        model="llama3.1-405b", cluster="dgx-h100", gpus=16384, tp=8, pp=16, gbs=2048, seq=8192, sp=True,
        distributed_optimizer=True, pipeline_layer_split="balanced", switch_radix=128),
    "deepseek-v3, 2,048 H800, PP16 EP64 DP128": dict(
        model="deepseek-v3", cluster="hgx-h800", gpus=2048, pp=16, ep=64, gbs=15360,
        distributed_optimizer=True, precision="fp8", pipeline_layer_split="balanced", switch_radix=128),
    "deepseek-v3, 2,048 H800, PP16 EP64 DP128, DeepEP dispatch": dict(
        model="deepseek-v3", cluster="hgx-h800", gpus=2048, pp=16, ep=64, gbs=15360,
        distributed_optimizer=True, precision="fp8", pipeline_layer_split="balanced", switch_radix=128,
        moe_token_dispatcher_type="flex"),
}


GPT3 = dict(model="gpt3-175b", cluster="dgx-h100", tp=8, sp=True, distributed_optimizer=True)
SCALING = {
    **{f"gpt3-175b, {64 * dp} H100, TP8 PP8 DP{dp}": dict(GPT3, gpus=64 * dp, pp=8, gbs=96 * dp)
       for dp in (4, 8, 16, 32, 64)},
    **{f"gpt3-175b, 1,024 H100, TP8 PP{pp} DP{128 // pp}": dict(GPT3, gpus=1024, pp=pp, gbs=1536)
       for pp in (2, 4, 8, 16, 32)},
}


def _time(name: str, kw: dict) -> None:
    cfg = flowsim.build_config(**kw, comm_engine="flow")
    t0 = time.perf_counter()
    r = flowsim.simulate(cfg)
    first = time.perf_counter() - t0
    step_flows._flow.cache_clear()
    step_flows._together_s.cache_clear()
    t0 = time.perf_counter()
    flowsim.simulate(cfg)
    again = time.perf_counter() - t0
    print(f"{name}: first {first:.2f} s (topology build + flows), again {again:.2f} s (flows re-run); "
          f"step {r.step_time_s:.2f} s")


def main() -> None:
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}")
    cases = dict(CASES, **SCALING) if "--scaling" in sys.argv[1:] else CASES
    for name, kw in cases.items():
        _time(name, kw)


if __name__ == "__main__":
    main()
