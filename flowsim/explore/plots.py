"""PNG plots of tuning runs and studies (matplotlib, an optional dependency imported on first use).

* :func:`tune_plot`: step time vs memory per GPU of every config that fits, the Pareto front, the best.
* :func:`sweep_plot`: cost to train vs time to train per study point, and a heatmap of throughput over
  two study parameters.
"""
from __future__ import annotations

import math

import pandas as pd

from flowsim.explore.pricing import SECONDS_PER_DAY
from flowsim.errors import ConfigError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("plot", "needs the optional matplotlib package (pip install 'flowsim[plot]')") from None
    matplotlib.use("Agg")  # files only; never opens a window
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path) -> None:
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise ConfigError("plot", f"cannot write file: {e.strerror}", str(path)) from None


def tune_plot(res, path) -> None:
    """Write to ``path`` (PNG) the step time (log scale) vs memory per GPU of every config of ``res`` (a
    :class:`flowsim.explore.tune.TuneResult`) that fits, coloured by pipeline size, with the Pareto front."""
    plt = _pyplot()
    df = res.to_frame()
    fig, ax = plt.subplots(figsize=(8, 5.5), layout="constrained")
    if len(df):
        sc = ax.scatter(df["memory_bytes_per_gpu"] / 1e9, df["step_time_s"], c=[math.log2(p) for p in df["pp"]],
                        cmap="viridis", s=10, alpha=0.6)
        cb = fig.colorbar(sc, ax=ax)
        cb.set_label("log2(pipeline-parallel size)")
        front = res.pareto()
        ax.step([p.memory_bytes_per_gpu / 1e9 for p in front], [p.step_time_s for p in front], where="post",
                color="crimson", label="Pareto front (time vs memory)")
        b = res.best
        ax.scatter([b.memory_bytes_per_gpu / 1e9], [b.step_time_s], marker="*", s=250, color="crimson",
                   edgecolor="black", zorder=5, label=f"best: {b.layout.label()}")
        ax.axvline(b.memory_capacity_bytes / 1e9, color="grey", ls="--", lw=1, label="GPU memory")
        ax.legend(loc="upper right", fontsize=8)
    j = res.job
    ax.set_title(f"{j.get('model')} on {j.get('gpus') or j.get('num_gpus')} GPUs: {len(df)} layouts that fit")
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("step time (s, log scale)")
    ax.set_yscale("log")  # slow layouts run to 100x the best; a log axis keeps the front readable
    ax.grid(alpha=0.3, which="both")
    _save(fig, path)
    plt.close(fig)


def heatmap(ax, df: pd.DataFrame, x: str, y: str, value: str, fmt: str = ".0f", scale: float = 1.0):
    """Draw column ``value`` of ``df`` (times ``scale``, cells labelled with format ``fmt``) over the
    categories of columns ``x`` and ``y`` on ``ax``; returns the image."""
    table = df.pivot_table(index=y, columns=x, values=value, aggfunc="first", sort=False) * scale
    im = ax.imshow(table.to_numpy(dtype=float), cmap="viridis", aspect="auto")
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns])
    ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    lo, hi = float(table.min().min()), float(table.max().max())
    for (i, j), v in pd.DataFrame(table.to_numpy()).stack().items():
        light = hi > lo and (v - lo) / (hi - lo) > 0.6  # viridis is light at the top of its range
        ax.text(j, i, format(v, fmt), ha="center", va="center", color="black" if light else "white", fontsize=9)
    return im


def _heat_axes(res) -> tuple:
    df = res.to_frame()
    keys = list(res.study.grid_keys)
    cands = keys + [k for k in ("hardware", "workload") if df[k].nunique() > 1]
    return (cands[0], cands[1]) if len(cands) >= 2 else (None, None)


def sweep_plot(res, path) -> None:
    """Write to ``path`` (PNG) the cost to train vs time to train of each point of ``res`` (a
    :class:`flowsim.explore.sweep.SweepResult`), and a throughput heatmap over two parameters (the grid keys, else
    hardware and the grid key or workload) when the study has two."""
    plt = _pyplot()
    df = res.to_frame()
    x, y = _heat_axes(res)
    fig, axes = plt.subplots(1, 2 if x else 1, figsize=(13 if x else 7, 5.5), layout="constrained", squeeze=False)
    ax = axes[0][0]
    ok = df[df["status"] == "ok"]
    labels = [r.point.label for r in res.rows if r.status == "ok"]
    ax.scatter(ok["time_to_train_s"] / SECONDS_PER_DAY, ok["cost_usd"] / 1e6, s=60, color="tab:blue")
    for lab, t, c in zip(labels, ok["time_to_train_s"] / SECONDS_PER_DAY, ok["cost_usd"] / 1e6):
        ax.annotate(lab, (t, c), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel(f"time to train {res.study.token_budget:.3g} tokens (days)")
    ax.set_ylabel("cost to train (M$, example prices unless given)")
    ax.set_title(f"study {res.study.name}: cost vs time")
    ax.grid(alpha=0.3)
    if x:
        ax2 = axes[0][1]
        im = heatmap(ax2, ok, x, y, "tokens_per_s", scale=1e-3)
        fig.colorbar(im, ax=ax2).set_label("throughput (1e3 tokens/s)")
        ax2.set_title("throughput of the best layout (1e3 tokens/s)")
    _save(fig, path)
    plt.close(fig)
