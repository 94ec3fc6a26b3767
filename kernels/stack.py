"""The software stack a job runs on: its release, the GPU's power limit, a calibrated GEMM multiplier and whether
its GEMMs run under sustained load.

Kernel efficiency depends on the software that runs the kernels (CUDA, cuBLAS, Transformer Engine, the
framework's container) as much as on the GPU. Every measured GEMM row names the stack it was measured on
(table ``software_releases``: one row per release with its date and software family), and a job names its
own release (config key ``software_release``, the runs schema v2 ``framework_version``). The GEMM ceiling of
a job is then the measurement of the nearest older release on the reference GPU (the nearest newer one when
none is older), with a :class:`~flowsim.errors.FlowsimWarning` whenever it is not the job's own release
(:func:`flowsim.kernels.gemm.gemm_ceiling`).

``software_releases`` columns: ``release`` (key, lower case: framework releases as the runs schema v2 writes
them, and the benchmark stacks the kernel tables were measured on), ``date`` (``YYYY-MM``), ``family``
(software family that calibration parameters are keyed on; ``benchmark`` for a kernel-benchmark stack),
``stack`` (what the release contains), ``attention`` (the attention library it calls: ``te`` = Transformer
Engine, ``fa2`` = FlashAttention-2 or PyTorch SDPA's flash backend; :func:`attention_kernel`), ``source``.

A software family groups releases by the code path their GEMMs and fused kernels take, which is what sets the
sustained GEMM rate a calibration parameter stands for: ``megatron-2021`` (Megatron-LM 2021 and its DeepSpeed
fork, Apex kernels), ``megatron-core-2024`` (Megatron-core with Transformer Engine 1.x: NeMo 24.x, core_r0.8,
MLPerf v3.1), ``megatron-bridge-2025`` (Megatron-Bridge and NeMo 25.x, TE 2.x), ``pytorch-native`` (GEMMs
through ATen's cuBLAS calls, PyTorch FSDP1/FSDP2, FlashAttention or SDPA, no Transformer Engine: llm-foundry,
fms-fsdp, torchtitan), ``hai-llm`` (DeepSeek's in-house stack) and ``benchmark`` (kernel benchmarks).

Attention kernel of a release on a GPU generation (:func:`attention_kernel`): Transformer Engine runs cuDNN
fused attention on Blackwell, where FlashAttention-2's SM80 code path reaches only 0.15 of the peak (Azure
GB200, 374 TFLOP/s, table ``flash_attention``) and FlashAttention-3 does not run. On Hopper TE chose between
FlashAttention-2 and cuDNN depending on its version (later releases prefer cuDNN: "Disabling FlashAttention to
give FusedAttention preference on Hopper+", TE ``get_attention_backend``, recalled); flowsim prices TE on
Hopper with FlashAttention-2, which the measured steps support: the H100 long-sequence runs (NeMo 24.03, 90 %
of the modelled time in attention) are within 2 % with FA2's tables and 8-11 % too fast with cuDNN's forward,
and cuDNN on Hopper raises both the in-sample and the leave-one-source-out error of ``flowsim calibrate``
(docs/CALIBRATION.md). FlashAttention-2 and SDPA run FA2 everywhere.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from flowsim.errors import ConfigError
from flowsim.kernels.tables import DATA_DIR, read_measurement_csv

RELEASES_FILE = "software_releases.csv"
ATTENTION_LIBRARIES = ("te", "fa2")
"""Values of the ``attention`` column (module docstring)."""
TE_CUDNN_ARCHS = ("blackwell",)
"""GPU generations on which flowsim prices Transformer Engine's attention with cuDNN (module docstring)."""
_DATE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")


@dataclass(frozen=True)
class Release:
    """One row of ``software_releases``: ``key``, ``date`` (``YYYY-MM``), ``family``, ``stack``, ``attention``,
    ``source``."""

    key: str
    date: str
    family: str
    stack: str
    attention: str
    source: str


@functools.lru_cache(maxsize=None)
def releases() -> dict:
    """The ``software_releases`` table: release key -> :class:`Release`, in file order (cached; read-only).

    Raises
    ------
    ConfigError
        A row without a source, a date not in ``YYYY-MM`` form, or a key listed twice.
    """
    out = {}
    for r in read_measurement_csv(DATA_DIR / RELEASES_FILE).rows():
        key = r["release"]
        if not _DATE.match(str(r["date"])):
            raise ConfigError(f"{RELEASES_FILE}: date", "must be YYYY-MM", f"{r['date']!r} for {key}")
        if r["attention"] not in ATTENTION_LIBRARIES:
            raise ConfigError(f"{RELEASES_FILE}: attention", f"must be one of {', '.join(ATTENTION_LIBRARIES)}",
                              f"{r['attention']!r} for {key}")
        if key in out:
            raise ConfigError(f"{RELEASES_FILE}: release", "listed twice", key)
        out[key] = Release(key, r["date"], r["family"], r["stack"], r["attention"], r["source"])
    return out


def release(key: str) -> Release:
    """The release ``key`` (case and surrounding blanks ignored).

    Raises
    ------
    ConfigError
        ``software_release: unknown release; known: ...`` for a key not in the table.
    """
    t = releases()
    k = str(key).strip().lower()
    if k not in t:
        known = ", ".join(r.key for r in t.values() if r.family != "benchmark")
        raise ConfigError("software_release", f"unknown release; known: {known}", key)
    return t[k]


def attention_kernel(release_key: str, arch: str) -> str:
    """The attention implementation (:data:`flowsim.kernels.attention.IMPLS`) that release ``release_key`` runs
    on GPU generation ``arch``: ``cudnn`` for Transformer Engine on Blackwell, ``fa2`` otherwise (module
    docstring); ``""`` for no release (the default stack)."""
    if not release_key:
        return ""
    return "cudnn" if release(release_key).attention == "te" and arch in TE_CUDNN_ARCHS else "fa2"


@dataclass(frozen=True)
class KernelStack:
    """What the kernels of one job run on, beyond the GPU datasheet.

    Attributes
    ----------
    release : str
        Software release key (table ``software_releases``); ``""`` prices every op with the newest
        measurement of each table (the default stack).
    power_limit_w : float
        Board power limit in W; 0 uses the GPU spec's own limit (``GPUSpec.power_limit_w``, the board power
        when the spec sets none). Compute ceilings are derated below the measured GPU's board power
        (:mod:`flowsim.kernels.power`).
    gemm_scale : float
        Calibrated sustained-GEMM multiplier on the GEMM compute ceiling (a calibration profile's
        ``gemm_fraction`` for this GPU generation and software family; 1 = uncalibrated), > 0.
    attention_impl : str
        Attention implementation the job's kernels run (``fa2``, ``fa3``, ``cudnn``: :func:`attention_kernel`
        of the release and GPU generation); ``""`` = ``fa2``.
    sustained : bool
        The GEMMs run under continuous load (a training step): a ceiling measured in a short burst is derated
        to the clock the GPU sustains at its power limit (:mod:`flowsim.kernels.sustained`). False (the
        default) prices a kernel as the benchmarks measured it.
    """

    release: str = ""
    power_limit_w: float = 0.0
    gemm_scale: float = 1.0
    attention_impl: str = ""
    sustained: bool = False

    def __post_init__(self):
        if self.release:
            object.__setattr__(self, "release", release(self.release).key)
        if not (isinstance(self.power_limit_w, (int, float)) and math.isfinite(self.power_limit_w)
                and self.power_limit_w >= 0):
            raise ConfigError("power_limit_w", "must be a number of watts >= 0 (0 = the GPU's own)",
                              self.power_limit_w)
        if not (isinstance(self.gemm_scale, (int, float)) and math.isfinite(self.gemm_scale)
                and self.gemm_scale > 0):
            raise ConfigError("gemm_scale", "must be a number > 0", self.gemm_scale)
        if not isinstance(self.sustained, bool):
            raise ConfigError("sustained", "must be true or false", self.sustained)

    @property
    def family(self) -> str:
        """Software family of the release (``""`` for the default stack)."""
        return release(self.release).family if self.release else ""


DEFAULT_STACK = KernelStack()
"""The stack of the shipped tables' newest rows, at the GPU's own power limit, uncalibrated, priced as
benchmarked (no sustained-load derate)."""
