"""Predicted against measured step times: the per-row comparison, the error summary figures and the report of
:func:`flowsim.validation.runs.validate_runs`."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd



@dataclass(frozen=True)
class RunComparison:
    """Predicted against measured step time for one row of a runs CSV.

    Attributes
    ----------
    id : int
        Row id (the CSV's ``id`` column).
    source : str
        Source key of the row (``source`` column).
    model : str
        Model name as the source gives it.
    gpu : str
        GPU key.
    num_gpus : int
        GPUs in the job.
    tp, pp, dp, cp : int
        Parallel layout as simulated.
    predicted_step_time_s : float
        flowsim's step time, seconds per optimizer step.
    measured_step_time_s : float
        Published step time, seconds per optimizer step.
    error_pct : float
        Signed error ``(predicted - measured) / measured * 100``; positive = flowsim is slower.
    fits_memory : bool
        Whether flowsim's memory estimate fits the GPU (a run that does not fit is still compared).
    assumptions : tuple[str, ...]
        Each empty cell that was filled with a default, as ``"<column>: <what was assumed>"``.
    family : str
        Layout family: ``dense`` (TP/PP/CP/DP with all-reduce or the distributed optimizer), ``dense-fsdp``
        (ZeRO-2/3, FSDP) or ``moe``.
    predicted_memory_gib : float
        flowsim's peak memory held by PyTorch's caching allocator on the most loaded GPU, GiB (2**30 bytes):
        :attr:`flowsim.step.memory.StageMemory.allocated_bytes`, without the CUDA context.
    measured_memory_gib : float
        The peak memory per GPU the row's notes state, GiB (:func:`~flowsim.validation.runs_mapping.
        measured_peak_memory_gib`; torchtitan's ``max_memory_reserved``); NaN when they state none.
    memory_error_pct : float
        ``(predicted - measured) / measured * 100`` of the two above; NaN without a measured peak.
    """

    id: int
    source: str
    model: str
    gpu: str
    num_gpus: int
    tp: int
    pp: int
    dp: int
    cp: int
    predicted_step_time_s: float
    measured_step_time_s: float
    error_pct: float
    fits_memory: bool
    assumptions: tuple = ()
    family: str = "dense"
    predicted_memory_gib: float = math.nan
    measured_memory_gib: float = math.nan
    memory_error_pct: float = math.nan

    @property
    def layout(self) -> str:
        """The parallel layout as ``tp/pp/dp/cp``."""
        return f"{self.tp}/{self.pp}/{self.dp}/{self.cp}"


@dataclass(frozen=True)
class ErrorSummary:
    """Summary of the signed errors of a set of rows.

    Attributes
    ----------
    n : int
        Rows compared.
    median_abs_error_pct : float
        Median of ``|error_pct|``.
    mape_pct : float
        Mean of ``|error_pct|`` (mean absolute percentage error).
    p90_abs_error_pct : float
        90th percentile of ``|error_pct|`` (linear interpolation between order statistics, numpy's
        default).
    spearman : float
        Spearman rank correlation of predicted and measured step times (:func:`spearman`);
        NaN for fewer than two rows or when either set of times is constant.
    """

    n: int
    median_abs_error_pct: float
    mape_pct: float
    p90_abs_error_pct: float
    spearman: float


@dataclass(frozen=True)
class MemorySummary:
    """Predicted against measured peak memory of the rows whose notes state a measured peak, and the fit check.

    Attributes
    ----------
    n : int
        Rows with a measured peak.
    median_abs_error_pct, max_abs_error_pct : float
        Median and largest ``|memory_error_pct|`` (NaN when ``n`` is 0).
    median_error_pct : float
        Median signed ``memory_error_pct``: negative = flowsim's allocated bytes below the measured peak (a
        measured ``max_memory_reserved`` also holds the caching allocator's unused cached blocks).
    not_fitting : int
        Simulated rows flowsim predicts do not fit in the GPU's memory; every row of a runs CSV ran, so each
        is a miss unless settings the row does not state (recompute, offloading) explain it.
    """

    n: int
    median_abs_error_pct: float
    median_error_pct: float
    max_abs_error_pct: float
    not_fitting: int = 0


def one_nan(x: float) -> float:
    """``x``, or :data:`math.nan` itself when ``x`` is NaN: equal reports then compare equal (a dataclass compares
    its fields as a tuple, which tries identity before ``==``, and NaN != NaN)."""
    return math.nan if x != x else x


def summarize_memory(rows) -> MemorySummary:
    """The :class:`MemorySummary` of :class:`RunComparison` rows."""
    errors = np.array([r.memory_error_pct for r in rows if not math.isnan(r.memory_error_pct)], dtype=float)
    not_fitting = sum(not r.fits_memory for r in rows)
    if not len(errors):
        return MemorySummary(0, math.nan, math.nan, math.nan, not_fitting)
    return MemorySummary(len(errors), float(np.median(np.abs(errors))), float(np.median(errors)),
                         float(np.max(np.abs(errors))), not_fitting)


@dataclass(frozen=True)
class ValidationReport:
    """The outcome of :func:`validate_runs`.

    Attributes
    ----------
    rows : tuple[RunComparison, ...]
        Every simulated row, in file order.
    summary : ErrorSummary
        Figures over all simulated rows.
    by_family : dict[str, ErrorSummary]
        Summary per layout family (see :class:`RunComparison`).
    by_source : dict[str, ErrorSummary]
        The same figures per ``source`` key, in order of first appearance.
    skipped : tuple[SkippedRun, ...]
        Every row that was not simulated, with the reason: malformed lines first, then the others in file
        order.
    memory : MemorySummary or None
        Predicted against measured peak memory (rows whose notes state one) and the rows predicted not to fit.
    """

    rows: tuple
    summary: ErrorSummary
    by_source: dict = field(default_factory=dict)
    by_family: dict = field(default_factory=dict)
    skipped: tuple = ()
    memory: MemorySummary | None = None

    def to_dict(self) -> dict:
        """The stable JSON view (what ``flowsim validate --json`` prints).

        Keys: ``rows`` (each with ``id``, ``predicted_step_time_s``, ``measured_step_time_s``,
        ``error_pct`` and the other :class:`RunComparison` fields), ``summary`` (``n``,
        ``median_abs_error_pct``, ``mape_pct``, ``p90_abs_error_pct``, ``spearman``), ``skipped``
        (each with ``id`` and ``reason``), and ``memory`` (:class:`MemorySummary`'s fields) where some row states
        a measured peak; rows carry ``predicted_memory_gib``, ``measured_memory_gib`` and ``memory_error_pct``.
        """
        rows = [{**vars(r), "assumptions": list(r.assumptions)} for r in self.rows]  # flat fields: no asdict
        out = {
            "rows": rows,
            "summary": asdict(self.summary),
            "skipped": [asdict(s) for s in self.skipped],
        }
        if self.memory is not None and self.memory.n:
            out["memory"] = asdict(self.memory)
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per simulated run, indexed by id, with the :class:`RunComparison` fields as columns."""
        columns = [f for f in RunComparison.__dataclass_fields__]
        return pd.DataFrame([vars(r) for r in self.rows], columns=columns).set_index("id")

    def __repr__(self) -> str:
        s = self.summary
        return (f"ValidationReport(n={s.n}, skipped={len(self.skipped)}, "
                f"median_abs_error_pct={s.median_abs_error_pct:.3g}, mape_pct={s.mape_pct:.3g}, "
                f"p90_abs_error_pct={s.p90_abs_error_pct:.3g}, spearman={s.spearman:.3g})")


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x``, ties given the mean of the ranks they span (``scipy.stats.rankdata``'s default)."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # rank of the last of each group of equal values
    return ((last - (counts - 1) / 2.0))[inverse]


def spearman(a, b) -> float:
    """Spearman rank correlation: the Pearson correlation of the average ranks (``scipy.stats.spearmanr``'s
    statistic, without importing scipy.stats, which takes over a second); needs two or more values in each, not
    all equal."""
    return float(np.corrcoef(_average_ranks(np.asarray(a)), _average_ranks(np.asarray(b)))[0, 1])


def summarize(predicted_s, measured_s) -> ErrorSummary:
    """Error figures of predicted against measured step times.

    Parameters
    ----------
    predicted_s, measured_s : array_like of float, shape (n,)
        Step times in seconds; ``measured_s`` > 0.

    Returns
    -------
    ErrorSummary
        ``n``, median / mean / 90th percentile of ``|(predicted - measured) / measured| * 100`` and the
        Spearman rank correlation (NaN figures when ``n`` is 0; NaN Spearman when ``n`` < 2 or either
        input is constant, where the rank correlation is undefined).
    """
    predicted_s = np.asarray(predicted_s, dtype=float)
    measured_s = np.asarray(measured_s, dtype=float)
    n = len(measured_s)
    if n == 0:
        return ErrorSummary(0, math.nan, math.nan, math.nan, math.nan)
    abs_err = np.abs((predicted_s - measured_s) / measured_s * 100.0)
    defined = n >= 2 and np.ptp(predicted_s) > 0 and np.ptp(measured_s) > 0
    rho = spearman(predicted_s, measured_s) if defined else math.nan
    return ErrorSummary(n=n, median_abs_error_pct=float(np.median(abs_err)), mape_pct=float(np.mean(abs_err)),
                        p90_abs_error_pct=float(np.percentile(abs_err, 90)), spearman=rho)
