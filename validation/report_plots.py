"""PNG plots of the accuracy report (matplotlib, imported here only; install the ``plot`` extra).

Each function draws from the same result objects the report's tables and the CLI commands use.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from flowsim.units import GB, US

DPI = 110
"""Resolution of the PNGs, dots per inch."""
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
           "tab:olive", "tab:cyan")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` as PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _identity(ax, lo: float, hi: float) -> None:
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="y = x")
    ax.plot([lo, hi], [lo * 1.2, hi * 1.2], "k:", lw=0.8, label="+/- 20 %")
    ax.plot([lo, hi], [lo / 1.2, hi / 1.2], "k:", lw=0.8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)


def step_time_scatter(runs, path: Path) -> Path:
    """Predicted vs measured step time of every run, log axes, y = x line; one colour per GPU."""
    plt = _plt()
    df = runs.to_frame()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for color, (gpu, g) in zip(_COLORS * 3, df.groupby("gpu")):
        ax.scatter(g.measured_step_time_s, g.predicted_step_time_s, s=18, color=color, label=gpu, alpha=0.8)
    both = np.concatenate([df.measured_step_time_s, df.predicted_step_time_s])
    _identity(ax, both.min() / 1.5, both.max() * 1.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("flowsim step time (s)")
    ax.set_title(f"Training step time, {len(df)} published runs")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.2)
    return _save(plt, fig, path)


def error_by_gpus(runs, path: Path) -> Path:
    """Signed step-time error against the job's GPU count (log axis)."""
    plt = _plt()
    df = runs.to_frame()
    fig, ax = plt.subplots(figsize=(7, 5))
    for color, (gpu, g) in zip(_COLORS * 3, df.groupby("gpu")):
        ax.scatter(g.num_gpus, g.error_pct, s=18, color=color, label=gpu, alpha=0.8)
    ax.axhline(0, color="k", lw=1)
    ax.axhspan(-20, 20, color="0.9", zorder=0)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("error (%), (predicted - measured) / measured")
    ax.set_title("Step-time error by scale (grey band: +/- 20 %)")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    ax.grid(True, alpha=0.2)
    return _save(plt, fig, path)


def nccl_busbw(nccl, path: Path) -> Path:
    """Measured and predicted busbw against size, one panel per nccl-tests comparison."""
    plt = _plt()
    n = len(nccl)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.7 * rows), squeeze=False)
    for ax, (d, c) in zip(axes.flat, nccl):
        r = c.rows
        ax.plot(r.size_bytes, r.measured_busbw_Bps / GB, "o-", ms=3, label="measured")
        ax.plot(r.size_bytes, r.predicted_busbw_Bps / GB, "s--", ms=3, label="flowsim")
        ax.set_xscale("log", base=2)
        where = d.cluster if d.option("gpu") is None else f"{d.option('gpu')} on {d.cluster}"
        name = "\n".join(textwrap.wrap(f"{d.file} [{d.section}]", 44, break_on_hyphens=False))
        ax.set_title(f"{name}\n{r.op.iloc[0] if len(r) else ''}, {where}", fontsize=6)
        ax.tick_params(labelsize=6)
        ax.grid(True, alpha=0.2)
    for ax in axes.flat[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.supxlabel("size (bytes, nccl-tests convention)", fontsize=8)
    fig.supylabel("busbw (GB/s)", fontsize=8)
    return _save(plt, fig, path)


def trace_kernels(traces, path: Path) -> Path:
    """Predicted vs measured time of every priced op in each trace, log axes; excluded collectives hollow."""
    plt = _plt()
    n = len(traces)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4.2), squeeze=False)
    markers = {"gemm": "o", "attention": "^", "memory": ".", "collective": "D"}
    for ax, t in zip(axes.flat, traces):
        ops = t.ops
        if ops.empty:
            ax.set_title(f"{t.trace[:36]}\n(nothing priced)", fontsize=8)
            continue
        for color, (kind, g) in zip(_COLORS, ops.groupby("kind")):
            counted = g[g.status.isin(("compute", "transfer"))]
            excluded = g[~g.status.isin(("compute", "transfer"))]
            ax.scatter(counted.measured_s / US, counted.predicted_s / US, s=14, marker=markers.get(kind, "o"),
                       color=color, label=kind, alpha=0.7)
            if len(excluded):
                ax.scatter(excluded.measured_s / US, excluded.predicted_s / US, s=22, marker="D",
                           facecolors="none", edgecolors=color, label=f"{kind} (waiting/overlapped)")
        both = np.concatenate([ops.measured_s, ops.predicted_s]) / US
        _identity(ax, max(both.min() / 1.5, 1e-2), both.max() * 1.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{t.trace[:40]} ({t.gpu})", fontsize=8)
        ax.set_xlabel("measured (us)", fontsize=8)
        ax.legend(fontsize=6)
        ax.grid(True, which="both", alpha=0.2)
    axes.flat[0].set_ylabel("flowsim (us)", fontsize=8)
    return _save(plt, fig, path)


def write_plots(report, img_dir: Path) -> list[Path]:
    """Every plot of ``report`` that has data, as PNG files in ``img_dir``."""
    out = []
    if report.runs and report.runs.rows:
        out.append(step_time_scatter(report.runs, img_dir / "step_time_scatter.png"))
        out.append(error_by_gpus(report.runs, img_dir / "step_time_error_by_gpus.png"))
    if report.nccl:
        out.append(nccl_busbw(report.nccl, img_dir / "nccl_busbw.png"))
    if report.traces:
        out.append(trace_kernels(report.traces, img_dir / "trace_kernels.png"))
    return out
