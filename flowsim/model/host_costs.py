"""CPU seconds a framework spends issuing each kernel, per framework mode and host CPU family.

The figures live in ``flowsim/model/data/host_costs.csv`` (one row per mode, CPU family and parameter, each
with its source; ../shared/research/host-overhead.md collects them). They are unprofiled costs: Kineto traces
inflate CPU-side spans 2-5x (host-overhead.md sec. 5), so the traces' figures (``flowsim validate-trace
--host``, docs/MODEL.md) bound them from above rather than set them.

Modes (``TrainingConfig.host_overhead``):

* ``eager``: plain PyTorch modules under autograd (torchtitan without torch.compile, FSDP scripts);
* ``megatron``: Megatron-LM's local modules with Apex fused kernels (same issue path, fewer kernels);
* ``te``: Transformer Engine modules (their linear layers cost several times a torch Linear on the CPU);
* ``compiled``: torch.compile (Inductor's launcher per fused kernel);
* CUDA graphs (``TrainingConfig.cuda_graphs``) replace the per-kernel costs of what they capture by the
  ``graphed`` rows: one launch per replay plus a cost per node.

Parameters: ``kernel_fwd_us`` (one forward kernel: Python module, dispatcher, launch), ``kernel_bwd_us`` (one
backward kernel, issued by autograd's C++ engine), ``linear_fwd_us`` (one linear layer's forward call, all its
kernels), ``graph_launch_us`` and ``graph_node_us``.
"""
from __future__ import annotations

import csv
import functools
from importlib import resources
from typing import NamedTuple

import numpy as np

from flowsim.config.cluster import CPUS as CPU_FAMILIES
from flowsim.config.training import CUDA_GRAPH_SCOPES, HOST_MODES
from flowsim.errors import ConfigError
from flowsim.kernels.calibration import host_scale
from flowsim.units import US


ATTENTION_GEMMS = ("attn_scores", "attn_context")
"""Name prefixes of the unfused attention's batched GEMMs (:func:`flowsim.model.ops.unfused_attention`): plain
kernels, not linear layers."""


class HostCosts(NamedTuple):
    """Per-kernel CPU costs of one mode on one CPU family, seconds."""

    kernel_fwd_s: float
    kernel_bwd_s: float
    linear_fwd_s: float
    graph_launch_s: float
    graph_node_s: float


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    """``{(mode, cpu, parameter): (value_us, source)}`` from the data file."""
    text = resources.files("flowsim.model").joinpath("data/host_costs.csv").read_text(encoding="utf-8")
    return {(r["mode"], r["cpu"], r["parameter"]): (float(r["value_us"]), r["source"])
            for r in csv.DictReader(text.splitlines())}


def host_costs(mode: str, cpu: str) -> HostCosts:
    """The costs of ``mode`` (one of :data:`HOST_MODES` but ``none``) on a ``cpu`` host (intel, amd, arm)."""
    if mode not in HOST_MODES[1:]:
        raise ConfigError("host_overhead", f"must be one of {', '.join(HOST_MODES)}", mode)
    if cpu not in CPU_FAMILIES:
        raise ConfigError("cpu", f"must be one of {', '.join(CPU_FAMILIES)}", cpu)
    t = _table()
    return HostCosts(*(t[(mode, cpu, p)][0] * US for p in ("kernel_fwd_us", "kernel_bwd_us", "linear_fwd_us")),
                     *(t[("graphed", cpu, p)][0] * US for p in ("graph_launch_us", "graph_node_us")))


def op_host_s(name, kind, phase, count, costs: HostCosts, cuda_graphs: str = "none") -> np.ndarray:
    """CPU seconds to issue each row of a block's op table (all ``count`` instances of the row).

    ``name``, ``kind``, ``phase`` and ``count`` are the op table's columns (:mod:`flowsim.model.ops`), rows in
    the order the block builds them: a forward or recompute GEMM of a linear layer costs ``linear_fwd_s``,
    other forward kernels ``kernel_fwd_s``, backward kernels ``kernel_bwd_s``. CUDA graphs replace that by
    ``graph_node_s`` per kernel plus one launch per replay: under ``layer`` each phase of the block (its
    forward, backward, recompute) is one replay; under ``module`` each phase of each module (a layer's rows up
    to its ``post_attn_norm`` are its attention module, the rest its MLP); under ``full_iteration`` the one
    launch per step is left out.
    """
    if cuda_graphs not in CUDA_GRAPH_SCOPES:
        raise ConfigError("cuda_graphs", f"must be one of {', '.join(CUDA_GRAPH_SCOPES)}", cuda_graphs)
    phase = np.asarray(phase)
    kind = np.asarray(kind)
    n = np.asarray(count, dtype=np.float64)
    linear = (kind == "gemm") & np.array([not str(x).startswith(ATTENTION_GEMMS) for x in name], dtype=bool)
    fwd = phase != "bwd"
    per = np.where(fwd, np.where(linear, costs.linear_fwd_s, costs.kernel_fwd_s), costs.kernel_bwd_s)
    if cuda_graphs == "none":
        return per * n
    if cuda_graphs == "full_iteration":  # the step's one launch is negligible beside its kernels
        return graphed_host_s(per * n, np.zeros(phase.size, np.int64), 0.0, costs.graph_node_s, n)
    gid = np.unique(phase, return_inverse=True)[1]
    if cuda_graphs == "module":
        mlp = np.cumsum([str(x).startswith("post_attn_norm") for x in name]) > 0
        gid = 2 * gid + mlp
    return graphed_host_s(per * n, gid, costs.graph_launch_s, costs.graph_node_s, n)


def block_host_s(table, training, cpu: str) -> np.ndarray | None:
    """CPU seconds to issue each row of one block's op table (:class:`flowsim.model.ops.OpSet` ``compute``, or a
    mapping of its ``name``, ``kind``, ``phase`` and ``count`` columns) under ``training.host_overhead`` on a
    ``cpu`` host, each phase of the block one graph replay under ``cuda_graphs: layer``; None with
    ``host_overhead: none`` (no host model: the GPU never waits for the CPU). A calibration profile's
    ``host_multiplier`` for the host CPU and software family scales every cost
    (:func:`flowsim.kernels.calibration.host_scale`)."""
    if training.host_overhead == "none":
        return None
    scale = host_scale(training.calibration, training.software_release, training.framework_version, cpu)
    costs = HostCosts(*(c * scale for c in host_costs(training.host_overhead, cpu)))
    return op_host_s(*(np.asarray(table[k]) for k in ("name", "kind", "phase", "count")), costs,
                     training.cuda_graphs)


def graphed_host_s(host_s, graph_id, launch_s: float, per_node_s: float, count=None) -> np.ndarray:
    """Host seconds per op once CUDA graphs capture some of them.

    ``graph_id`` (int, per op): ``-1`` for an op issued eagerly (it keeps its ``host_s``), else the graph
    replay it belongs to. The ops of one id are one ``cudaGraphLaunch``: the first of them carries
    ``launch_s``, and every captured kernel (graph node) ``per_node_s``, times ``count`` (kernels per row, 1 by
    default). A per-layer graph gives each layer (or each pass of it) an id of its own; a full-iteration graph
    puts every op of the step under one id.
    """
    h = np.ascontiguousarray(host_s, dtype=np.float64)
    gid = np.ascontiguousarray(graph_id, dtype=np.int64)
    n = np.ones(h.size) if count is None else np.asarray(count, dtype=np.float64)
    if gid.shape != h.shape or n.shape != h.shape:
        raise ValueError(f"graph_id and count must have the ops' length {h.size} (got {gid.shape}, {n.shape})")
    first = np.zeros(h.size, dtype=bool)
    captured = np.flatnonzero(gid >= 0)
    _, idx = np.unique(gid[captured], return_index=True)
    first[captured[idx]] = True
    return np.where(gid >= 0, per_node_s * n + np.where(first, launch_s, 0.0), h)
