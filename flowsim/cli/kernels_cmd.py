"""``flowsim kernels``: price one op (``predict``), list the kernel database (``show``), report its accuracy
(``accuracy``), read GEMM timings from profiler traces (``ingest``) and time ops with torch (``bench``)."""
from __future__ import annotations

import dataclasses
import math

import click
import pandas as pd

from flowsim import units
from flowsim.cli.common import echo_json, format_table, user_errors
from flowsim.errors import ConfigError
from flowsim.explore.kernel_shapes import default_shapes
from flowsim.gpu_specs import get_gpu, gpu_keys
from flowsim.kernels import DTYPES, KINDS, kernel_references, op_breakdown
from flowsim.kernels.accuracy import leave_one_out, loo_summary
from flowsim.kernels.bench import (
    DEFAULT_REPEATS,
    DEFAULT_WARMUP,
    iter_bench,
    model_times,
    predicted_device_time_s,
)
from flowsim.kernels.db import seed_db
from flowsim.kernels.gemm import gemm_ceiling, peak_dtype
from flowsim.kernels.ingest import ingest_trace, trace_accuracy
from flowsim.kernels.shapes import BENCH_DTYPES, BENCH_OPS, OP_GROUPS, parse_ops, read_shapes

SHAPES = {
    "gemm": ("m", "n", "k", "batch"),
    "attn_fwd": ("batch", "heads", "seq_q", "seq_k", "head_dim"),
    "attn_bwd": ("batch", "heads", "seq_q", "seq_k", "head_dim"),
    "memory": ("bytes",),
}
_REQUIRED = {"gemm": 3, "attn_fwd": 5, "attn_bwd": 5, "memory": 1}
# Shape bounds: GEMM and attention dimensions of training jobs stay below 2**24 (tokens per micro-batch,
# vocabularies and widths are all < 2**22, flowsim.config.bounds); a memory-bound op moves at most 1 TiB,
# more than any GPU's HBM (B300: 288 GB).
MAX_SHAPE_DIM = 2**24
MAX_MEMORY_OP_BYTES = 2**40


def parse_shape(op: str, shape: str) -> dict:
    """``"4096,4096,4096"`` -> ``{"m": 4096, ...}`` for ``op`` (names in ``SHAPES``); ConfigError('shape') if bad."""
    names = SHAPES[op]
    rule = f"{op} takes {','.join(names[:_REQUIRED[op]])}" + (f"[,{names[-1]}]" if len(names) > _REQUIRED[op] else "")
    parts = [p.strip() for p in shape.split(",")]
    if not _REQUIRED[op] <= len(parts) <= len(names):
        raise ConfigError("shape", rule, shape)
    try:
        values = [float(p) if op == "memory" else int(p) for p in parts]
    except ValueError:
        raise ConfigError("shape", rule + " (numbers)", shape) from None
    limit = MAX_MEMORY_OP_BYTES if op == "memory" else MAX_SHAPE_DIM
    if not all(math.isfinite(v) and v <= limit for v in values):  # the lower bound is the op's own check
        raise ConfigError("shape", f"{rule}: each finite and <= {limit:,}", shape)
    return dict(zip(names, values))


@click.group("kernels")
def kernels():
    """Kernel compute model: time of one op on one GPU, calibrated on measured kernels."""


@kernels.command("predict")
@click.option("--gpu", required=True, help="GPU key (see `flowsim gpus`) or a YAML spec file path.")
@click.option("--op", "op", type=click.Choice(KINDS), required=True, help="Op kind.")
@click.option(
    "--shape", required=True,
    help="gemm: m,n,k[,batch]; attn_fwd/attn_bwd: batch,heads,seq_q,seq_k,head_dim; memory: bytes.",
)
@click.option("--dtype", type=click.Choice(DTYPES), default="bf16", show_default=True)
@click.option("--causal", is_flag=True, help="Causal attention mask.")
@click.option("--kv-heads", type=click.IntRange(min=0), default=0, help="Attention KV heads (0 = heads).")
@click.option("--attention-impl", type=click.Choice(["fa2", "fa3", "cudnn"]), default=None,
              help="Attention kernel (default: the one --software-release runs on this GPU, else fa2).")
@click.option("--software-release", default="", metavar="RELEASE",
              help="Price on this software release's GEMM measurements (nearest older one when it has none).")
@click.option("--power-limit-w", type=click.FloatRange(min=0), default=0.0,
              help="Board power limit in W (0 = the GPU's own); derates compute by (limit / measured) ** (1/3).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def predict(gpu, op, shape, dtype, causal, kv_heads, attention_impl, software_release, power_limit_w, as_json):
    """Predict the time of one op launch and say what bounds it and which measurements priced it."""
    from flowsim.kernels import KernelStack
    from flowsim.kernels.stack import attention_kernel

    spec = get_gpu(gpu)
    stack = KernelStack(software_release, power_limit_w)
    stack = dataclasses.replace(stack, attention_impl=attention_kernel(stack.release, spec.arch))
    dims = parse_shape(op, shape)
    row = {"kind": op, "dtype": dtype, **dims}
    if op.startswith("attn"):
        row.update(causal=causal, kv_heads=kv_heads)
    b = op_breakdown(pd.DataFrame([row]), spec, attention_impl=attention_impl, stack=stack).iloc[0]
    tables = {"gemm": ("gemm_mamf", "gemm_release", "gemm_latency"),
              "memory": ("memory_latency",)}.get(op, ("flash_attention",))
    refs = kernel_references(spec, (dtype,) if op == "gemm" else None,
                             attention_impl or stack.attention_impl or "fa2")
    refs = [r for r in refs if r.table in tables + ("hbm_stream",)]
    peak = spec.peak_flop_per_s.get(peak_dtype(dtype) if op != "memory" else "", float("nan"))
    result = {
        "gpu": spec.key, "op": op, "dtype": dtype, "shape": dims, "time_s": b.time_s, "compute_s": b.compute_s,
        "memory_s": b.memory_s, "bound": b.bound, "flops": b.flops, "bytes": b.bytes,
        "achieved_flop_per_s": b.achieved_flop_per_s, "fraction_of_peak": b.achieved_flop_per_s / peak,
        "achieved_Bps": b.bytes / b.time_s, "references": [dataclasses.asdict(r) for r in refs],
    }
    if op == "gemm":
        ref = next(r for r in refs if r.table in ("gemm_mamf", "gemm_release"))
        c = gemm_ceiling(ref.measured, ref.dtype, stack.release)
        result["ceiling_release"] = {"release": c.release, "date": c.date, "fallback": c.fallback}
    if as_json:
        echo_json(result)
        return
    click.echo(format_table([{
        "gpu": spec.key, "op": op, "dtype": dtype, "shape": shape, "time_us": b.time_s / units.US,
        "tflops": b.achieved_flop_per_s / units.TFLOP, "pct": 100 * result["fraction_of_peak"],
        "gbps": result["achieved_Bps"] / units.GB, "bound": b.bound,
    }], [("gpu", "gpu", ""), ("op", "op", ""), ("dtype", "dtype", ""), ("shape", "shape", ""),
         ("time_us", "time us", ".2f"), ("tflops", "TFLOP/s", ".1f"), ("pct", "% of peak", ".1f"),
         ("gbps", "HBM GB/s", ".0f"), ("bound", "bound", "")]))
    for r in refs:
        click.echo(f"{r.table} ({r.dtype}): measured on {r.measured}, {r.rule}")
    if op == "gemm":
        c = result["ceiling_release"]
        note = f", the nearest {c['fallback']} to {stack.release}" if c["fallback"] else ""
        click.echo(f"GEMM ceiling measured on {c['release']} ({c['date']}{note})")


@kernels.command("show")
@click.option("--gpu", default=None, help="Show one GPU: the measurements priced with and its DB rows.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def show(gpu, as_json):
    """What the kernel database holds, per GPU (or, with --gpu, the references and rows for one GPU)."""
    db = seed_db()
    if gpu is None:
        summary = db.groupby(["gpu", "op", "impl", "dtype", "stack"]).size().reset_index(name="rows")
        if as_json:
            echo_json({"db": summary.to_dict(orient="records")})
        else:
            click.echo(format_table(summary.to_dict(orient="records"), [
                ("gpu", "gpu", ""), ("op", "op", ""), ("impl", "impl", ""), ("dtype", "dtype", ""),
                ("stack", "measured on", ""), ("rows", "rows", "d"),
            ]))
        return
    spec = get_gpu(gpu)
    refs = kernel_references(spec)
    measured = {r.measured for r in refs}
    rows = db[db.gpu.isin(measured)]
    if as_json:
        echo_json({"gpu": spec.key, "references": [dataclasses.asdict(r) for r in refs],
                   "rows": rows.to_dict(orient="records")})
        return
    for r in refs:
        click.echo(f"{r.table} ({r.dtype}): measured on {r.measured}, {r.rule}")
    click.echo(format_table(
        [dict(r, tflops=r["achieved_flop_per_s"] / units.TFLOP, gbps=r["achieved_Bps"] / units.GB,
              time_us=r["time_s"] / units.US) for r in rows.to_dict(orient="records")],
        [("gpu", "gpu", ""), ("op", "op", ""), ("impl", "impl", ""), ("dtype", "dtype", ""), ("m", "m", "d"),
         ("n", "n", "d"), ("k", "k", "d"), ("seq_k", "seq", "d"), ("head_dim", "hd", "d"), ("causal", "causal", ""),
         ("time_us", "time us", ".1f"), ("tflops", "TFLOP/s", ".1f"), ("gbps", "GB/s", ".0f"),
         ("stack", "measured on", "")],
    ))


@kernels.command("accuracy")
@click.option("--rows", "show_rows", is_flag=True, help="Print every leave-one-out prediction, not only the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def accuracy(show_rows, as_json):
    """Leave-one-out error of the kernel model against its own measurements, per op kind."""
    loo = leave_one_out()
    summary = loo_summary(loo)
    if as_json:
        out = {"summary": summary.to_dict(orient="records")}
        if show_rows:
            out["rows"] = loo.to_dict(orient="records")
        echo_json(out)
        return
    if show_rows:
        click.echo(format_table(
            [dict(r, pct=100 * r["error"]) for r in loo.to_dict(orient="records")],
            [("kind", "kind", ""), ("mode", "mode", ""), ("gpu", "gpu", ""), ("case", "case", ""),
             ("measured", "measured", ".1f"), ("predicted", "predicted", ".1f"), ("pct", "error %", "+.1f")],
        ))
        click.echo("")
    click.echo(format_table(
        [dict(r, med=100 * r["median_abs_error"], mx=100 * r["max_abs_error"])
         for r in summary.to_dict(orient="records")],
        [("kind", "kind", ""), ("mode", "mode", ""), ("n", "rows", "d"), ("med", "median |error| %", ".1f"),
         ("mx", "max |error| %", ".1f")],
    ))


@kernels.command("ingest")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option("--gpu", default=None, help="GPU key of the trace (default: from its deviceProperties).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the GEMM rows as kernel-DB CSV (schema in flowsim.kernels.db).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def ingest(trace, gpu, out_path, as_json):
    """Read GEMM timings from a PyTorch-profiler (Kineto) trace and compare them with the model."""
    rows = ingest_trace(trace, gpu)
    acc = trace_accuracy(rows)
    if out_path:
        rows.to_csv(out_path, index=False)
    abs_err = acc["error"].abs()
    summary = {"trace": str(trace), "gpu": rows.attrs["gpu"], "rows": len(rows),
               "median_abs_error": abs_err.median() if len(rows) else None,
               "max_abs_error": abs_err.max() if len(rows) else None}
    if as_json:
        echo_json({**summary, "gemms": acc.drop(columns=["source"]).to_dict(orient="records")})
        return
    if not len(rows):
        click.echo(f"no GEMM ops with recorded shapes in this trace ({rows.attrs['gpu']})")
        return
    click.echo(format_table(
        [dict(r, meas_us=r["time_s"] / units.US, pred_us=r["predicted_s"] / units.US, pct=100 * r["error"])
         for r in acc.to_dict(orient="records")],
        [("m", "m", "d"), ("n", "n", "d"), ("k", "k", "d"), ("batch", "batch", "d"), ("dtype", "dtype", ""),
         ("meas_us", "measured us", ".2f"), ("pred_us", "predicted us", ".2f"), ("pct", "error %", "+.1f"),
         ("bottleneck", "bound", "")],
    ))
    click.echo(f"{len(rows)} GEMMs on {rows.attrs['gpu']}: median |error| {100 * summary['median_abs_error']:.1f}%,"
               f" max {100 * summary['max_abs_error']:.1f}%")


@kernels.command("bench")
@click.option("--gpu-name", required=True,
              help="The rows' gpu: a flowsim GPU key (see `flowsim gpus`), else a device name.")
@click.option("--ops", "ops_spec", default="all", show_default=True,
              help=f"Comma list of {', '.join(BENCH_OPS)} or the groups {', '.join(OP_GROUPS)}.")
@click.option("--shapes", "shapes_src", default="default", show_default=True,
              help="'default' (flowsim's workload shapes and sweeps) or a shape CSV "
                   "(schema in flowsim.kernels.shapes).")
@click.option("--dtype", type=click.Choice(BENCH_DTYPES), default="bf16", show_default=True,
              help="Dtype of the default shapes and of CSV rows without one.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: the GPU torch sees, else the CPU.")
@click.option("--repeats", type=click.IntRange(min=1), default=DEFAULT_REPEATS, show_default=True,
              help="Timed launches per shape (the median is kept).")
@click.option("--warmup", type=click.IntRange(min=0), default=DEFAULT_WARMUP, show_default=True,
              help="Untimed launches per shape before timing.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write kernel-DB CSV rows, appended shape by shape (a run cut short keeps what it measured).")
@click.option("--dry-run", is_flag=True,
              help="Run nothing: count the shapes and, for a flowsim GPU key, predict the kernel time of the run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object at the end instead of a line per row.")
@user_errors
def bench(gpu_name, ops_spec, shapes_src, dtype, device, repeats, warmup, out_path, dry_run, as_json):
    """Time GEMM, attention and memory-bound ops with torch and emit kernel-DB rows (needs flowsim[bench])."""
    ops = parse_ops(ops_spec)
    shapes = default_shapes(dtype=dtype) if shapes_src == "default" else read_shapes(shapes_src, dtype)
    shapes = shapes[shapes.op.isin(ops)]
    if not len(shapes):
        raise ConfigError("ops", f"no shape in {shapes_src} has these ops", ops_spec)
    spec = get_gpu(gpu_name) if gpu_name in gpu_keys() else None
    if dry_run:
        counts = {op: int((shapes.op == op).sum()) for op in ops}
        predicted = predicted_device_time_s(shapes, spec, repeats, warmup) if spec else None
        if as_json:
            echo_json({"gpu": gpu_name, "shapes": counts, "predicted_kernel_time_s": predicted})
            return
        click.echo(", ".join(f"{op} {n}" for op, n in counts.items()) + f": {len(shapes)} shapes")
        if predicted is not None:
            click.echo(f"predicted kernel time on {gpu_name}: {predicted:.1f} s ({warmup} + {repeats} launches per "
                       "case; host time comes on top)")
        return
    parts = []
    for i, rows in enumerate(iter_bench(shapes, gpu_name, device=device, repeats=repeats, warmup=warmup)):
        if out_path:
            rows.to_csv(out_path, mode="w" if i == 0 else "a", header=i == 0, index=False)
        if spec:
            rows = rows.assign(predicted_s=model_times(rows, spec))
            rows["error"] = rows.predicted_s / rows.time_s - 1.0
        parts.append(rows)
        if not as_json:
            for r in rows.to_dict(orient="records"):
                vs_model = f"  model {r['predicted_s'] / units.US:.2f} us ({100 * r['error']:+.1f}%)" if spec else ""
                click.echo(f"{r['op']:<12} {r['impl']:<16} {r['dtype']:<5} {_shape_text(r):<28} "
                           f"{r['time_s'] / units.US:>12.2f} us {r['achieved_flop_per_s'] / units.TFLOP:>9.2f} TFLOP/s "
                           f"{r['achieved_Bps'] / units.GB:>9.1f} GB/s{vs_model}")
    db = pd.concat(parts, ignore_index=True)
    summary = (db.assign(abs_error=db.error.abs()).groupby("op", sort=False).abs_error
               .agg(["size", "median", "max"]).reset_index() if spec else None)
    if as_json:
        out = {"gpu": gpu_name, "shapes": len(shapes), "rows": db.to_dict(orient="records")}
        if spec:
            out["vs_model"] = summary.rename(columns={"size": "rows", "median": "median_abs_error",
                                                      "max": "max_abs_error"}).to_dict(orient="records")
        echo_json(out)
        return
    for r in (summary.to_dict(orient="records") if spec else []):
        click.echo(f"{r['op']}: {r['size']} rows, model vs measured median |error| {100 * r['median']:.1f}%, "
                   f"max {100 * r['max']:.1f}%")
    click.echo(f"{len(db)} rows from {len(shapes)} shapes on {gpu_name}"
               + (f", written to {out_path}" if out_path else ""))


def _shape_text(row: dict) -> str:
    if row["op"] == "gemm":
        return f"{row['m']}x{row['n']}x{row['k']}" + (f" x{row['batch']}" if row["batch"] > 1 else "")
    if row["op"] == "memory":
        return f"{row['bytes'] / units.MB:.3g} MB"
    return (f"b{row['batch']} h{row['heads']} s{row['seq_k']} d{row['head_dim']}"
            + (" causal" if row["causal"] else ""))
