"""Predicted execution time of a chosen (algorithm, protocol): NCCL's model plus what it leaves out.

NCCL's own estimate ``lat + nBytes / bw`` (:func:`flowsim.nccl_models.tuning.nccl_time_s`) is built for
ranking; it under-predicts mid-size times (research notes section 1.8, "Mid-size gap"). The predicted
time adds three things:

1. **Pipeline fill**, derived from NCCL's chunking (``src/enqueue.cc`` ``calcCollChunking``): data moves
   through the ring (or the tree/chain) in slices; the first slice must cross a hop before the pipeline
   streams, so one slice time at the per-channel rate is added:
   ``fill = slice_bytes / (bus bandwidth / channels)``. The slice shrinks with the message exactly as
   NCCL's chunk does (Simple ring: ``min(2 MiB, nBytes / (channels * nRanks))`` chunks of 2 slices).
   No fitted constant. NVLS: ``NVLS_FILL_CHUNKS`` chunks of NCCL's 128/64/32/16 KiB chunk ladder (fitted).
2. **NVLS per-chunk cost** ``NVLS_CHUNK_OVERHEAD_S`` for the extra chunks of a shrunk NVLS chunk (fitted).
3. **Achieved-bandwidth efficiencies** where NCCL's bandwidth is known to be only a ranking figure,
   each calibrated on nccl-tests / rccl-tests measurements (collective measurements only, large sizes
   only, one constant per fitted number; see the constants below and docs/NCCL.md).

The release modelled (``CommLayout.nccl_version``) decides what NCCL *picks* (:mod:`.tuning`); the time of
the pick is always priced with the newest release's model (:func:`execution_layout`): older tables hold
ranking figures NCCL later corrected against hardware (before 2.28 NVLS AllReduce was ranked at 5/6 of its
busBw, 400 GB/s algbw on H100 where 2.28+ say 274 and nccl-tests measures 272-275; before 2.21 Ring/LL at
1/4 of it), and the calibrated constants below were fitted on that model.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from flowsim.nccl_models.constants import (
    BCAST_CHUNK_STEPS, LL128_MAX_THREADS, LL128_STEP_DATA_BYTES, LL_MAX_THREADS, LL_STEP_DATA_BYTES,
    NVLS_CHUNK_BYTES, PCI_BW_GBPS, RING_CHUNK_STEPS, RING_SLICE_STEPS, SIMPLE_MAX_THREADS, SIMPLE_PCI_THREADS,
    SIMPLE_STEP_BYTES, THREAD_THRESHOLD_BYTES, TREE_SIMPLE_THREADS, Algo, Coll, Proto,
)
from flowsim.nccl_models.graph import graphs_of
from flowsim.nccl_models.layout import CommLayout
from flowsim.nccl_models.tuning import CostModel, cost_model, n_steps, nccl_time_s
from flowsim.nccl_models.versions import DEFAULT_NCCL_VERSION
from flowsim.units import GB, KiB

RCCL_XGMI_BW_EFFICIENCY = 0.745
"""Achieved / NCCL-formula bandwidth for RCCL on an xGMI mesh (dimensionless). Fitted on rccl-tests
AllReduce, 1 node, sizes >= 4 GiB: MI300X 315.7 GB/s busbw against 439.3 GB/s from the formulas with
448 GB/s xGMI (ratio 0.719), MI355X 406.8 against 527.0 with 537.6 GB/s (0.772); geometric mean 0.745.
Files: mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt (dataset A), mi355x_8gpu_rccl_allreduce_alltoall_oci.txt."""

NET_BW_EFFICIENCY = 0.90
"""Achieved / NCCL-formula bandwidth when a collective crosses the network (dimensionless). Fitted on
the multi-node nccl-tests/rccl-tests AllReduce rows >= 4 GiB: GCP A3 Mega 2x8 H100 NVLSTree 338.8 against
383.4 GB/s (0.884); MI300X 2x8 357.5 against 413.5 (0.865); MI325X Ring 2/4/8 nodes 350.2/350.6/350.8
against 382.7/381.4/378.7 (0.915/0.919/0.926); geometric mean 0.90."""

ALLTOALL_NET_EFFICIENCY = 0.80
"""Achieved fraction of the NICs' bandwidth in AllToAll across nodes (dimensionless). Fitted on
h100_16gpu_2node_alltoall_xxrjun.txt, sizes >= 4 GiB: algbw 79-80 GB/s per rank where half the bytes
cross 8 NICs per node at an assumed 400 Gb/s (100 GB/s per rank): 0.80. The NIC speed of that cluster is
not stated in the log; the assumption is documented in docs/NCCL.md."""

MNNVL_BW_EFFICIENCY = 1.16
"""Achieved / NCCL-formula bandwidth inside a multi-node NVLink domain (GB200 NVL72; dimensionless). NCCL prices
an NVLink5 link at 40 GB/s (18 links: 720 GB/s, ring busBw 720); nccl-tests measures an AllReduce ring over
one NVL72 rack (72 GPUs, NCCL 2.26.2, NVLS off) at 839.2 and 834.6 GB/s busbw at 4 and 8 GiB: 1.165 and 1.159,
mean 1.16 (93 % of the 900 GB/s wire). Fitted on gb200_72gpu_1rack_allreduce_mnnvl_coreweave.txt (sizes
>= 4 GiB); checked on the 2- and 20-rack files. Not applied within one host: Azure's 4-GPU GB200 ring
(NCCL 2.25.1) measures 679.6 GB/s at 8 GiB, 0.94 of NCCL's figure (docs/NCCL.md, Rack scale, on the conflict)."""

SENDRECV_NET_EFFICIENCY = 0.58
"""Achieved fraction of one NIC's bandwidth for one send/recv pair across nodes (dimensionless). Fitted
on the sendrecv section of h100_16gpu_2node_alltoall_xxrjun.txt, sizes >= 4 GiB: 29.0 GB/s against an
assumed 400 Gb/s NIC (50 GB/s): 0.58 (NCCL drives one peer over few channels with 128 KiB chunks)."""

NVLS_FILL_CHUNKS = 11.0
"""NVLS pipeline depth in chunks (dimensionless): the fill time is this many chunks at the per-channel
bandwidth. Fitted on h100_8gpu_allreduce_nvls_together.txt (sizes >= 4 MiB, where the -g 8 launch floor
no longer dominates): a straight line of time vs size inside each chunk-size band (32, 64, 128 KiB) has
an intercept of NCCL's 25 us plus 10.8-11.4 chunk times; checked on h200_8gpu_allreduce_nvls_azure_ndh200v5.txt
(4 % median busbw error >= 1 MiB). 11 chunks is about NCCL_STEPS (8) buffer slots plus the 3 warp-group stages
(scatter, reduce, broadcast) of the NVLS kernel [interpretation, not from NCCL]."""

NVLS_CHUNK_OVERHEAD_S = 0.71e-6
"""Fixed cost of one NVLS chunk on one channel, seconds. Fitted with NVLS_FILL_CHUNKS on the same file:
the slope of time vs size in each chunk-size band gives 168 / 218 / 257 / 275 GB/s algbw for 16 / 32 /
64 / 128 KiB chunks, i.e. 1/bw = 1/B + t / (16 channels x chunk) with t = 0.71 us."""

# NVLS chunk ladder (NCCL 2.30.7 enqueue.cc calcCollChunking): the 128 KiB chunk shrinks to 64 / 32 /
# 16 KiB when nBytes < 64 / 8 / 2 x (channels x heads x chunk).
_NVLS_SHRINK = ((64, 64 * KiB), (8, 32 * KiB), (2, 16 * KiB))


_NOT_MNNVL_FITTED = (Algo.NVLS, Algo.NVLS_TREE, Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN)


def network_bound(layout: CommLayout, algo: Algo | None = None) -> bool:
    """The NICs bound the collective's bandwidth, so ``NET_BW_EFFICIENCY`` applies (dimensionless rule).

    True across nodes when each node has fewer NICs than the collective's channels (HGX: 8 NICs, 16+ channels:
    every NIC carries several channels at NCCL's per-NIC speed). False on one node, for CollNet (the switches
    reduce: a node's NICs carry the buffer once each way, half of what NCCL's figure would need to fill them;
    H100 x 64 with SHARP: 195.3 GB/s algbw measured at 8 GiB against NCCL's 200 GB/s CollNetChain figure,
    ratio 0.98, h100_64gpu_8node_allreduce_sharp_collnetchain_coreweave.txt), and when every channel has a NIC
    of its own (NVL72 racks: 72 NICs, 30 channels), where the NVLink side binds.
    """
    if layout.n_nodes == 1 or algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        return False
    return layout.nics_per_node < graphs_of(layout).exec_channels


def bw_efficiency(layout: CommLayout, algo: Algo | None = None, *, network: bool = True) -> float:
    """Calibrated achieved / formula bandwidth for a communicator (dimensionless).

    RCCL on an xGMI mesh (one node) ``RCCL_XGMI_BW_EFFICIENCY``; multi-node NVLink ``MNNVL_BW_EFFICIENCY`` (fitted
    on a ring: not for NVLS, NVLSTree and CollNet, whose rates are not NCCL's NVLink ring figure); and,
    with ``network`` (the flow engine puts it on its scale-out links instead), ``NET_BW_EFFICIENCY`` where the
    NICs bind (:func:`network_bound`; ``algo`` is the algorithm that runs).
    """
    eff = 1.0
    if layout.vendor == "amd" and layout.scaleup_kind == "xgmi_mesh" and layout.n_nodes == 1:
        eff *= RCCL_XGMI_BW_EFFICIENCY
    if layout.mnnvl and algo not in _NOT_MNNVL_FITTED:
        eff *= MNNVL_BW_EFFICIENCY
    if network and network_bound(layout, algo):
        eff *= NET_BW_EFFICIENCY
    return eff


NVLS_CHECKED_HEADS = 8
"""NVLS heads of the one-node AllReduce whose NCCL bandwidth (2.28+ ``nvlsEfficiency`` model) is checked against
measurement: 8 H100, 274 GB/s algbw by the formula, 272-275 measured (h100_8gpu_allreduce_nvls_together.txt,
NVIDIA/nccl-tests#212 and NVIDIA/nccl#1455 in nccl_peaks.csv)."""


def nvls_allreduce_factor(coll: Coll, layout: CommLayout, a: Algo) -> float:
    """Achieved / NCCL NVLS AllReduce bandwidth on one node of fewer than ``NVLS_CHECKED_HEADS`` ranks
    (dimensionless; 1 for any other case).

    An NVLS AllReduce moves ``S (1 + 1/n)`` through each GPU's NVLink each way (``multimem.ld_reduce`` reads
    the GPU's whole buffer, ``S``, and returns its reduced ``S / n``; ``multimem.st`` sends that up and the
    switch multicasts every GPU ``S``), so at one per-GPU NVLink rate ``X`` the algbw is ``X / (1 + 1/n)``:
    nearly flat in ``n``, while NCCL's figure grows with its ``n`` heads. ``X`` is NCCL's figure at 8 heads
    times ``9 / 8``, no fitted constant. 5 / 6 / 7 H100: 257 / 265 / 270 GB/s algbw against 258 / ~265 / ~270
    measured (NVIDIA/nccl#1455, 2-4 GiB); NCCL's figure alone gives 188 / 216 / 245.
    """
    n = layout.n_ranks
    if a != Algo.NVLS or coll != Coll.ALLREDUCE or layout.n_nodes > 1 or n >= NVLS_CHECKED_HEADS:
        return 1.0
    full = cost_model(coll, replace(layout, n_ranks=NVLS_CHECKED_HEADS)).algbw_Bps[a, Proto.SIMPLE]
    own = cost_model(coll, layout).algbw_Bps[a, Proto.SIMPLE]
    return float(full * (1 + 1 / NVLS_CHECKED_HEADS) / (1 + 1 / n) / own)


def nvls_chunk_bytes(n_bytes: float, concurrent_ops: int) -> float:
    """NVLS chunk size NCCL uses for ``n_bytes`` with ``concurrent_ops = channels x heads``, bytes."""
    chunk = NVLS_CHUNK_BYTES
    for mult, smaller in _NVLS_SHRINK:
        if n_bytes < mult * concurrent_ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def _max_threads(model: CostModel, a: Algo, p: Proto) -> int:
    """Threads per channel of a Ring/Tree kernel (tuning.cc ``maxThreads``)."""
    if p == Proto.LL:
        return LL_MAX_THREADS
    if p == Proto.LL128:
        return LL128_MAX_THREADS
    if a == Algo.TREE:
        return TREE_SIMPLE_THREADS
    ring = model.graphs.ring
    return SIMPLE_PCI_THREADS if ring.bw_intra_Bps * ring.n_channels <= PCI_BW_GBPS * GB else SIMPLE_MAX_THREADS


def run_channels(model: CostModel, layout: CommLayout, a: Algo, p: Proto, n_bytes: float) -> int:
    """Channels NCCL runs (a, p) on for ``n_bytes`` (enqueue.cc ``topoGetAlgoInfo``).

    Parameters
    ----------
    model : CostModel
        NCCL's table for the collective (its graphs give the communicator's channels).
    layout : CommLayout
        The communicator.
    a, p : Algo, Proto
        The algorithm and protocol that run.
    n_bytes : float
        NCCL's byte count (total buffer for AllGather/ReduceScatter), > 0.

    Returns
    -------
    int
        Ring and Tree start from the communicator's channels and drop one while
        ``nBytes < channels x threads x threshold`` (threshold 8 B/thread for LL and LL128, 64 for Simple,
        Ring/LL x nRanks), down to one: ``max(1, min(channels, nBytes // (threads x threshold)))``; the rule
        is the same in v2.18.3 (``getAlgoInfo``) and v2.30.7. NVLS/NVLSTree run their own channel count;
        PAT is not reduced. This sets the CTAs (SMs) the kernel holds, not its speed (:func:`exec_time_s`).
    """
    g = model.graphs
    if a in (Algo.NVLS, Algo.NVLS_TREE):
        return g.nvls_exec_channels
    if a not in (Algo.RING, Algo.TREE):
        return g.exec_channels
    threshold = THREAD_THRESHOLD_BYTES[p] * (layout.n_ranks if (a == Algo.RING and p == Proto.LL) else 1)
    per_channel = _max_threads(model, a, p) * threshold
    return max(1, min(g.exec_channels, int(n_bytes // per_channel)))


# Tree chunk shrink ladders, NCCL enqueue.cc (computeColl / calcCollChunking, 2.12 .. 2.30) [recalled from the
# source, not in the research notes; unverified]: Simple halves the chunk while a channel has fewer than
# depth x 8 / x 4 / x 1 chunks and the chunk is above 128 / 64 / 32 KiB; LL128 while fewer than
# nsteps x 64 / ppn and x 16 / ppn chunks and above 128 / 32 KiB, nsteps = 1 + log2(nNodes) + 0.1 ppn.
_TREE_SIMPLE_SHRINK = ((8, 128 * 1024), (4, 64 * 1024), (1, 32 * 1024))
_TREE_LL128_SHRINK = ((64, 128 * 1024), (16, 32 * 1024))


def tree_depth(layout: CommLayout) -> int:
    """Hops from the deepest rank to the root of NCCL's tree: the chain inside a node (``ppn - 1``; the largest
    node's when they are uneven) and the binary tree over the nodes (``ceil(log2(nNodes))``, ``trees.cc``
    ``ncclGetBtree``)."""
    return max(layout.node_sizes) - 1 + math.ceil(math.log2(layout.n_nodes))


def tree_chunk_bytes(p: Proto, per_channel: float, depth: int, layout: CommLayout) -> float:
    """NCCL's Tree chunk for ``per_channel`` bytes on a tree of ``depth`` (ranks, root to deepest leaf), bytes."""
    if p == Proto.LL:
        return LL_STEP_DATA_BYTES
    if p == Proto.SIMPLE:
        chunk, ladder, scale = SIMPLE_STEP_BYTES, _TREE_SIMPLE_SHRINK, depth
    else:
        ppn = layout.ranks_per_node
        chunk = LL128_STEP_DATA_BYTES
        ladder, scale = _TREE_LL128_SHRINK, (1 + math.log2(layout.n_nodes) + 0.1 * ppn) / ppn
    for mult, floor in ladder:
        while per_channel / chunk < scale * mult and chunk > floor:
            chunk /= 2
    return chunk


def pipeline_fill_s(model: CostModel, layout: CommLayout, a: Algo, p: Proto, n_bytes: float,
                    algbw_Bps: float) -> float:
    """Time for the pipeline to fill before it streams, seconds.

    Parameters
    ----------
    model : CostModel
        NCCL's table for the collective.
    layout : CommLayout
        The communicator.
    a, p : Algo, Proto
        The algorithm and protocol that run.
    n_bytes : float
        NCCL's byte count (total buffer for AllGather/ReduceScatter), > 0.
    algbw_Bps : float
        Achieved algorithm bandwidth of (a, p), bytes/s.

    Returns
    -------
    float
        Ring, Tree, PAT: one slice at the per-channel bus bandwidth; Broadcast/Reduce chains: ``n - 2``
        chunks (the chain's depth); derived, no fitted constant. Slices are cut for all the
        communicator's channels even when NCCL runs fewer (:func:`run_channels`): the larger slices of
        fewer channels move at the bandwidth the dropped channels leave (see :func:`exec_time_s`).
        NVLS, NVLSTree: ``NVLS_FILL_CHUNKS`` chunks at the per-channel bandwidth.
    """
    g = model.graphs
    n = layout.n_ranks
    coll = model.coll
    if a in (Algo.NVLS, Algo.NVLS_TREE):
        channels = g.nvls_exec_channels
        chunk = nvls_chunk_bytes(n_bytes, channels * g.nvls.n_channels)
        return NVLS_FILL_CHUNKS * chunk / (algbw_Bps / channels)
    channels = g.exec_channels
    chain = coll in (Coll.BROADCAST, Coll.REDUCE)
    if p == Proto.SIMPLE and chain:
        chunk_max, slice_frac = BCAST_CHUNK_STEPS * SIMPLE_STEP_BYTES, 1.0
    elif p == Proto.SIMPLE:
        chunk_max, slice_frac = RING_CHUNK_STEPS * SIMPLE_STEP_BYTES, RING_SLICE_STEPS / RING_CHUNK_STEPS
    elif p == Proto.LL128:
        chunk_max, slice_frac = LL128_STEP_DATA_BYTES, 1.0
    else:
        chunk_max, slice_frac = LL_STEP_DATA_BYTES, 1.0
    if a == Algo.TREE and p == Proto.SIMPLE:
        # a Simple chunk is stored and forwarded: it goes up the tree and back down, 2 depth - 1 chunk times
        # before the pipeline streams (LL/LL128 forward each line as its flag arrives: no chunk fill)
        depth = tree_depth(layout)
        per_channel = n_bytes / channels
        chunk = min(tree_chunk_bytes(p, per_channel, depth, layout), per_channel)
        return (2 * depth - 1) * chunk / (algbw_Bps / channels)
    if a == Algo.RING and not chain:
        per_step = n_bytes / (channels * n)
        bus_Bps = algbw_Bps * n_steps(coll, n) / n
        hops = 1  # every rank works from the first step; only the first slice of a step must arrive
    else:  # chain/tree pipelines carry the whole per-channel buffer
        per_step = n_bytes / channels
        bus_Bps = algbw_Bps
        # Broadcast/Reduce chain: k chunks reach the last of n ranks after k + n - 2 chunk times.
        hops = max(n - 2, 1) if chain else 1
    slice_bytes = min(chunk_max, per_step) * slice_frac
    return hops * slice_bytes / (bus_Bps / channels)


def nvls_chunk_overhead_s(model: CostModel, n_bytes: float) -> float:
    """Extra time of NVLS chunks smaller than the default 128 KiB, seconds.

    Each chunk a channel handles costs ``NVLS_CHUNK_OVERHEAD_S`` besides its bytes; NCCL's NVLS
    bandwidth is the rate at the default 128 KiB chunk, so only the additional chunks of a shrunk
    chunk size (64/32/16 KiB, :func:`nvls_chunk_bytes`) add time:
    ``n_bytes / channels * (1 / chunk - 1 / 128 KiB) * NVLS_CHUNK_OVERHEAD_S``.
    """
    g = model.graphs
    channels = g.nvls_exec_channels
    chunk = nvls_chunk_bytes(n_bytes, channels * g.nvls.n_channels)
    return n_bytes / channels * (1.0 / chunk - 1.0 / NVLS_CHUNK_BYTES) * NVLS_CHUNK_OVERHEAD_S


@lru_cache(maxsize=4096)
def execution_layout(layout: CommLayout) -> CommLayout:
    """``layout`` at the newest release: the model that prices what an older release picked (module docstring).

    Graph differences of older releases (NVLink per-link bandwidth, speed ladders, ``MAXCHANNELS``)
    therefore reach the selection only.
    """
    if layout.nccl_version == DEFAULT_NCCL_VERSION:
        return layout
    return replace(layout, nccl_version=DEFAULT_NCCL_VERSION)


def exec_time_s(coll: Coll, layout: CommLayout, a: Algo, p: Proto, n_bytes: float) -> float:
    """Predicted time of one (a, p) collective of ``n_bytes`` on ``layout``, seconds.

    ``coll`` is the collective; ``a, p`` an entry available to NCCL on ``layout``; ``n_bytes`` NCCL's byte
    count (total buffer for AllGather/ReduceScatter). The time is priced on :func:`execution_layout`.

    ``NCCL time with the calibrated bandwidth`` + ``pipeline fill`` (module docstring). The bandwidth
    term keeps all channels' bandwidth when NCCL runs fewer (:func:`run_channels`): a channel is not
    limited to its share of the links, and measured small messages do not slow down as channels drop
    (rccl-tests MI300X, one process per GPU: 13.7-14.6 us flat from 1 KiB to 128 KiB, where a per-channel
    share would give 16-28 us).
    """
    layout = execution_layout(layout)
    model = cost_model(coll, layout)
    eff = bw_efficiency(layout, a) * nvls_allreduce_factor(coll, layout, a)
    t = nccl_time_s(model, layout, a, p, n_bytes, bw_scale=eff)
    t += pipeline_fill_s(model, layout, a, p, n_bytes, model.algbw_Bps[a, p] * eff)
    if a in (Algo.NVLS, Algo.NVLS_TREE):
        t += nvls_chunk_overhead_s(model, n_bytes)
    return t
