"""NCCL v2.30.7 cost-model constants, as data.

Every table here is copied from NCCL v2.30.7 (commit 5067397c): ``src/graph/tuning.cc``
(``ncclTunerConstantsDefaults``, ``treeCorrectionFactor``), ``src/graph/search.cc`` (speed ladders),
``src/graph/topo.h`` (link bandwidths) and ``src/enqueue.cc`` / ``src/init.cc`` (chunking). NCCL writes
latencies in microseconds and bandwidths in GB/s (1e9 bytes/s); the tables below keep NCCL's numbers
(so they can be checked against the source line by line) and are converted to SI units (seconds,
bytes/s) once, at import, into the ``*_s`` / ``*_Bps`` arrays that the model uses.

Tables are indexed by the IntEnums :class:`Algo`, :class:`Proto`, :class:`Hw` and :class:`Arch`.
"""
from __future__ import annotations

from enum import IntEnum

import numpy as np

from flowsim.units import GB, KiB, MiB, US


class Algo(IntEnum):
    """NCCL algorithms, in NCCL's index order (src/include/device.h ``NCCL_ALGO_*``)."""

    TREE = 0
    RING = 1
    COLLNET_DIRECT = 2
    COLLNET_CHAIN = 3
    NVLS = 4
    NVLS_TREE = 5
    PAT = 6


class Proto(IntEnum):
    """NCCL protocols (src/include/device.h ``NCCL_PROTO_*``)."""

    LL = 0
    LL128 = 1
    SIMPLE = 2


class Hw(IntEnum):
    """Hardware classes of NCCL's latency table (tuning.cc ``NCCL_HW_*``)."""

    NVLINK = 0
    PCI = 1
    NET = 2


class Arch(IntEnum):
    """Compute-capability classes (tuning.cc ``compCapIndex``)."""

    VOLTA = 0  # SM < 80
    AMPERE = 1  # 80 <= SM < 90
    HOPPER = 2  # 90 <= SM < 100
    BLACKWELL = 3  # SM >= 100


class Coll(IntEnum):
    """Collectives priced by NCCL's tuning table (src/include/nccl_common.h ``ncclFunc*``)."""

    BROADCAST = 0
    REDUCE = 1
    ALLGATHER = 2
    REDUCESCATTER = 3
    ALLREDUCE = 4


# Names as NCCL_ALGO / NCCL_PROTO spell them (src/graph/tuning.cc ``ncclAlgoStr``, ``ncclProtoStr``).
ALGO_NAMES = {Algo.TREE: "Tree", Algo.RING: "Ring", Algo.COLLNET_DIRECT: "CollNetDirect",
              Algo.COLLNET_CHAIN: "CollNetChain", Algo.NVLS: "NVLS", Algo.NVLS_TREE: "NVLSTree",
              Algo.PAT: "PAT"}
PROTO_NAMES = {Proto.LL: "LL", Proto.LL128: "LL128", Proto.SIMPLE: "Simple"}


def arch_of(compute_capability: int) -> Arch:
    """NCCL's ``compCapIndex`` for a compute capability x10 (tuning.cc)."""
    if compute_capability >= 100:
        return Arch.BLACKWELL
    if compute_capability >= 90:
        return Arch.HOPPER
    if compute_capability >= 80:
        return Arch.AMPERE
    return Arch.VOLTA


# ---------------------------------------------------------------------------------------------
# Latencies, microseconds (tuning.cc ncclTunerConstantsDefaults: baseLat, hwLat)
# rows: Algo (Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT); cols: Proto (LL, LL128, Simple)
_BASE_LAT_US = np.array([
    [6.8, 14.0, 8.4],   # Tree
    [6.6, 14.0, 8.4],   # Ring
    [0.0, 0.0, 0.0],    # CollNetDirect
    [0.0, 0.0, 0.0],    # CollNetChain
    [0.0, 0.0, 0.0],    # NVLS
    [0.0, 0.0, 0.0],    # NVLSTree
    [8.0, 8.0, 8.0],    # PAT
])
# [Hw][Algo][Proto], microseconds
_HW_LAT_US = np.array([
    [  # NVLINK
        [0.6, 1.25, 4.0], [0.6, 1.9, 3.4], [0.0, 0.0, 3.7], [0.0, 0.0, 2.8],
        [0.0, 0.0, 25.0], [0.0, 0.0, 25.0], [0.0, 0.0, 4.0]],
    [  # PCI
        [1.0, 1.9, 4.0], [1.0, 2.5, 5.7], [0.0, 0.0, 3.7], [0.0, 0.0, 2.8],
        [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 4.0]],
    [  # NET
        [5.0, 8.5, 14.0], [2.7, 4.0, 14.0], [0.0, 0.0, 31.0], [0.0, 0.0, 30.0],
        [0.0, 0.0, 18.0], [0.0, 0.0, 20.9], [0.0, 0.0, 14.0]],
])
BASE_LAT_S = _BASE_LAT_US * US
"""Base latency per (Algo, Proto), seconds."""
HW_LAT_S = _HW_LAT_US * US
"""Per-hop latency per (Hw, Algo, Proto), seconds."""

# ---------------------------------------------------------------------------------------------
# Bandwidth caps, GB/s (tuning.cc ncclTunerConstantsDefaults)
# llMaxBws[index1][index2]; index1 = Arch when nNodes == 1, else CPU row (0 Intel/other, 1 AMD);
# index2 = N1 / N2 / N4+ (nNodes == 1, == 2, > 2)
_LL_MAX_GBPS = np.array([
    [39.0, 39.0, 20.4],
    [87.7, 22.5, 19.0],
    [141.0, 45.0, 35.0],
    [282.0, 90.0, 70.0],
])
# [Arch][N1, N2, N4+]
_PER_CH_MAX_RING_LL128_GBPS = np.array([[20.0] * 3, [20.0] * 3, [36.7] * 3, [40.0] * 3])
_PER_CH_MAX_TREE_LL128_GBPS = np.array([[20.0] * 3, [20.0] * 3, [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]])
_PER_CH_MAX_TREE_GBPS = np.array([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]])
_PER_CH_MAX_NVLS_TREE_GBPS = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]])
LL_MAX_BPS = _LL_MAX_GBPS * GB
"""LL protocol bandwidth cap, bytes/s, [row][N1/N2/N4+] (``llMaxBws``)."""
PER_CH_MAX_RING_LL128_BPS = _PER_CH_MAX_RING_LL128_GBPS * GB
"""Per-channel Ring/LL128 cap, bytes/s, [Arch][N1/N2/N4+] (``perChMaxRingLL128Bws``)."""
PER_CH_MAX_TREE_LL128_BPS = _PER_CH_MAX_TREE_LL128_GBPS * GB
"""Per-channel Tree/LL128 cap, bytes/s, [Arch][N1/N2/N4+] (``perChMaxTreeLL128Bws``)."""
PER_CH_MAX_TREE_BPS = _PER_CH_MAX_TREE_GBPS * GB
"""Per-channel Tree cap, bytes/s, [Arch][N1/N2/N4+] (``perChMaxTreeBws``)."""
PER_CH_MAX_NVLS_TREE_BPS = _PER_CH_MAX_NVLS_TREE_GBPS * GB
"""Per-channel NVLSTree cap, bytes/s, [Arch][N1/N2/N4+] (``perChMaxNVLSTreeBws``)."""

NVLS_EFFICIENCY = np.array([0.0, 0.0, 0.85, 0.74])
"""NVLS intra-node efficiency per Arch (tuning.cc ``nvlsEfficiency``), dimensionless."""

# Network overhead per step, microseconds (tuning.cc ``NCCL_NET_OVERHEAD`` defaults): x86 Intel 1.0,
# x86 AMD 2.0, other 1.0; multiplied by SIMPLE_NET_OVERHEAD_FACTOR for Simple.
NET_OVERHEAD_S = {"intel": 1.0 * US, "amd": 2.0 * US, "arm": 1.0 * US}
SIMPLE_NET_OVERHEAD_FACTOR = 3.0  # NCCL 2.30.7 tuning.cc (netOverhead * 3 for Simple)

# Model refinements (tuning.cc ncclTopoTuneModel); "empirical, NCCL" where upstream gives no reason.
LL_BW_FACTOR = 0.5  # NCCL 2.30.7 tuning.cc: LL moves 8 B of data per 16 B line
RING_LL128_BW_FACTOR = 0.92  # NCCL 2.30.7 tuning.cc (empirical, NCCL; comment says 120/128)
TREE_AR_BW_FACTOR = 0.92  # NCCL 2.30.7 tuning.cc, Tree AllReduce all protocols (empirical, NCCL)
TREE_LL_BW_DIVISOR = 3.8  # NCCL 2.30.7 tuning.cc, Tree LL: busBw / 3.8 (empirical, NCCL)
TREE_LL128_BW_FACTOR_N1 = 7.0 / 9.0  # NCCL 2.30.7 tuning.cc, Tree LL128 on one node
TREE_LL128_BW_FACTOR_MULTI = 120.0 / 128.0  # NCCL 2.30.7 tuning.cc, Tree LL128 on several nodes
PAT_BW_FACTOR = 0.75  # NCCL 2.30.7 tuning.cc (empirical, NCCL)
PAT_INTER_LAT_DIVISOR = 3.5  # NCCL 2.30.7 tuning.cc: log2i(nNodes) * interLat / 3.5
PAT_PER_RANK_LAT_S = 2.8 * US  # NCCL 2.30.7 tuning.cc: + nRanks * 2.8 us
TREE_RATIO = 0.5  # NCCL 2.30.7 tuning.cc: busBw -> algBw ratio for Tree and CollNet
RING_PLATEAU_LAT_FACTOR_PRE_AMPERE = 1.9  # NCCL 2.30.7 tuning.cc "plateau effect of ring" (SM < 80)
RING_PLATEAU_LAT_FACTOR = 1.4  # NCCL 2.30.7 tuning.cc "plateau effect of ring" (SM >= 80)
RING_PLATEAU_MIN_BYTES = 64  # NCCL 2.30.7 tuning.cc: nBytes / (nChannels * nRanks) >= 64

# treeCorrectionFactor[proto][log2i(nBytes >> 6)], sizes 64 B .. 512 MiB (tuning.cc)
TREE_CORRECTION = np.array([
    [1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1, 1],  # LL
    [1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1, 1],  # LL128
    [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9],  # Simple
])
TREE_CORRECTION_AR_MAX_LOG = 23  # NCCL 2.30.7 tuning.cc: Tree AllReduce uses logSize < 23
TREE_CORRECTION_NVLS_TREE_MAX_LOG = 24  # NCCL 2.30.7 tuning.cc: NVLSTree (SM100, x86) uses logSize < 24

# ---------------------------------------------------------------------------------------------
# Topology bandwidths used by the graph search (src/graph/topo.h), GB/s
# NVLink per link by compute capability: SM60 18, SM70 20, SM80 20, SM86 12, SM90 20.6, SM100 40.1
_NVLINK_LINK_GBPS = {60: 18.0, 70: 20.0, 80: 20.0, 86: 12.0, 90: 20.6, 100: 40.1}


def nvlink_link_Bps(compute_capability: int) -> float:
    """NCCL's bandwidth of one NVLink link for a compute capability, bytes/s (topo.h ``ncclTopoNVLinkBw``)."""
    if compute_capability in _NVLINK_LINK_GBPS:
        return _NVLINK_LINK_GBPS[compute_capability] * GB
    known = [cc for cc in sorted(_NVLINK_LINK_GBPS) if cc <= compute_capability and cc != 86]
    return _NVLINK_LINK_GBPS[known[-1] if known else 60] * GB


PCIE_NCCL_FRACTION = 0.75
"""NCCL's PCIe bandwidth over the nominal one (topo.cc: width * {Gen3 60, Gen4 120, Gen5 240, Gen6 480} / 80
gives 12 / 24 / 48 / 96 GB/s for x16, against nominal 16 / 32 / 64 / 128 GB/s per direction: 3/4 for all)."""

# Search speed ladders, GB/s per channel (search.cc speedArrayIntra/Inter, sm90*, sm100*)
SPEED_INTRA_GBPS = {
    Arch.VOLTA: (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3),
    Arch.AMPERE: (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3),
    Arch.HOPPER: (60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3),
    Arch.BLACKWELL: (90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18),
}
SPEED_INTER_GBPS = {
    Arch.VOLTA: (48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12),
    Arch.AMPERE: (48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12),
    Arch.HOPPER: (48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12),
    Arch.BLACKWELL: (96, 86, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12),
}
DUP_MIN_BW_INTRA_GBPS = 25.0  # NCCL 2.30.7 search.cc ncclTopoDupChannels: no dup if bwIntra < 25
DUP_SM90_MAX_BW_INTRA_GBPS = 50.0  # search.cc: no dup if SM > 80 and bwIntra < 50 and nChannels > 4
DUP_SM90_MAX_CHANNELS = 4
RING_GRAPH_MAX_CHANNELS = 32  # NCCL 2.30.7 search.cc: MAXCHANNELS / 2 for the ring graph
MAX_CHANNELS = 64  # NCCL 2.30.7 device.h MAXCHANNELS (since 2.25)
SM90_MULTINODE_EXTRA_DUP_BW_GBPS = 45.0  # NCCL 2.30.7 connect.cc ncclTopoPostset: SM90 multi-node
SM90_MULTINODE_EXTRA_DUP_MAX_CHANNELS = 16  # ... with bwIntra > 45 and < 16 channels doubles again
NVLS_MIN_CHANNELS = 2  # NCCL 2.30.7 tuning.cc: NVLS needs >= 2 NVLS graph channels
NVLS_MAX_HEADS = 16  # [inferred, unvalidated above 8] cap on NVLS heads; NCCL 2.30.7 nvls.cc caps NVLS
#                      channels at 16 on Hopper ("NVLS should not need more than 16 channels"); same number used
NVLS_CHANNELS_SM90 = 16  # NCCL 2.30.7 nvls.cc: NVLS execution channels on Hopper
NVLS_CHANNELS_SM100_SINGLE_NODE = 24  # NCCL 2.30.7 nvls.cc: Blackwell, one NVLink domain
NVLS_CHANNELS_SM100_MULTI_NODE = 32  # NCCL 2.30.7 nvls.cc: Blackwell, several nodes
COLLNET_MAX_LOCAL_RANKS = 8  # NCCL 2.30.7 tuning.cc: CollNet needs <= 8 local ranks
LL128_MIN_CC = 70  # NCCL 2.30.7 tuning.cc: LL128 disabled below SM70

# ---------------------------------------------------------------------------------------------
# Chunking (enqueue.cc calcCollChunking, init.cc buffer sizes); NCCL_STEPS = 8
NCCL_STEPS = 8  # NCCL 2.30.7 src/include/device.h
SIMPLE_STEP_BYTES = 4 * MiB // NCCL_STEPS  # 4 MiB Simple buffer / 8 steps = 512 KiB
LL_STEP_DATA_BYTES = 32 * KiB  # LL buffer 512 KiB / 8 steps = 64 KiB lines, half flags -> 32 KiB data
LL128_STEP_DATA_BYTES = 614400 * 15 // 16  # LL128 step 614,400 B, payload 120/128 = 15/16
RING_CHUNK_STEPS = 4  # NCCL 2.30.7 collectives.h ALLREDUCE_CHUNKSTEPS (also AG/RS)
RING_SLICE_STEPS = 2  # NCCL 2.30.7 collectives.h ALLREDUCE_SLICESTEPS
BCAST_CHUNK_STEPS = 1  # NCCL 2.30.7 collectives.h BROADCAST_CHUNKSTEPS (and REDUCE_CHUNKSTEPS); 1 slice
NVLS_CHUNK_BYTES = 128 * KiB  # NCCL 2.30.7 NCCL_NVLS_CHUNKSIZE default
