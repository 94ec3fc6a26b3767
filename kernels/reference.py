"""Cross-GPU prediction: which measured GPU stands in for a GPU without its own measurement.

Rule (DESIGN.md, kernels layer): the GPU's own rows if it has any; otherwise the most similar measured GPU of
the same architecture family, then of the same vendor, then any. "Most similar" is the smallest
``|log(figure / figure_ref)|`` of the figure that sets the op's speed (peak FLOP/s of the dtype for
compute-bound tables, HBM bandwidth for the stream table); ties go to the closest board power
(``|log(tdp / tdp_ref)|``, since power limits sustained clocks: A100 SXM 400 W vs PCIe 300 W run the same peak at
271 vs 253 TFLOP/s), then to the alphabetically first key.
Times are then scaled by the figure's ratio (the model divides by the target's own peak or bandwidth).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from flowsim.errors import FlowsimWarning
from flowsim.gpu_specs import GPUSpec, is_builtin


@dataclass(frozen=True)
class Candidate:
    """A measured device: ``name`` (flowsim key, or device name), its family, the similarity figure and power.

    ``tdp_w`` is the board power in W (NaN when unknown: then it does not break ties).
    """

    name: str
    arch: str
    vendor: str
    figure: float
    tdp_w: float = math.nan

    @classmethod
    def of_gpu(cls, gpu: GPUSpec, figure: float) -> "Candidate":
        """A built-in GPU as a candidate, with ``figure`` (its peak FLOP/s or bandwidth) and its board power."""
        return cls(gpu.key, gpu.arch, gpu.vendor, figure, gpu.tdp_w)


@dataclass(frozen=True)
class Reference:
    """The measured GPU used to price one kind of op on a target GPU.

    Attributes
    ----------
    target : str
        Key of the GPU being priced.
    table : str
        Measurement table (``gemm_mamf``, ``gemm_latency``, ``flash_attention``, ``hbm_stream``,
        ``memory_latency``).
    dtype : str
        Measurement dtype looked up (``bf16``/``fp8`` for GEMMs, ``fp16`` for attention, ``-`` for latencies and
        memory).
    measured : str
        The measured device used.
    rule : str
        ``own measurement``, ``same architecture (<arch>)``, ``same vendor (<vendor>)`` or ``any GPU``.
    """

    target: str
    table: str
    dtype: str
    measured: str
    rule: str


def choose_reference(gpu, figure: float, candidates: list[Candidate], table: str, dtype: str) -> Reference:
    """Pick the measured device for ``gpu`` among ``candidates`` (rule in the module docstring).

    Parameters
    ----------
    gpu : GPUSpec
        Target GPU (only ``key``, ``arch`` and ``vendor`` are read, so a :class:`Candidate`-like record of an
        unlisted device works too).
    figure : float
        The target's similarity figure (FLOP/s or bytes/s, > 0).
    candidates : list of Candidate
        Measured devices (non-empty).
    table, dtype : str
        Recorded in the result.

    Returns
    -------
    Reference
    """
    own = [c for c in candidates if c.name == gpu.key]
    if own:
        return Reference(gpu.key, table, dtype, gpu.key, "own measurement")
    for rule, group in (
        (f"same architecture ({gpu.arch})", [c for c in candidates if c.arch == gpu.arch]),
        (f"same vendor ({gpu.vendor})", [c for c in candidates if c.vendor == gpu.vendor]),
        ("any GPU", candidates),
    ):
        if group:
            best = min(group, key=lambda c: (abs(math.log(figure / c.figure)), _power_distance(gpu, c), c.name))
            return Reference(gpu.key, table, dtype, best.name, rule)
    raise AssertionError("choose_reference needs at least one candidate")


def _power_distance(gpu, cand: Candidate) -> float:
    tdp = getattr(gpu, "tdp_w", math.nan)
    return abs(math.log(tdp / cand.tdp_w)) if tdp > 0 and cand.tdp_w > 0 else math.inf  # NaN compares False


def warn_if_scaled(gpu: GPUSpec, refs: list[Reference], stacklevel: int = 3) -> None:
    """Issue one FlowsimWarning when a user-supplied GPU (not a built-in record) is priced from other GPUs, or when
    a built-in GPU's GEMMs are priced from another architecture's measurements (V100, L40S, RTX 4090 today).

    Parameters
    ----------
    gpu : GPUSpec
        The target GPU.
    refs : list of Reference
        The references used.
    stacklevel : int
        Passed to :func:`warnings.warn` (the default points at the caller of the caller).
    """
    scaled = [r for r in refs if r.rule != "own measurement"]
    if scaled and not is_builtin(gpu):
        used = "; ".join(f"{r.table} {r.dtype} from {r.measured} ({r.rule})" for r in scaled)
        msg = f"gpu {gpu.key}: no own kernel measurements, scaled: {used}"
        warnings.warn(msg, FlowsimWarning, stacklevel=stacklevel)
        return
    # a built-in GPU whose GEMMs only another architecture's measurements price (Volta, Ada from Ampere)
    across = [r for r in scaled if r.table == "gemm_mamf" and r.rule.startswith("same vendor")]
    if across:
        used = "; ".join(f"{r.dtype} from {r.measured}" for r in across)
        warnings.warn(f"gpu {gpu.key}: no GEMM measurement of its architecture ({gpu.arch}); efficiencies "
                      f"transferred across architectures ({used}), expect larger errors", FlowsimWarning,
                      stacklevel=stacklevel)
