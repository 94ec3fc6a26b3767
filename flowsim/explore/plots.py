"""PNG plots of tuning runs and studies (matplotlib, an optional dependency imported on first use).

* :func:`tune_plot`: step time vs memory per GPU of every config that fits, the Pareto front, the best.
* :func:`sweep_plot`: cost to train vs time to train per study point, and a heatmap of throughput over
  two study parameters.
"""
from __future__ import annotations

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
    :class:`flowsim.explore.tune.TuneResult`) that fits, one colour per pipeline-parallel size, with the Pareto
    front and the best layout."""
    plt = _pyplot()
    df = res.to_frame()
    fig, ax = plt.subplots(figsize=(8, 5.5), layout="constrained")
    if len(df):
        colours = plt.get_cmap("tab10")
        for k, (pp, part) in enumerate(df.groupby("pp", sort=True)):
            ax.scatter(part["memory_bytes_per_gpu"] / 1e9, part["step_time_s"], s=10, alpha=0.6,
                       color=colours(k % 10), label=f"pp={pp} ({len(part)})")
        front = res.pareto()
        ax.step([p.memory_bytes_per_gpu / 1e9 for p in front], [p.step_time_s for p in front], where="post",
                color="crimson", label="Pareto front (time vs memory)")
        b = res.best
        ax.scatter([b.memory_bytes_per_gpu / 1e9], [b.step_time_s], marker="*", s=250, color="crimson",
                   edgecolor="black", zorder=5, label=f"best: {b.layout.label()}")
        ax.axvline(b.memory_capacity_bytes / 1e9, color="grey", ls="--", lw=1, label="GPU memory")
        ax.set_xlim(0, b.memory_capacity_bytes / 1e9 * 1.05)  # memory from zero to just past the GPU's
        ax.legend(loc="upper right", fontsize=8, markerscale=2)
    j = res.job
    ax.set_title(f"{j.get('model')} on {j.get('gpus') or j.get('num_gpus')} GPUs: {len(df)} layouts that fit")
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("step time (s, log scale)")
    ax.set_yscale("log")  # slow layouts run to 100x the best; a log axis keeps the front readable
    ax.grid(alpha=0.3, which="both")
    _save(fig, path)
    plt.close(fig)


def tokens_label(n: float) -> str:
    """``3e11`` -> ``300B``: a token count in words for axis labels."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.4g}{unit}"
    return f"{n:.4g}"


def heatmap(ax, df: pd.DataFrame, x: str, y: str, value: str, fmt: str = ".0f", scale: float = 1.0):
    """Draw column ``value`` of ``df`` (times ``scale``, cells labelled with format ``fmt``) over the
    categories of columns ``x`` and ``y`` on ``ax``; returns the image."""
    table = df.pivot_table(index=y, columns=x, values=value, aggfunc="first", sort=False) * scale
    # colours from zero: a few per cent between cells is a few per cent of the colour range, not all of it
    im = ax.imshow(table.to_numpy(dtype=float), cmap="viridis", aspect="auto", vmin=0.0)
    ax.set_xticks(range(table.shape[1]), [_tick(c) for c in table.columns])
    ax.set_yticks(range(table.shape[0]), [_tick(i) for i in table.index])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    hi = float(table.max().max())
    for (i, j), v in pd.DataFrame(table.to_numpy()).stack().items():
        light = hi > 0 and v / hi > 0.6  # viridis is light at the top of its range
        ax.text(j, i, format(v, fmt), ha="center", va="center", color="black" if light else "white", fontsize=9)
    return im


def _tick(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _heat_axes(res) -> tuple:
    df = res.to_frame()
    keys = list(res.study.grid_keys)
    cands = keys + [k for k in ("hardware", "workload") if df[k].nunique() > 1]
    return (cands[0], cands[1]) if len(cands) >= 2 else (None, None)


def sweep_plot(res, path) -> None:
    """Write to ``path`` (PNG) the cost to train vs time to train of each point of ``res`` (a
    :class:`flowsim.explore.sweep.SweepResult`), and a throughput heatmap over two parameters (the grid keys, else
    hardware and the grid key or workload) when the study has two.

    Points are numbered on the chart and named in its legend (labels beside the points overprint when points
    coincide); both axes start at zero, so a few per cent between points look like a few per cent."""
    plt = _pyplot()
    df = res.to_frame()
    x, y = _heat_axes(res)
    fig, axes = plt.subplots(1, 2 if x else 1, figsize=(14 if x else 8, 6), layout="constrained", squeeze=False)
    ax = axes[0][0]
    ok = df[df["status"] == "ok"]
    labels = [r.point.label for r in res.rows if r.status == "ok"]
    scale, unit = (1e6, "M$") if len(ok) and ok["cost_usd"].max() >= 1e6 else (1e3, "k$")
    days, cost = ok["time_to_train_s"] / SECONDS_PER_DAY, ok["cost_usd"] / scale
    colours = plt.get_cmap("tab10")
    for k, (lab, t, c) in enumerate(zip(labels, days, cost), 1):
        ax.scatter([t], [c], s=60, color=colours((k - 1) % 10), label=f"{k}: {lab}")
        ax.annotate(str(k), (t, c), textcoords="offset points", xytext=(5 + 9 * ((k - 1) % 4), 3), fontsize=8)
    if len(ok):
        ax.set_xlim(0, float(days.max()) * 1.15)
        ax.set_ylim(0, float(cost.max()) * 1.15)
        ax.legend(loc="lower right", fontsize=7, title="points")
    budget = tokens_label(res.study.token_budget)
    ax.set_xlabel(f"time to train {budget} tokens (days)")
    ax.set_ylabel(f"cost to train ({unit}, example prices unless given)")
    ax.set_title(f"study {res.study.name}: cost vs time to train {budget} tokens")
    ax.grid(alpha=0.3)
    if x:
        ax2 = axes[0][1]
        im = heatmap(ax2, ok, x, y, "tokens_per_s", fmt=".1f", scale=1e-3)
        fig.colorbar(im, ax=ax2).set_label("throughput (1e3 tokens/s)")
        ax2.set_title("throughput of each point's best layout (1e3 tokens/s)")
    _save(fig, path)
    plt.close(fig)
