"""CPU (host) time per launched kernel and per layer pass, read from a Kineto trace's CPU-side spans.

The figures a user measures on their own host to check or replace flowsim's host costs
(:mod:`flowsim.model.host_costs`); ``flowsim validate-trace TRACE --host`` prints them. All from complete
(``ph: X``) events, microseconds:

* **launch call**: the median duration of the kernel-launch API calls (``cudaLaunchKernel``, ``cuLaunchKernelEx``,
  ``hipLaunchKernel``, ... :data:`LAUNCH_CALLS`): the driver's share of a kernel's host cost;
* **CPU per kernel in ops**: the CPU time of the top-level operator spans (``cpu_op`` events not inside another
  ``cpu_op`` of the same thread: an ``aten::`` call from Python, an autograd backward function) divided by the
  kernels they launch (all such spans together, and the median span), over the spans that launch at least one
  and do not wait (a span holding a synchronising call, :data:`SYNC_CALLS`, or a launch call that blocked,
  :data:`BLOCKED_LAUNCH`, is left out): dispatch, allocator and launch per kernel;
* **launch gap**: the median time between consecutive launches of one CPU thread: what the CPU needs per kernel
  while it issues (Python, dispatch, launch), an upper bound on the host cost where the CPU is the bottleneck;
* **per thread**: launches and the median CPU per kernel of the operator spans of each launching thread, the
  autograd engine's thread (the one running ``autograd::engine::evaluate_function`` spans: the backward pass)
  marked, so forward and backward issue costs can be told apart;
* **per layer pass**: for each module class whose name looks like a layer (:data:`LAYER_CLASS`, e.g.
  ``DeepseekV2DecoderLayer``, ``TransformerBlock``, ``Bottleneck``) among the ``nn.Module: <class>_<n>`` spans
  (recorded with ``with_modules=True``): passes, median CPU microseconds per pass, kernels launched per pass,
  and CPU microseconds per kernel of the pass.

Profiling inflates CPU-side spans 2-5x (../shared/research/host-overhead.md sec. 5; more with ``with_stack``),
so these figures bound a host's unprofiled cost from above.
"""
from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

from flowsim.kernels.trace_events import read_events

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "hipLaunchKernel", "hipExtModuleLaunchKernel",
                "hipModuleLaunchKernel", "hipGraphLaunch")
"""Runtime / driver calls that put one kernel (or one CUDA graph) on a stream."""
SYNC_CALLS = re.compile(r"Synchronize|^(cuda|hip)Memcpy$|^(cuda|hip)EventQuery$|^(cuda|hip)(Malloc|Free)$")
"""Calls after which the CPU has waited for the GPU (or polls it; cudaMalloc/cudaFree synchronise the device)."""
BLOCKED_LAUNCH = 10.0
"""A launch call longer than this many times the trace's median launch call waited (on a full launch queue,
a lock): unblocked launch calls vary about 2x between their 10th and 90th percentile in the shared traces
(A100 DDP trace 5.5-12.1 us, host-overhead.md sec. 2), so 10x is well outside that spread."""
LAYER_CLASS = re.compile(r"(DecoderLayer|TransformerBlock|TransformerLayer|Block|Bottleneck|Layer)$")
"""Module class names taken for a model's repeated layer."""
_MODULE = re.compile(r"^nn\.Module: (.+?)_\d+$")


@dataclass(frozen=True)
class LayerPasses:
    """The passes through one layer class (microseconds per pass; medians over the passes)."""

    module: str
    passes: int
    cpu_us: float
    kernels: float
    cpu_us_per_kernel: float


@dataclass(frozen=True)
class ThreadHost:
    """One CPU thread that launches kernels: ``thread`` (``pid/tid``), launches, whether it runs the autograd
    engine (backward), and the median CPU microseconds per kernel of its operator spans that do not wait."""

    thread: str
    launches: int
    autograd: bool
    cpu_us_per_kernel_median: float


@dataclass(frozen=True)
class HostTrace:
    """Host-side figures of one trace (module docstring), microseconds; NaN where the trace holds no such event."""

    trace: str
    launches: int
    threads: int
    launch_call_us: float
    cpu_us_per_kernel: float
    cpu_us_per_kernel_median: float
    op_spans: int
    launch_gap_us: float
    layers: tuple = field(default_factory=tuple)
    threads_detail: tuple = field(default_factory=tuple)

    def to_dict(self) -> dict:
        """The JSON view (what ``flowsim validate-trace --host --json`` prints)."""
        d = asdict(self)
        d["layers"] = [asdict(x) for x in self.layers]
        d["threads_detail"] = [asdict(x) for x in self.threads_detail]
        return d


def _med(values) -> float:
    return float(median(values)) if values else float("nan")


def _top_level(spans: list) -> list:
    """Spans (ts, end) not inside an earlier one, in time order."""
    out, end = [], float("-inf")
    for ts, stop in sorted(spans, key=lambda s: (s[0], -s[1])):  # a parent before the children it starts with
        if ts >= end:
            out.append((ts, stop))
            end = stop
    return out


def _inside(times: list, ts: float, stop: float) -> int:
    """How many of the sorted ``times`` lie in ``[ts, stop]``."""
    return bisect_right(times, stop) - bisect_left(times, ts)


def host_costs_from_trace(path: str | Path) -> HostTrace:
    """The host figures of one Kineto trace (module docstring); ConfigError for a file that is not a trace."""
    trace = read_events(path)
    launches, syncs, ops, modules = defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list)
    long_launches, autograd = defaultdict(list), set()
    launch_durs = []
    for e in trace.events:
        if e.get("ph") != "X":
            continue
        key, name, ts, dur = (e.get("pid"), e.get("tid")), e["name"], float(e["ts"]), float(e["dur"])
        if name in LAUNCH_CALLS:
            launches[key].append(ts)
            launch_durs.append(dur)
            long_launches[key].append((ts, dur))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver") and SYNC_CALLS.search(name):
            syncs[key].append(ts)
        elif e.get("cat") == "cpu_op":
            ops[key].append((ts, ts + dur))
            if name.startswith("autograd::engine"):
                autograd.add(key)
        else:
            m = _MODULE.match(name)
            if m and LAYER_CLASS.search(m.group(1)):
                modules[m.group(1)].append((key, ts, ts + dur))
    blocked_dur = BLOCKED_LAUNCH * _med(launch_durs)
    for key, calls in long_launches.items():  # a blocked launch waited like a synchronising call
        syncs[key].extend(ts for ts, dur in calls if dur > blocked_dur)
    for times in (*launches.values(), *syncs.values()):
        times.sort()
    by_thread = defaultdict(list)
    for key, spans in ops.items():
        for ts, stop in _top_level(spans):
            k = _inside(launches.get(key, []), ts, stop)
            if k and not _inside(syncs.get(key, []), ts, stop):
                by_thread[key].append((stop - ts, k))
    per_span = [x for spans in by_thread.values() for x in spans]
    cpu, kernels = sum(d for d, _ in per_span), sum(k for _, k in per_span)
    threads = tuple(ThreadHost(thread=f"{key[0]}/{key[1]}", launches=len(times), autograd=key in autograd,
                               cpu_us_per_kernel_median=_med([d / k for d, k in by_thread.get(key, [])]))
                    for key, times in sorted(launches.items(), key=lambda kv: -len(kv[1])))
    gaps = [b - a for times in launches.values() for a, b in zip(times, times[1:])]
    layers = []
    for module, spans in sorted(modules.items()):
        per = [(stop - ts, _inside(launches.get(key, []), ts, stop)) for key, ts, stop in spans]
        with_kernels = [(d, k) for d, k in per if k]
        layers.append(LayerPasses(module=module, passes=len(per), cpu_us=_med([d for d, _ in per]),
                                  kernels=_med([k for _, k in per]),
                                  cpu_us_per_kernel=_med([d / k for d, k in with_kernels])))
    return HostTrace(trace=str(trace.path), launches=len(launch_durs), threads=len(launches),
                     launch_call_us=_med(launch_durs),
                     cpu_us_per_kernel=cpu / kernels if kernels else float("nan"),
                     cpu_us_per_kernel_median=_med([d / k for d, k in per_span]), op_spans=len(per_span),
                     launch_gap_us=_med(gaps), layers=tuple(layers), threads_detail=threads)
