"""The default shape list of the kernel benchmark harness (:mod:`flowsim.kernels.bench`): what flowsim prices.

The default list covers what flowsim prices: the GEMMs and attention calls of
:func:`flowsim.model.workload.build_workload` for every model preset at TP 1, 2, 4 and 8 (micro-batch 1, sequence
parallelism with TP > 1, no context parallelism, the preset's sequence length), the norms, residual adds and
activations of those layers, plus two sweeps: attention over sequence length and head dim in the
flash-attention benchmark convention (16k tokens, hidden 2048, as ``data/flash_attention.csv``), and every
memory-bound op over tensor size (bytes) at 4096 columns. Attention is benchmarked with as many K/V heads as
query heads: the kernel-DB schema has no K/V-head column, and grouped-query attention does the same FLOP.

The shape-table schema and its checks live in :mod:`flowsim.kernels.shapes`; this walk over the model presets
and the workload builder sits above the kernels layer because it reads both.
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from flowsim.config import build_config, list_presets
from flowsim.errors import ConfigError
from flowsim.kernels.shapes import MEMORY_OPS, SHAPE_COLUMNS, validate_shapes
from flowsim.model.ops import OpSet
from flowsim.model.workload import build_workload

TP_SIZES = (1, 2, 4, 8)
# Attention sweep in the flash-attention benchmark convention (batch x seq = 16384 tokens, heads x head_dim =
# 2048), the convention of data/flash_attention.csv, so measured rows line up with the seed tables.
ATTN_SWEEP_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
ATTN_SWEEP_HEAD_DIMS = (64, 128)
ATTN_SWEEP_TOKENS = 16384
ATTN_SWEEP_HIDDEN = 2048
# Memory-bound sweep: [rows, 4096] tensors with rows 64 .. 131072, i.e. 0.5 MiB .. 1 GiB in bf16; it spans
# L2-resident sizes (tens of MB on current GPUs) up to HBM-streaming ones.
MEMORY_SWEEP_COLS = 4096
MEMORY_SWEEP_ROWS = tuple(2 ** p for p in range(6, 18))


def default_shapes(models=None, tp_sizes=TP_SIZES, dtype: str = "bf16") -> pd.DataFrame:
    """The default shape table: flowsim's workload shapes and the sweeps (module docstring).

    Parameters
    ----------
    models : sequence of str, optional
        Model preset names; default every preset (``flowsim.config.list_presets("models")``).
    tp_sizes : sequence of int
        Tensor-parallel sizes. A (model, TP) pair the config rules reject (heads not divisible by TP) is left
        out.
    dtype : str
        Dtype of every case (:data:`flowsim.kernels.shapes.BENCH_DTYPES`).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`flowsim.kernels.shapes.SHAPE_COLUMNS`, duplicates removed (the first origin is kept).
    """
    rows = []
    for model in (list_presets("models") if models is None else models):
        for tp in tp_sizes:
            try:
                cfg = build_config(model=model, cluster="dgx-h100", tp=tp, sp=tp > 1, mbs=1, gbs=1)
            except ConfigError:
                continue
            wl = build_workload(cfg)
            tag = f"{model} tp{tp}"
            for f in dataclasses.fields(wl):
                block = getattr(wl, f.name)
                if isinstance(block, OpSet):
                    rows.extend(_workload_rows(block.compute, tag))
            rows.extend(_layer_memory_rows(cfg, tag))
    for hd in ATTN_SWEEP_HEAD_DIMS:
        for seq in ATTN_SWEEP_SEQ:
            for causal in (False, True):
                rows.append(dict(op="attention", batch=ATTN_SWEEP_TOKENS // seq, heads=ATTN_SWEEP_HIDDEN // hd,
                                 seq=seq, head_dim=hd, causal=causal, origin="sweep"))
    for op in MEMORY_OPS:
        for r in MEMORY_SWEEP_ROWS:
            rows.append(dict(op=op, rows=r, cols=MEMORY_SWEEP_COLS, origin="sweep"))
    table = validate_shapes(pd.DataFrame(rows), default_dtype=dtype)
    return table.drop_duplicates(subset=[c for c in SHAPE_COLUMNS if c != "origin"]).reset_index(drop=True)


def _workload_rows(compute: pd.DataFrame, tag: str) -> list:
    """GEMM and attention cases of one op table (attention once per shape: the harness times fwd and fwd+bwd)."""
    out = []
    for r in compute.itertuples():
        if r.kind == "gemm":
            out.append(dict(op="gemm", m=r.m, n=r.n, k=r.k, batch=r.batch, origin=f"{tag}: {r.name}"))
        elif r.kind == "attn_fwd" and r.seq_q == r.seq_k:
            out.append(dict(op="attention", batch=r.batch, heads=r.heads, seq=r.seq_q, head_dim=r.head_dim,
                            causal=bool(r.causal), origin=f"{tag}: {r.name}"))
    return out


def _layer_memory_rows(cfg, tag: str) -> list:
    """Norm and residual add over the [tokens / tp (sequence parallel), hidden] activation, and the MLP
    activation over [tokens, ffn / tp], of one layer of ``cfg`` (as :func:`flowsim.model.workload.build_layer`)."""
    m, t = cfg.model, cfg.training
    tokens = cfg.microbatch_tokens
    tok_sp = tokens // t.tp if t.sequence_parallel else tokens
    act = "swiglu" if m.gated else "gelu"
    return [dict(op=m.normalization, rows=tok_sp, cols=m.hidden_size, origin=f"{tag}: norm"),
            dict(op="add", rows=tok_sp, cols=m.hidden_size, origin=f"{tag}: residual"),
            dict(op=act, rows=tokens, cols=m.ffn_hidden_size // t.tp, origin=f"{tag}: activation")]
