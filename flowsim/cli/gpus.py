"""``flowsim gpus``: list the built-in GPU datasheets."""
from __future__ import annotations

import math

import click

from flowsim import units
from flowsim.cli.common import echo_json, format_table, user_errors
from flowsim.gpu_specs import GPUSpec, get_gpu, list_gpus

COLUMNS = [
    ("key", "key", ""),
    ("name", "name", ""),
    ("bf16_TFLOPS", "bf16 TFLOP/s", ".1f"),
    ("fp8_TFLOPS", "fp8 TFLOP/s", ".1f"),
    ("hbm_GB", "HBM GB", ".0f"),
    ("hbm_TBps", "HBM TB/s", ".3f"),
    ("sm_count", "SMs/CUs", "d"),
    ("scaleup_GBps", "scale-up GB/s/dir", ".0f"),
    ("scaleup_kind", "scale-up kind", ""),
]


def gpu_row(gpu: GPUSpec) -> dict:
    """Display figures of one GPU (dense peaks, decimal GB and TB/s); missing dtypes and unknown values are None."""

    def tflops(dtype: str):
        v = gpu.peak_flop_per_s.get(dtype)
        return None if v is None else v / units.TFLOP

    return {
        "key": gpu.key,
        "name": gpu.name,
        "bf16_TFLOPS": tflops("bf16"),
        "fp8_TFLOPS": tflops("fp8"),
        "hbm_GB": gpu.hbm_bytes / units.GB,
        "hbm_TBps": gpu.hbm_Bps / units.TB,
        "sm_count": gpu.sm_count,
        "scaleup_GBps": gpu.scaleup_Bps / units.GB,
        "scaleup_kind": gpu.scaleup_kind,
    }


def gpu_record(gpu: GPUSpec) -> dict:
    """Every field of ``gpu`` in SI units (what ``--json`` prints per GPU); NaN becomes null."""
    return {
        "key": gpu.key,
        "name": gpu.name,
        "vendor": gpu.vendor,
        "arch": gpu.arch,
        "compute_capability": gpu.compute_capability,
        "peak_flop_per_s": dict(gpu.peak_flop_per_s),
        "hbm_bytes": gpu.hbm_bytes,
        "hbm_Bps": gpu.hbm_Bps,
        "sm_count": gpu.sm_count,
        "clock_hz": None if math.isnan(gpu.clock_hz) else gpu.clock_hz,
        "l2_bytes": None if math.isnan(gpu.l2_bytes) else gpu.l2_bytes,
        "scaleup_kind": gpu.scaleup_kind,
        "scaleup_Bps": gpu.scaleup_Bps,
        "scaleup_links": gpu.scaleup_links,
        "nvls": gpu.nvls,
        "pcie_Bps": gpu.pcie_Bps,
        "tdp_w": gpu.tdp_w,
        "sources": list(gpu.sources),
        "notes": gpu.notes,
    }


@click.command("gpus")
@click.argument("gpu", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units, all fields, sources).")
@user_errors
def gpus(gpu, as_json):
    """List the built-in GPUs, or show one GPU (a key or a YAML spec file path).

    Peaks are dense (no sparsity). GB and TB/s are decimal (1e9, 1e12 bytes).
    """
    specs = [get_gpu(gpu)] if gpu else list_gpus()
    if as_json:
        echo_json({"gpus": [gpu_record(g) for g in specs]})
    else:
        click.echo(format_table([gpu_row(g) for g in specs], COLUMNS))
