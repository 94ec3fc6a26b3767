"""Cost of capturing one rank of a 512-rank job on CPU (flowsim.capture); figures go to docs/CAPTURE.md.

Cases: the example GPT under 2-D parallelism (DTensor TP 8 x FSDP2 over 64 data-parallel ranks) at a
GPT-3 2.7B-like size (32 blocks, hidden 2560, 32 heads, vocab 50304, seq 2048, micro-batch 1), and the
same model under DDP at 512 ranks. Each case runs in a fresh process so that its peak RSS
(``ru_maxrss``) is its own; the RSS of importing torch and flowsim alone is printed for reference.
Wall time covers setup (model build, wrapping), one warm-up step and the recorded step, and simulating the
result on dgx-h100.

Run: ``python benchmarks/bench_capture.py``.
"""
from __future__ import annotations

import json
import subprocess
import sys

CASES = {"tp-dp": dict(parallel="tp-dp", tp=8), "ddp": dict(parallel="ddp", tp=1)}
SHAPE = dict(layers=32, hidden=2560, heads=32, vocab=50304, seq=2048, micro_batch=1)
WORLD_SIZE = 512

_CHILD = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
import torch
from flowsim.capture import GPTShape, capture, gpt_example
from flowsim.capture.program import simulate_workload
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
case = json.loads(sys.argv[1])
t0 = time.perf_counter()
setup, step = gpt_example(case["parallel"], case["world_size"], tp=case["tp"], shape=GPTShape(**case["shape"]))
w = capture(step, setup=setup, world_size=case["world_size"])
t1 = time.perf_counter()
r = simulate_workload(w, "dgx-h100")
t2 = time.perf_counter()
print(json.dumps(dict(capture_s=t1 - t0, simulate_s=t2 - t1, ops=len(w.ops), comms=len(w.comms()),
                      import_rss_bytes=base, peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      step_time_s=r.step_time_s)))
"""


def main() -> None:
    for name, case in CASES.items():
        arg = json.dumps(dict(case, world_size=WORLD_SIZE, shape=SHAPE))
        out = subprocess.run([sys.executable, "-c", _CHILD, arg], capture_output=True, text=True, check=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:6s} {WORLD_SIZE} ranks: capture {res['capture_s']:.2f} s, simulate {res['simulate_s']:.3f} s, "
              f"{res['ops']} ops ({res['comms']} collectives), peak RSS {res['peak_rss_bytes'] / 1e9:.2f} GB "
              f"(torch + flowsim imported: {res['import_rss_bytes'] / 1e9:.2f} GB), "
              f"predicted step {res['step_time_s'] * 1e3:.1f} ms on dgx-h100")


if __name__ == "__main__":
    main()
