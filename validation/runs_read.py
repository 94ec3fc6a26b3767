"""Read runs-schema CSVs (``shared/data/curated/README.md``): the columns the validation loop uses, and the
typed, well-formed rows of a file with every malformed line listed with a one-line reason.

Schema v1 columns are required; the schema v2 framework-setting columns are optional (an absent column reads as
empty cells). An empty numeric cell is NaN (:func:`_known`); text cells are stripped.
"""
from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import pandas as pd

from flowsim.errors import ConfigError
from flowsim.io_text import open_text

NUMERIC_COLUMNS = (
    "id", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "seq_length", "vocab_size", "gated_mlp", "moe_num_experts", "moe_topk", "moe_ffn_hidden_size",
    "moe_shared_experts", "ep", "global_batch_size",
    "micro_batch_size", "num_gpus", "gpus_per_node", "nic_gbps_per_gpu", "tp", "pp", "vpp", "dp", "cp", "sp",
    "zero_stage", "distributed_optimizer", "measured_step_time_s",
)
"""Columns of runs schema v1 that the validation loop reads as numbers (an empty cell is NaN)."""

TEXT_COLUMNS = ("source", "source_detail", "model", "gpu", "recompute", "precision", "framework", "notes")
"""Columns of runs schema v1 that the validation loop reads as text."""

REQUIRED_COLUMNS = NUMERIC_COLUMNS + TEXT_COLUMNS
"""Every column the validation loop reads; a CSV without one of them is rejected as a whole."""

V2_SETTING_COLUMNS = ("attention_impl", "attention_dropout", "hidden_dropout", "overlap_grad_reduce",
                      "overlap_param_gather", "tp_comm_overlap", "cuda_graphs", "torch_compile", "grad_reduce_dtype")
"""Framework-setting columns of runs schema v2 that map to config keys through :data:`V2_SETTINGS` (read as
text, each cell checked when its row is mapped, so a bad cell skips only its row)."""
V2_NUMERIC_COLUMNS = ("etp", "power_limit_w")
V2_TEXT_COLUMNS = ("framework_version", "moe_token_dispatcher") + V2_SETTING_COLUMNS
"""Optional framework-setting columns of runs schema v2 that the validation loop reads (an absent column reads as
empty cells)."""


@dataclass(frozen=True)
class SkippedRun:
    """A row that was not simulated, and why.

    Attributes
    ----------
    id : int or None
        Row id, or None when the id cell itself is malformed (the reason then names the line).
    reason : str
        One line: the rule the row breaks or the feature flowsim lacks.
    """

    id: int | None
    reason: str


def read_runs(path: str | Path) -> tuple[pd.DataFrame, list[SkippedRun]]:
    """Read a runs-schema-v1 CSV, keeping the well-formed rows.

    Parameters
    ----------
    path : str or Path
        CSV file with a header line; column order is free and extra columns are ignored.

    Returns
    -------
    runs : pandas.DataFrame
        One row per well-formed line, indexed by its line number in the file (``line``). The
        :data:`NUMERIC_COLUMNS` are float64 (an empty cell is NaN), ``id`` is int64, the
        :data:`TEXT_COLUMNS` are stripped strings (``recompute`` and ``precision`` lower-cased).
    skipped : list[SkippedRun]
        Malformed lines (a field count that differs from the header, a non-numeric value in a numeric
        column, an empty or non-integer id), each with a reason that names the line and the column.

    Raises
    ------
    ConfigError
        When the file cannot be read, is empty, or lacks one of the :data:`REQUIRED_COLUMNS`.
    """
    records, skipped = read_run_records(path)
    frame = pd.DataFrame(records, columns=["line", *REQUIRED_COLUMNS, *V2_NUMERIC_COLUMNS, *V2_TEXT_COLUMNS]
                         ).set_index("line")
    frame["id"] = frame["id"].astype("int64")
    return frame, skipped


def read_run_records(path: str | Path) -> tuple[list[dict], list[SkippedRun]]:
    """:func:`read_runs` as one dict per well-formed line (``line``, ``id`` as int, every column as
    :func:`read_runs` types it), without building a DataFrame: what the validation loop iterates over."""
    try:
        with open_text(path, "runs") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise ConfigError("runs", "file is empty (expected a runs schema v1 header line)", str(path))
            header = [h.strip() for h in header]
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise ConfigError(missing[0], "required column of runs schema v1 is missing", str(path))
            col = {name: header.index(name) for name in REQUIRED_COLUMNS + V2_NUMERIC_COLUMNS + V2_TEXT_COLUMNS
                   if name in header}
            records, skipped = [], []
            line = reader.line_num + 1
            for cells in reader:
                start, line = line, reader.line_num + 1
                if not any(c.strip() for c in cells):
                    continue
                try:
                    records.append(_parse_record(cells, len(header), col, start))
                except _MalformedRow as e:
                    skipped.append(SkippedRun(e.row_id, str(e)))
    except OSError as e:
        raise ConfigError("runs", f"cannot read file: {e.strerror}", str(path)) from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError("runs", f"not a readable CSV file: {e}", str(path)) from None
    return records, skipped


class _MalformedRow(Exception):
    """A line of the CSV that cannot be parsed; carries the row id when that much could be read."""

    def __init__(self, row_id, message):
        self.row_id = row_id
        super().__init__(message)


def _parse_record(cells: list[str], n_header: int, col: Mapping[str, int], line: int) -> dict:
    """Typed record of one CSV line (``col`` maps column names to positions); raises _MalformedRow."""
    raw_id = cells[col["id"]].strip() if col["id"] < len(cells) else ""
    try:
        row_id = int(raw_id)
    except ValueError:
        row_id = None
    if len(cells) != n_header:
        raise _MalformedRow(row_id, f"line {line}: has {len(cells)} fields, the header has {n_header}")
    if row_id is None:
        raise _MalformedRow(None, f"line {line}: id: must be an integer (got {raw_id!r})")
    record = {"line": line}
    for name in NUMERIC_COLUMNS + V2_NUMERIC_COLUMNS:
        text = cells[col[name]].strip() if name in col else ""
        try:
            value = float(text) if text else math.nan
        except ValueError:
            value = None
        if value is None or (text and not math.isfinite(value)):
            raise _MalformedRow(row_id, f"line {line}: {name}: must be a finite number (got {text!r})")
        record[name] = value
    record["id"] = row_id
    for name in TEXT_COLUMNS + V2_TEXT_COLUMNS:
        text = cells[col[name]].strip() if name in col else ""
        # interned: a long file repeats its sources, models, GPUs and notes (100k rows: -150 MB)
        record[name] = sys.intern(text.lower() if name in ("recompute", "precision", "moe_token_dispatcher") else text)
    return record


def _known(value) -> bool:
    """False for a NaN (an empty numeric cell)."""
    return not (isinstance(value, float) and math.isnan(value))


def _int_or_value(value):
    """Integral floats become int; anything else is passed on for build_config to judge."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
