"""The typed GPU datasheet record."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet figures, in SI units.

    Attributes
    ----------
    key : str
        Normalised key, e.g. ``"h100-sxm"`` (the keys of the runs schema v1).
    name : str
        Human-readable product name.
    vendor : str
        ``"nvidia"`` or ``"amd"``.
    arch : str
        Architecture family: ``volta``, ``ampere``, ``ada``, ``hopper``, ``blackwell``, ``cdna3``, ``cdna4``.
    compute_capability : int
        CUDA compute capability times ten (70, 80, 89, 90, 100, 103); for AMD the gfx major*10+minor
        (94 for MI300X, 95 for MI355X). NCCL's cost model keys its tables on this number.
    peak_flop_per_s : dict[str, float]
        Dense (no sparsity) tensor-core peak per dtype in FLOP/s: keys among fp64, fp32, tf32, fp16, bf16,
        fp8, fp4. A dtype the GPU cannot run is absent.
    hbm_bytes : float
        Device memory capacity in bytes (decimal GB as the datasheet gives it).
    hbm_Bps : float
        Peak device-memory bandwidth in bytes/s.
    sm_count : int
        Streaming multiprocessors (NVIDIA) or compute units (AMD).
    clock_hz : float
        Boost clock used for the peak figures, in Hz; NaN when not published.
    l2_bytes : float
        Last-level on-chip cache in bytes (binary MiB as vendors quote cache "MB"); NaN when not published.
    scaleup_kind : str
        ``nvswitch`` (all GPUs of the scale-up domain through NVSwitches), ``nvlink_mesh`` (direct NVLinks
        between some peers, e.g. the DGX-1 hybrid cube-mesh), ``nvlink_bridge`` (pairs),
        ``xgmi_mesh`` (direct links to every peer), ``pcie`` (no scale-up fabric).
    scaleup_Bps : float
        Scale-up bandwidth per GPU per direction in bytes/s (0 for ``pcie``).
    scaleup_links : int
        Number of scale-up links per GPU (NVLink links, or xGMI peer links).
    nvls : bool
        NVLink SHARP (switch-side reduction) available (NVSwitch gen3+, SM90+).
    pcie_Bps : float
        Host PCIe bandwidth per direction in bytes/s.
    tdp_w : float
        Board power in watts.
    sources : tuple[str, ...]
        Where the figures come from.
    notes : str
        Caveats.
    power_limit_w : float
        Board power limit in watts where the part runs below its board design power (e.g. 500 W Grand Teton
        H100s); NaN when not set (the part runs at its own board power). Compute ceilings measured at a higher
        board power are derated to it (:mod:`flowsim.kernels.power`).
    """

    key: str
    name: str
    vendor: str
    arch: str
    compute_capability: int
    peak_flop_per_s: dict = field(hash=False)
    hbm_bytes: float
    hbm_Bps: float
    sm_count: int
    clock_hz: float
    l2_bytes: float
    scaleup_kind: str
    scaleup_Bps: float
    scaleup_links: int
    nvls: bool
    pcie_Bps: float
    tdp_w: float
    sources: tuple
    notes: str = ""
    power_limit_w: float = math.nan

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; raises ConfigError when the GPU has no such unit."""
        from flowsim.errors import ConfigError

        try:
            return self.peak_flop_per_s[dtype]
        except KeyError:
            raise ConfigError("precision", f"{self.key} has no {dtype} peak in its spec", dtype) from None
