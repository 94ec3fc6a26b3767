"""NCCL cost-model constants, as data, per NCCL release.

The tables are NCCL v2.30.7's (commit 5067397c): ``src/graph/tuning.cc`` (``ncclTunerConstantsDefaults``,
``treeCorrectionFactor``), ``src/graph/search.cc`` (speed ladders), ``src/graph/topo.h`` (link bandwidths)
and ``src/enqueue.cc`` / ``src/init.cc`` (chunking), with the values of older releases (2.18-2.29) where
they differ, each marked with the release builds it was read from (:mod:`flowsim.nccl_models.versions`).
NCCL writes latencies in microseconds and bandwidths in GB/s (1e9 bytes/s); the tables below keep NCCL's
numbers (so they can be checked against the source line by line) and are converted to SI units (seconds,
bytes/s) once, at import, into the ``*_s`` / ``*_Bps`` arrays that the model uses.

Tables are indexed by the IntEnums :class:`Algo`, :class:`Proto`, :class:`Hw` and :class:`Arch`.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from flowsim.nccl_models.versions import (
    BLACKWELL_SINCE, MAX_CHANNELS_64_SINCE, NVLINK_SM90_20_6_SINCE, NVLINK_SM100_40_1_SINCE, NcclVersion,
)
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


def arch_of(compute_capability: int, version: NcclVersion | None = None) -> Arch:
    """NCCL's ``compCapIndex`` for a compute capability x10 (tuning.cc).

    Releases before 2.25 have no Blackwell rows and index SM >= 90 as Hopper (``BLACKWELL_SINCE``);
    ``version`` None means the newest release.
    """
    if compute_capability >= 100 and (version is None or version.at_least(BLACKWELL_SINCE)):
        return Arch.BLACKWELL
    if compute_capability >= 90:
        return Arch.HOPPER
    if compute_capability >= 80:
        return Arch.AMPERE
    return Arch.VOLTA


# ---------------------------------------------------------------------------------------------
# Latency and bandwidth-cap tables, per family of NCCL releases (see versions.py for how each was read).
# Latencies in microseconds: baseLat [Algo][Proto], hwLat [Hw][Algo][Proto]; Algo rows Tree, Ring,
# CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT; Proto columns LL, LL128, Simple.
# Caps in GB/s: llMaxBws[row][N1/N2/N4+] (row = Arch when nNodes == 1, else CPU: 0 Intel/other, 1 AMD);
# perChMax*Bws[Arch][N1/N2/N4+] (N1 / N2 / N4+: nNodes == 1, == 2, > 2).

# NCCL v2.30.7 tuning.cc ncclTunerConstantsDefaults (identical in the 2.28.9 and 2.29.7 builds but for the
# Blackwell cells edited below).
_BASE_LAT_US_2_30 = np.array([
    [6.8, 14.0, 8.4],   # Tree
    [6.6, 14.0, 8.4],   # Ring
    [0.0, 0.0, 0.0],    # CollNetDirect
    [0.0, 0.0, 0.0],    # CollNetChain
    [0.0, 0.0, 0.0],    # NVLS
    [0.0, 0.0, 0.0],    # NVLSTree
    [8.0, 8.0, 8.0],    # PAT
])
_HW_LAT_US_2_30 = np.array([
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
_LL_MAX_GBPS_2_30 = np.array([
    [39.0, 39.0, 20.4],
    [87.7, 22.5, 19.0],
    [141.0, 45.0, 35.0],
    [282.0, 90.0, 70.0],
])
_PER_CH_MAX_RING_LL128_GBPS_2_30 = np.array([[20.0] * 3, [20.0] * 3, [36.7] * 3, [40.0] * 3])
_PER_CH_MAX_TREE_LL128_GBPS_2_30 = np.array([[20.0] * 3, [20.0] * 3, [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]])
_PER_CH_MAX_TREE_GBPS_2_30 = np.array([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0],
                                       [70.0, 42.8, 24.0]])
_PER_CH_MAX_NVLS_TREE_GBPS_2_30 = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]])

# Short index names for the edits below
_T, _CND, _CNC, _NVLS, _NVLST, _PAT = (Algo.TREE, Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN, Algo.NVLS, Algo.NVLS_TREE,
                                       Algo.PAT)
_NVL, _PCI, _NET = Hw.NVLINK, Hw.PCI, Hw.NET
_LL, _LL128, _SIMPLE = Proto.LL, Proto.LL128, Proto.SIMPLE


def _edited(table: np.ndarray, edits: dict) -> np.ndarray:
    """A copy of ``table`` with ``{index: value}`` set (the differences of an older release)."""
    out = table.copy()
    for index, value in edits.items():
        out[index] = value
    return out


# 2.23-2.27 builds (2.23.4, 2.25.1, 2.26.2, 2.27.3 ``baseLat``/``hwLat``): PAT's row is zero (its latency
# is computed in code, see tuning.py), NVLSTree NET 14.
_BASE_LAT_US_2_23 = _edited(_BASE_LAT_US_2_30, {_PAT: 0.0})
_HW_LAT_US_2_23 = _edited(_HW_LAT_US_2_30, {(_NVL, _PAT, _SIMPLE): 0.0, (_PCI, _PAT, _SIMPLE): 0.0,
                                            (_NET, _PAT, _SIMPLE): 0.0, (_NET, _NVLST, _SIMPLE): 14.0})
# 2.21-2.22 builds (2.21.5, 2.22.3): Tree/Simple baseLat 0 and hwLat 28 on every hardware class.
_BASE_LAT_US_2_21 = _edited(_BASE_LAT_US_2_23, {(_T, _SIMPLE): 0.0})
_HW_LAT_US_2_21 = _edited(_HW_LAT_US_2_23, {(_NVL, _T, _SIMPLE): 28.0, (_PCI, _T, _SIMPLE): 28.0,
                                            (_NET, _T, _SIMPLE): 28.0})
# 2.19-2.20 builds (2.19.3, 2.20.5): NVLS and NVLSTree NVLink latency 23 us (25 from 2.21.5).
_HW_LAT_US_2_19 = _edited(_HW_LAT_US_2_21, {(_NVL, _NVLS, _SIMPLE): 23.0, (_NVL, _NVLST, _SIMPLE): 23.0})
# 2.18 (v2.18.3 tuning.cc, research section 1.6; the 2.18.3 build agrees): NVLS/NVLSTree baseLat 23 and
# no NVLink hwLat; CollNet baseLat as Tree, hwLat NVLINK 8.0 / 4.75, PCI 8 / 8, NET 10.7 / 14; Tree/Simple
# hwLat NVLINK 4, PCI 6, NET 14; NVLSTree NET 19.
_BASE_LAT_US_2_18 = _edited(_BASE_LAT_US_2_21, {(_CND, _LL): 6.8, (_CND, _LL128): 14.0, (_CNC, _LL): 6.8,
                                                (_CNC, _LL128): 14.0, (_NVLS, _SIMPLE): 23.0,
                                                (_NVLST, _SIMPLE): 23.0})
_HW_LAT_US_2_18 = _edited(_HW_LAT_US_2_19, {
    (_NVL, _T, _SIMPLE): 4.0, (_NVL, _CND, _SIMPLE): 8.0, (_NVL, _CNC, _SIMPLE): 4.75,
    (_NVL, _NVLS, _SIMPLE): 0.0, (_NVL, _NVLST, _SIMPLE): 0.0,
    (_PCI, _T, _SIMPLE): 6.0, (_PCI, _CND, _SIMPLE): 8.0, (_PCI, _CNC, _SIMPLE): 8.0,
    (_NET, _T, _SIMPLE): 14.0, (_NET, _CND, _SIMPLE): 10.7, (_NET, _CNC, _SIMPLE): 14.0,
    (_NET, _NVLST, _SIMPLE): 19.0})

# llMaxBws: Hopper row {87.7, 22.5, 19.0} (same as Ampere) up to the 2.20.5 build, {141, 45, 35} from 2.21.5
# (research section 1.6 for 2.18.3). Blackwell rows exist from 2.25.1; earlier releases index SM >= 90 as
# Hopper, so the Blackwell rows of the older tables below are never read.
_LL_MAX_GBPS_2_18 = _edited(_LL_MAX_GBPS_2_30, {2: [87.7, 22.5, 19.0]})
# Blackwell caps of the 2.25.1-2.27.3 builds; the 2.28.9 build has Ring/LL128 {73.4, 34.6, 73.4} and
# NVLSTree N4+ 43.8, 2.29.7 Ring/LL128 {40, 40, 40} and NVLSTree N4+ 43.8, 2.30.7 the v2.30.7 table above.
_PER_CH_MAX_RING_LL128_GBPS_2_25 = _edited(_PER_CH_MAX_RING_LL128_GBPS_2_30, {3: [73.4, 73.4, 73.4]})
_PER_CH_MAX_TREE_LL128_GBPS_2_25 = _edited(_PER_CH_MAX_TREE_LL128_GBPS_2_30, {3: [73.4, 73.4, 58.0]})
_PER_CH_MAX_TREE_GBPS_2_25 = _edited(_PER_CH_MAX_TREE_GBPS_2_30, {3: [77.4, 82.8, 72.0]})
_PER_CH_MAX_RING_LL128_GBPS_2_28 = _edited(_PER_CH_MAX_RING_LL128_GBPS_2_30, {3: [73.4, 34.6, 73.4]})
_PER_CH_MAX_NVLS_TREE_GBPS_2_28 = _edited(_PER_CH_MAX_NVLS_TREE_GBPS_2_30, {(3, 2): 43.8})


@dataclass(frozen=True)
class TuningTables:
    """NCCL's latency and bandwidth-cap tables for one family of releases, SI units.

    Attributes
    ----------
    base_lat_s : float64[7, 3]
        ``baseLat`` per (Algo, Proto), seconds.
    hw_lat_s : float64[3, 7, 3]
        ``hwLat`` per (Hw, Algo, Proto), seconds.
    ll_max_Bps : float64[4, 3]
        ``llMaxBws`` [row][N1/N2/N4+], bytes/s.
    per_ch_max_ring_ll128_Bps, per_ch_max_tree_ll128_Bps, per_ch_max_tree_Bps : float64[4, 3]
        ``perChMaxRingLL128Bws``, ``perChMaxTreeLL128Bws``, ``perChMaxTreeBws`` [Arch][N1/N2/N4+], bytes/s.
    per_ch_max_nvls_tree_Bps : float64[4, 3] or None
        ``perChMaxNVLSTreeBws`` [Arch][N1/N2/N4+], bytes/s; None before 2.28 (no such cap).
    """

    base_lat_s: np.ndarray
    hw_lat_s: np.ndarray
    ll_max_Bps: np.ndarray
    per_ch_max_ring_ll128_Bps: np.ndarray
    per_ch_max_tree_ll128_Bps: np.ndarray
    per_ch_max_tree_Bps: np.ndarray
    per_ch_max_nvls_tree_Bps: np.ndarray | None


def _tables(base_us, hw_us, ll_gbps, ring_ll128_gbps, tree_ll128_gbps, tree_gbps, nvls_tree_gbps) -> TuningTables:
    """Convert NCCL's units (us, GB/s) to SI, read-only."""
    arrays = [base_us * US, hw_us * US, ll_gbps * GB, ring_ll128_gbps * GB, tree_ll128_gbps * GB, tree_gbps * GB,
              None if nvls_tree_gbps is None else nvls_tree_gbps * GB]
    for a in arrays:
        if a is not None:
            a.setflags(write=False)
    return TuningTables(*arrays)


_CAPS_2_25 = (_LL_MAX_GBPS_2_30, _PER_CH_MAX_RING_LL128_GBPS_2_25, _PER_CH_MAX_TREE_LL128_GBPS_2_25,
              _PER_CH_MAX_TREE_GBPS_2_25, None)
_CAPS_2_21 = _CAPS_2_25  # Blackwell rows unread before 2.25 (see BLACKWELL_SINCE)
_CAPS_2_18 = (_LL_MAX_GBPS_2_18,) + _CAPS_2_25[1:]
TUNING_TABLES = (  # (first release (major, minor), tables), oldest first
    ((2, 18), _tables(_BASE_LAT_US_2_18, _HW_LAT_US_2_18, *_CAPS_2_18)),
    ((2, 19), _tables(_BASE_LAT_US_2_21, _HW_LAT_US_2_19, *_CAPS_2_18)),
    ((2, 21), _tables(_BASE_LAT_US_2_21, _HW_LAT_US_2_21, *_CAPS_2_21)),
    ((2, 23), _tables(_BASE_LAT_US_2_23, _HW_LAT_US_2_23, *_CAPS_2_21)),
    ((2, 25), _tables(_BASE_LAT_US_2_23, _HW_LAT_US_2_23, *_CAPS_2_25)),
    ((2, 28), _tables(_BASE_LAT_US_2_30, _HW_LAT_US_2_30, _LL_MAX_GBPS_2_30, _PER_CH_MAX_RING_LL128_GBPS_2_28,
                      _PER_CH_MAX_TREE_LL128_GBPS_2_30, _PER_CH_MAX_TREE_GBPS_2_30, _PER_CH_MAX_NVLS_TREE_GBPS_2_28)),
    ((2, 29), _tables(_BASE_LAT_US_2_30, _HW_LAT_US_2_30, _LL_MAX_GBPS_2_30, _PER_CH_MAX_RING_LL128_GBPS_2_30,
                      _PER_CH_MAX_TREE_LL128_GBPS_2_30, _PER_CH_MAX_TREE_GBPS_2_30, _PER_CH_MAX_NVLS_TREE_GBPS_2_28)),
    ((2, 30), _tables(_BASE_LAT_US_2_30, _HW_LAT_US_2_30, _LL_MAX_GBPS_2_30, _PER_CH_MAX_RING_LL128_GBPS_2_30,
                      _PER_CH_MAX_TREE_LL128_GBPS_2_30, _PER_CH_MAX_TREE_GBPS_2_30, _PER_CH_MAX_NVLS_TREE_GBPS_2_30)),
)


def tuning_tables(version: NcclVersion) -> TuningTables:
    """The tables of the newest family that is not newer than ``version``."""
    return [t for since, t in TUNING_TABLES if version.at_least(since)][-1]

NVLS_EFFICIENCY = np.array([0.0, 0.0, 0.85, 0.74])
"""NVLS intra-node efficiency per Arch (tuning.cc ``nvlsEfficiency``; 2.28.9-2.30.7 builds), dimensionless;
releases before 2.28 use NVLS_RATIO instead (``NVLS_EFFICIENCY_SINCE``)."""
NVLS_RATIO = 5.0 / 6.0
"""NVLS / NVLSTree busBw -> algBw ratio before 2.28 (v2.18.3 tuning.cc; literal in the 2.18.3-2.27.3 builds)."""
NVLS_TREE_RATIO_2_18 = 0.70
"""NVLSTree busBw -> algBw ratio in 2.18 is ``0.70 nNodes / (2 (nNodes - 1))`` (v2.18.3 tuning.cc)."""

# Network overhead per step, microseconds (tuning.cc ``NCCL_NET_OVERHEAD`` defaults): x86 Intel 1.0,
# x86 AMD 2.0, other 1.0; multiplied by SIMPLE_NET_OVERHEAD_FACTOR for Simple.
NET_OVERHEAD_S = {"intel": 1.0 * US, "amd": 2.0 * US, "arm": 1.0 * US}
SIMPLE_NET_OVERHEAD_FACTOR = 3.0  # NCCL 2.30.7 tuning.cc (netOverhead * 3 for Simple)

# Model refinements (tuning.cc ncclTopoTuneModel); "empirical, NCCL" where upstream gives no reason.
LL_BW_FACTOR = 0.5  # NCCL 2.30.7 tuning.cc: LL moves 8 B of data per 16 B line (Ring/LL from 2.21)
RING_LL_FACTOR_OLD_MULTI = 1.0 / 4.0  # v2.18.3 tuning.cc, Ring/LL < 2.21: several nodes, AllReduce, Reduce
RING_LL_FACTOR_OLD = 1.0 / 3.0  # v2.18.3 tuning.cc, Ring/LL < 2.21: otherwise
RING_LL128_BW_FACTOR = 0.92  # NCCL 2.30.7 tuning.cc (empirical, NCCL; comment says 120/128)
RING_LL128_LOW_PPN_FACTOR = 0.7  # v2.18.3 tuning.cc, Ring/LL128 < 2.23 with ppn < 2
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

# treeCorrectionFactor[proto][log2i(nBytes >> 6)], sizes 64 B .. 512 MiB (tuning.cc); the 2.18.3-2.28.9
# builds hold the same first 23 entries per protocol (the only ones Tree AllReduce reads).
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
# (v2.30.7); SM90 20.0 before 2.20, SM100 40.0 in 2.25-2.27 (research section 1.2).
_NVLINK_LINK_GBPS = {60: 18.0, 70: 20.0, 80: 20.0, 86: 12.0, 90: 20.6, 100: 40.1}
_SM90_NVLINK_GBPS_BEFORE_2_20 = 20.0
_SM100_NVLINK_GBPS_BEFORE_2_28 = 40.0


def nvlink_link_Bps(compute_capability: int, version: NcclVersion | None = None) -> float:
    """NCCL's bandwidth of one NVLink link for a compute capability, bytes/s (topo.h ``ncclTopoNVLinkBw``).

    ``version`` None means the newest release. Releases without Blackwell price SM >= 100 as SM90.
    """
    cc = compute_capability
    if cc not in _NVLINK_LINK_GBPS:
        known = [k for k in sorted(_NVLINK_LINK_GBPS) if k <= cc and k != 86]
        cc = known[-1] if known else 60
    if version is not None and cc >= 100 and not version.at_least(BLACKWELL_SINCE):
        cc = 90
    gbps = _NVLINK_LINK_GBPS[cc]
    if version is not None and cc == 90 and not version.at_least(NVLINK_SM90_20_6_SINCE):
        gbps = _SM90_NVLINK_GBPS_BEFORE_2_20
    if version is not None and cc == 100 and not version.at_least(NVLINK_SM100_40_1_SINCE):
        gbps = _SM100_NVLINK_GBPS_BEFORE_2_28
    return gbps * GB


PCIE_NCCL_FRACTION = 0.75
"""NCCL's PCIe bandwidth over the nominal one (topo.cc: width * {Gen3 60, Gen4 120, Gen5 240, Gen6 480} / 80
gives 12 / 24 / 48 / 96 GB/s for x16, against nominal 16 / 32 / 64 / 128 GB/s per direction: 3/4 for all)."""

# Search speed ladders, GB/s per channel (search.cc speedArrayIntra/Inter, sm90*, sm100*): the v2.30.7 ones,
# then the older SM90 / SM100 ladders as the release builds hold them (same pre-SM90 ladders in all builds).
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
_OLDER_SPEED_GBPS = {  # (Arch, "intra" | "inter") -> ((last release (major, minor) with it, ladder), ...)
    (Arch.HOPPER, "intra"): (((2, 18), (60, 40, 30, 24, 20, 15, 12, 6, 3)),   # 2.18.3 build
                             ((2, 22), (60, 50, 40, 30, 24, 20, 15, 12, 6, 3))),  # 2.19.3, 2.20.5 builds
    (Arch.HOPPER, "inter"): (((2, 18), (48, 45, 42, 40, 30, 24, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12)),),
    (Arch.BLACKWELL, "intra"): (((2, 28), (90, 80, 70, 60, 50, 40, 30, 24, 20, 19, 18)),),  # 2.27.3, 2.28.9 [a]
    (Arch.BLACKWELL, "inter"): (  # 2.25.1-2.27.3 builds [a]; 2.28.9; 2.29.7
        ((2, 27), (48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12)),
        ((2, 28), (96, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12)),
        ((2, 29), (96, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12))),
}
# [a] 2.25.1 has no 18 in the intra ladder and 2.27.3 has 47.9 for 48 in the inter ladder; not modelled.


def speed_ladder_gbps(arch: Arch, kind: str, version: NcclVersion) -> tuple:
    """Per-channel speeds (GB/s) the graph search tries, highest first, for ``kind`` "intra" or "inter"."""
    for last, ladder in _OLDER_SPEED_GBPS.get((arch, kind), ()):
        if not version.at_least((last[0], last[1] + 1)):
            return ladder
    return (SPEED_INTRA_GBPS if kind == "intra" else SPEED_INTER_GBPS)[arch]


DUP_MIN_BW_INTRA_GBPS = 25.0  # NCCL 2.30.7 search.cc ncclTopoDupChannels: no dup if bwIntra < 25
DUP_SM90_MAX_BW_INTRA_GBPS = 50.0  # search.cc: no dup if SM > 80 and bwIntra < 50 and nChannels > 4
DUP_SM90_MAX_CHANNELS = 4
MAX_CHANNELS = 64  # NCCL 2.30.7 device.h MAXCHANNELS (since 2.25)
MAX_CHANNELS_BEFORE_2_25 = 32  # device.h MAXCHANNELS before 2.25 (research section 1.2)


def max_channels(version: NcclVersion) -> int:
    """``MAXCHANNELS`` of a release; the ring graph may use half of it (search.cc)."""
    return MAX_CHANNELS if version.at_least(MAX_CHANNELS_64_SINCE) else MAX_CHANNELS_BEFORE_2_25
SM90_MULTINODE_EXTRA_DUP_BW_GBPS = 45.0  # NCCL 2.30.7 connect.cc ncclTopoPostset: SM90 multi-node
SM90_MULTINODE_EXTRA_DUP_MAX_CHANNELS = 16  # ... with bwIntra > 45 and < 16 channels doubles again
NVLS_MIN_CHANNELS = 2  # NCCL 2.30.7 tuning.cc: NVLS needs >= 2 NVLS graph channels
NVLS_MAX_HEADS = 16  # [inferred, unvalidated above 8] cap on NVLS heads; NCCL 2.30.7 nvls.cc caps NVLS
#                      channels at 16 on Hopper ("NVLS should not need more than 16 channels"); same number used
NVLS_CHANNELS_SM90 = 16  # NCCL 2.30.7 nvls.cc: NVLS execution channels on Hopper
NVLS_CHANNELS_SM100_SINGLE_NODE = 24  # NCCL 2.30.7 nvls.cc: Blackwell, one NVLink domain
NVLS_CHANNELS_SM100_MULTI_NODE = 32  # NCCL 2.30.7 nvls.cc: Blackwell, several nodes
COLLNET_MAX_LOCAL_RANKS = 8  # NCCL 2.30.7 tuning.cc: CollNet needs <= 8 local ranks
COLLNET_ARITY_LAT_S = 0.4 * US  # NCCL 2.30.7 tuning.cc: CollNetDirect "0.4 us arity serialization latency" per rank
COLLNET_DIRECT_SM90_FACTOR = 0.85  # NCCL 2.30.7 tuning.cc: CollNetDirect Simple AllReduce busBw *= .85 on SM >= 90
LL128_MIN_CC = 70  # NCCL 2.30.7 tuning.cc: LL128 disabled below SM70

# ---------------------------------------------------------------------------------------------
# Channels and threads for small messages (enqueue.cc topoGetAlgoInfo; tuning.cc maxThreads and
# threadThresholds; the same rule in v2.18.3 enqueue.cc getAlgoInfo): Ring and Tree drop channels while
# nBytes < channels x threads x threshold. Threads per channel (device.h NCCL_*_MAX_NTHREADS):
LL_MAX_THREADS = 512  # NCCL_LL_MAX_NTHREADS
LL128_MAX_THREADS = 640  # NCCL_LL128_MAX_NTHREADS
SIMPLE_MAX_THREADS = 512  # NCCL_SIMPLE_MAX_NTHREADS (Ring/Simple default)
SIMPLE_PCI_THREADS = 256  # tuning.cc: Ring/Simple when ring bwIntra x nChannels <= PCI_BW (12 GB/s)
PCI_BW_GBPS = 12.0  # topo.h PCI_BW
TREE_SIMPLE_THREADS = 640  # tuning.cc: Tree/Simple uses NCCL_MAX_NTHREADS
# Bytes per thread below which a channel is dropped (tuning.cc NCCL_*_THREAD_THRESHOLD); Ring/LL x nRanks.
THREAD_THRESHOLD_BYTES = {Proto.LL: 8, Proto.LL128: 8, Proto.SIMPLE: 64}

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
