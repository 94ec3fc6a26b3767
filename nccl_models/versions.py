"""NCCL releases the model knows, and what changed in the cost model between them.

The model follows NCCL's ``src/graph/tuning.cc`` as it was in the release that ran (``CommLayout.nccl_version``,
default :data:`DEFAULT_NCCL_VERSION`). Sources, by release:

* v2.30.7 and v2.18.3: source code (research notes ``shared/research/nccl-model.md`` sections 1.2-1.6).
* The releases in between: the tables and literals compiled into NCCL's own release builds
  (``libnccl.so.2`` of the ``nvidia-nccl-cu12`` wheels 2.18.3, 2.19.3, 2.20.5, 2.21.5, 2.22.3, 2.23.4, 2.25.1,
  2.26.2, 2.27.3, 2.28.9, 2.29.7, 2.30.7). The tables (``baseLat``, ``hwLat``, ``llMaxBws``, ``perChMax*Bws``,
  ``ncclTunerConstantsDefaults``, ``nvlsEfficiency``) are named symbols there and were read as they are; a
  change of formula was dated by the floating-point literals ``ncclTopoTuneModel`` loads (e.g. the Ring/LL
  factors 1/4 and 1/3 are loaded up to 2.20.5 and no longer from 2.21.5). A change is assigned to the first
  minor release of the first build that shows it (2.24 was not read: changes seen first in 2.25.1 are put at
  2.25). Each switch below names the builds it rests on.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from flowsim.errors import ConfigError

DEFAULT_NCCL_VERSION = "2.30.7"
"""The release modelled when none is given (the research notes' source snapshot)."""

OLDEST_SUPPORTED = (2, 18)
NEWEST_SUPPORTED = (2, 30)
SUPPORTED_RANGE = "2.18 to 2.30"

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+.][0-9A-Za-z.+-]*)?\s*$")

# Behaviour switches: (major, minor) of the first release with the newer behaviour.
RING_LL_HALF_SINCE = (2, 21)
"""Ring/LL busBw factor 0.5 (earlier 1/4 on several nodes and for AllReduce/Reduce, else 1/3): the 0.25 and
1/3 literals are in ``ncclTopoTuneModel`` of 2.18.3-2.20.5 and gone from 2.21.5; v2.30.7 tuning.cc has 0.5."""
RING_LL128_FLAT_SINCE = (2, 23)
"""Ring/LL128 factor 0.92 for any ppn (earlier 0.7 when ppn < 2): 2.18.3-2.22.3 select 0.7 or 0.92 on
``ppn < 2`` (v2.18.3 tuning.cc; the 0.7 literal is gone from 2.23.4)."""
RING_INTER_STEPS_SINCE = (2, 23)
"""Ring AllReduce crosses the network ``2(nNodes-1)`` times (earlier ``2 nNodes``, v2.18.3 tuning.cc): the
2.18.3-2.21.5 builds compute ``2 * nNodes`` there, 2.23.4 computes ``2 * (nNodes - 1)`` [read from the
compiled code; 2.22 assumed as 2.21]."""
NVLS_EFFICIENCY_SINCE = (2, 28)
"""NVLS bandwidth from ``nvlsEfficiency`` (v2.30.7 tuning.cc); earlier the NVLS busBw -> algBw ratio was 5/6
(v2.18.3 tuning.cc): the 5/6 literal is in 2.18.3-2.27.3, ``nvlsEfficiency`` appears in 2.28.9."""
NVLS_TREE_RATIO_5_6_SINCE = (2, 19)
"""NVLSTree busBw -> algBw ratio 5/6 like NVLS (2.19-2.27); v2.18.3 used ``0.70 nNodes / (2 (nNodes - 1))``
(research section 1.6). 2.19.3 loads the 0.7 literal once (Ring/LL128) where 2.18.3 loads it twice
[the 5/6 ratio for NVLSTree in 2.19-2.27 is inferred from the single 5/6 literal]."""
PAT_SINCE = (2, 23)
"""PAT exists from 2.23 (research section 1.6; its 2.8 us and 3.5 literals appear in 2.23.4)."""
NVLINK_SM90_20_6_SINCE = (2, 20)
"""NCCL prices one SM90 NVLink at 20.6 GB/s from 2.20, 20.0 before (topo.h; research section 1.2)."""
BLACKWELL_SINCE = (2, 25)
"""First release with Blackwell (SM100) rows in the tables (2.25.1; absent from 2.23.4). Earlier releases
index SM >= 90 as Hopper."""
NVLINK_SM100_40_1_SINCE = (2, 28)
"""NCCL prices one SM100 NVLink at 40.1 GB/s from 2.28, 40.0 in 2.25-2.27 (topo.h; research section 1.2)."""
MAX_CHANNELS_64_SINCE = (2, 25)
"""``MAXCHANNELS`` is 64 from 2.25, 32 before (device.h; research section 1.2)."""


@dataclass(frozen=True, order=True)
class NcclVersion:
    """An NCCL release, ``major.minor.patch``.

    Attributes
    ----------
    major, minor, patch : int
        Release numbers; ``patch`` is 0 when the text gave none.
    """

    major: int
    minor: int
    patch: int = 0

    def at_least(self, since: tuple[int, int]) -> bool:
        """True when this release is ``since`` (major, minor) or newer."""
        return (self.major, self.minor) >= since

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@lru_cache(maxsize=256)
def parse_nccl_version(text: str) -> NcclVersion:
    """Read an NCCL release from ``"2.19"``, ``"2.19.3"``, ``"v2.18.5-1"`` or ``"2.18.5+cuda12.2"``.

    Parameters
    ----------
    text : str
        The release; anything after ``major.minor[.patch]`` (build tags) is ignored.

    Returns
    -------
    NcclVersion

    Raises
    ------
    ConfigError
        ``nccl_version``: not a version, or outside the supported range (2.18 to 2.30).
    """
    m = _VERSION.match(str(text))
    if not m:
        raise ConfigError("nccl_version", f"must be an NCCL release such as 2.19.3 (supported {SUPPORTED_RANGE})",
                          text)
    version = NcclVersion(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    if not OLDEST_SUPPORTED <= (version.major, version.minor) <= NEWEST_SUPPORTED:
        raise ConfigError("nccl_version", f"must be a release from {SUPPORTED_RANGE}", text)
    return version


def version_from_code(code: int) -> str:
    """NCCL's integer version ``code`` (``NCCL_VERSION_CODE``, e.g. 21903) as ``"2.19.3"``.

    NCCL >= 2.9 encodes ``major * 10000 + minor * 100 + patch`` (nccl.h ``NCCL_VERSION``).
    """
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
