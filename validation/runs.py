"""Compare flowsim's predicted step time with published training runs ("runs schema v1" CSVs).

The runs schema is described in ``shared/data/curated/README.md``: one line per measured training run, with
the model dimensions, the cluster, the parallel layout and ``measured_step_time_s``. :func:`validate_runs`
reads any CSV in that schema, turns every row it can into a :class:`flowsim.config.SimConfig`
(:func:`row_to_config`), simulates it and reports the signed error per row and summary figures; every row
it cannot simulate is listed with the reason.

Mapping rules (row -> config)
-----------------------------
* Model: the dimension columns map to the Megatron-LM names of the same name. ``gated_mlp = 1`` gives a
  Llama-style model (SwiGLU, RMSNorm, rotary positions, no biases, untied embeddings); ``gated_mlp = 0``
  gives a GPT-style model (GeLU, LayerNorm, learned positions, biases, tied embeddings). Non-gated rows are
  all priced as GeLU (squared-ReLU, ReLU and ALiBi variants cost the same GEMMs).
* Cluster: ``nics_per_node = gpus_per_node`` and ``nic_gbps = nic_gbps_per_gpu`` (one NIC per GPU). For
  GB200/GB300 rows the CSV's ``gpus_per_node`` is the NVLink domain (72 for NVL72): the row maps to
  ``nvlink_domain = gpus_per_node`` with 4 GPUs and 4 NICs per host (a compute tray) and an Arm host CPU
  (Grace).
* Training: tp, pp, vpp, dp, cp, sp, micro/global batch, recompute and precision map one to one;
  ``distributed_optimizer = 1`` sets ``use_distributed_optimizer`` and a ZeRO stage of at least 1;
  ``zero_stage`` is taken as given (FSDP rows carry 2 or 3).

Empty cells that have a clear default are filled and recorded in the row's ``assumptions``:
``micro_batch_size`` -> 1 (torchtitan with pp > 1: one micro-batch per stage, its default); ``recompute``
-> none; ``vpp`` -> 1 (with pp > 1 the source ran an interleaved
schedule of unknown degree; 1F1B is simulated, which has the largest bubble); ``sp`` -> on when tp > 1;
``precision`` -> bf16; ``zero_stage`` -> 0 (1 with the distributed optimizer); ``distributed_optimizer``
-> off; ``moe_num_experts`` -> 0 (dense); ``ffn_hidden_size`` -> 4h, ``num_query_groups`` -> heads,
``kv_channels`` -> h / heads; ``nic_gbps_per_gpu`` -> unused for a single-node job, else the NIC rate of
the built-in cluster preset with the same GPU (the job is skipped when there is none). A row whose
layout (tp, pp, dp, cp), GPU count, batch or model size is empty is skipped.

Runs schema v2 (optional framework-setting columns): a ``framework_version`` that flowsim has a profile of
(:mod:`flowsim.config.profiles`) selects that release's defaults; every filled :data:`V2_SETTINGS` cell sets its
config key and overrides the profile (an empty cell leaves the profile's default, or flowsim's without a
profile). Each row's assumptions say which settings came from the row and which from the profile. A cell with a
wrong value (``overlap_grad_reduce: 2``, ``attention_impl: fast``) skips its row with a one-line reason naming
the column and the allowed values. A filled ``power_limit_w`` sets the cluster's ``power_limit_w`` (compute ceilings
derated, :mod:`flowsim.kernels.power`); ``framework_version`` also names the software release the kernels are
priced on (:mod:`flowsim.kernels.stack`). v1 files (no such columns) map as before.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from flowsim.config import build_config, list_presets, load_preset
from flowsim.config.layout import LEGACY_EXPERT_RELEASES
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

NVL_HOST_GPUS = {"gb200": 4, "gb300": 4}
"""GPUs per host (compute tray) of the rack-scale NVLink systems whose CSV rows give the NVLink domain
as ``gpus_per_node``. Source: NVIDIA GB200 NVL72 / GB300 NVL72 spec pages (18 compute trays of 4 GPUs
and 2 Grace CPUs; one ConnectX NIC per GPU)."""


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

    @property
    def layout(self) -> str:
        """The parallel layout as ``tp/pp/dp/cp``."""
        return f"{self.tp}/{self.pp}/{self.dp}/{self.cp}"


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
        Spearman rank correlation of predicted and measured step times (``scipy.stats.spearmanr``);
        NaN for fewer than two rows or when either set of times is constant.
    """

    n: int
    median_abs_error_pct: float
    mape_pct: float
    p90_abs_error_pct: float
    spearman: float


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
    """

    rows: tuple
    summary: ErrorSummary
    by_source: dict = field(default_factory=dict)
    by_family: dict = field(default_factory=dict)
    skipped: tuple = ()

    def to_dict(self) -> dict:
        """The stable JSON view (what ``flowsim validate --json`` prints).

        Keys: ``rows`` (each with ``id``, ``predicted_step_time_s``, ``measured_step_time_s``,
        ``error_pct`` and the other :class:`RunComparison` fields), ``summary`` (``n``,
        ``median_abs_error_pct``, ``mape_pct``, ``p90_abs_error_pct``, ``spearman``) and ``skipped``
        (each with ``id`` and ``reason``).
        """
        rows = []
        for r in self.rows:
            d = asdict(r)
            d["assumptions"] = list(r.assumptions)
            rows.append(d)
        return {
            "rows": rows,
            "summary": asdict(self.summary),
            "skipped": [asdict(s) for s in self.skipped],
        }

    def to_frame(self) -> pd.DataFrame:
        """One row per simulated run, indexed by id, with the :class:`RunComparison` fields as columns."""
        columns = [f for f in RunComparison.__dataclass_fields__]
        return pd.DataFrame([asdict(r) for r in self.rows], columns=columns).set_index("id")

    def __repr__(self) -> str:
        s = self.summary
        return (f"ValidationReport(n={s.n}, skipped={len(self.skipped)}, "
                f"median_abs_error_pct={s.median_abs_error_pct:.3g}, mape_pct={s.mape_pct:.3g}, "
                f"p90_abs_error_pct={s.p90_abs_error_pct:.3g}, spearman={s.spearman:.3g})")


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
    frame = pd.DataFrame(records, columns=["line", *REQUIRED_COLUMNS, *V2_NUMERIC_COLUMNS, *V2_TEXT_COLUMNS]
                         ).set_index("line")
    frame["id"] = frame["id"].astype("int64")
    return frame, skipped


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
    for name in TEXT_COLUMNS + V2_TEXT_COLUMNS:
        text = cells[col[name]].strip() if name in col else ""
        record[name] = text.lower() if name in ("recompute", "precision", "moe_token_dispatcher") else text
    return record


def _known(value) -> bool:
    """False for a NaN (an empty numeric cell)."""
    return not (isinstance(value, float) and math.isnan(value))


def _int_or_value(value):
    """Integral floats become int; anything else is passed on for build_config to judge."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _flag(column: str, text: str) -> bool:
    if text not in ("0", "1"):
        raise ConfigError(column, "must be 0 or 1", text)
    return text == "1"


def _probability(column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value < 1.0:
        raise ConfigError(column, "must be a probability in [0, 1)", text)
    return value


def _choice(column: str, text: str, allowed: tuple) -> str:
    if text not in allowed:
        raise ConfigError(column, f"must be one of {', '.join(allowed)}", text)
    return text


V2_SETTINGS = {
    "attention_impl": lambda v: {"use_flash_attn": _choice("attention_impl", v, ("flash", "unfused")) == "flash"},
    "attention_dropout": lambda v: {"attention_dropout": _probability("attention_dropout", v)},
    "hidden_dropout": lambda v: {"hidden_dropout": _probability("hidden_dropout", v)},
    "overlap_grad_reduce": lambda v: {"overlap_grad_reduce": _flag("overlap_grad_reduce", v)},
    "overlap_param_gather": lambda v: {"overlap_param_gather": _flag("overlap_param_gather", v)},
    "tp_comm_overlap": lambda v: {"tp_comm_overlap": _flag("tp_comm_overlap", v)},
    # the schema does not say the scope: per-layer graphs, the smaller of the two savings
    "cuda_graphs": lambda v: {"cuda_graphs": "layer" if _flag("cuda_graphs", v) else "none"},
    # model-level torch.compile: Inductor's fused kernels at its launcher's host cost; 0 leaves the profile's
    "torch_compile": lambda v: {"kernel_fusion": "fused", "host_overhead": "compiled"}
    if _flag("torch_compile", v) else {},
    "grad_reduce_dtype": lambda v: {"grad_reduce_dtype": _choice("grad_reduce_dtype", v, ("fp32", "bf16", "fp16"))},
}
"""Runs schema v2 column -> the config keys a filled cell sets (ConfigError naming the column for a bad cell).
A stated cell overrides the framework profile's default; an empty cell leaves the profile's."""


def _v2_settings(row: Mapping, assumptions: list) -> dict:
    """Config keys of the row's framework profile (``framework`` / ``framework_version``, when flowsim has a
    profile of the release) and of its filled :data:`V2_SETTINGS` cells, with one assumption line saying which
    settings the row states (the profile's defaults are listed after build_config has applied them)."""
    out, stated = {}, []
    release = str(row.get("framework_version", "") or "")
    if release:
        from flowsim.config.profiles import find_release

        prof = find_release(release)
        if prof is not None:
            out.update(framework=prof.framework, framework_version=release)
        else:
            assumptions.append(f"framework_version: no flowsim profile of {release} (settings from the row only)")
    for column, to_config in V2_SETTINGS.items():
        text = str(row.get(column, "") or "").strip().lower()
        if text:
            out.update(to_config(text))
            stated.append(f"{column}={text}")
    if stated:
        assumptions.append("settings from the row: " + ", ".join(stated))
    return out


def row_to_config(row: Mapping) -> tuple[dict, tuple[str, ...]]:
    """Config mapping (for :func:`flowsim.config.build_config`) of one runs-CSV row, and its assumptions.

    Parameters
    ----------
    row : Mapping
        One row of :func:`read_runs` (a pandas Series or a dict with the :data:`REQUIRED_COLUMNS`).

    Returns
    -------
    config : dict
        Nested ``model`` / ``cluster`` / ``training`` mapping of Megatron-LM argument names.
    assumptions : tuple[str, ...]
        One ``"<column>: <what was assumed>"`` entry per empty cell that was filled with a default.

    Raises
    ------
    ConfigError
        When a cell needed to simulate the row is empty and has no clear default (model size, layout,
        GPU count, global batch), or the NIC rate is empty for a multi-node job on a GPU that no
        built-in cluster preset uses.

    Notes
    -----
    The rules are in the module docstring. Values are not range-checked here; build_config does that.
    """
    assumptions: list[str] = []

    def need(name):
        value = row[name]
        if not _known(value) or (isinstance(value, str) and not value):
            raise ConfigError(name, "empty in the runs CSV; needed to simulate the row")
        return _int_or_value(value)

    def default(name, value, text):
        if _known(row[name]) and row[name] != "":
            return _int_or_value(row[name])
        assumptions.append(f"{name}: empty, {text}")
        return value

    gated = bool(need("gated_mlp"))
    model = {
        "name": row["model"],
        "num_layers": need("num_layers"),
        "hidden_size": need("hidden_size"),
        "num_attention_heads": need("num_attention_heads"),
        "vocab_size": need("vocab_size"),
        "activation": "swiglu" if gated else "gelu",
        "normalization": "rmsnorm" if gated else "layernorm",
        "position_embedding": "rope" if gated else "learned",
        "add_bias_linear": not gated,
        "untie_embeddings_and_output_weights": gated,
    }
    for name, text in (("ffn_hidden_size", "assumed 4 * hidden_size"),
                       ("num_query_groups", "assumed num_attention_heads (no GQA)"),
                       ("kv_channels", "assumed hidden_size / num_attention_heads")):
        value = default(name, 0, text)
        if value:
            model[name] = value

    model.update(_moe_fields(row, assumptions))

    gpu = need("gpu")
    num_gpus, gpus_per_node = need("num_gpus"), need("gpus_per_node")
    cluster = {"gpu": gpu, "num_gpus": num_gpus}
    if gpu in NVL_HOST_GPUS:
        host = NVL_HOST_GPUS[gpu]
        cluster.update(gpus_per_node=host, nvlink_domain=gpus_per_node, nics_per_node=host, cpu="arm")
    else:
        cluster.update(gpus_per_node=gpus_per_node, nics_per_node=gpus_per_node)
    if _known(row.get("power_limit_w", math.nan)):
        cluster["power_limit_w"] = row["power_limit_w"]  # a non-default board power limit (schema v2)
    if _known(row["nic_gbps_per_gpu"]):
        cluster["nic_gbps"] = row["nic_gbps_per_gpu"]
    elif isinstance(num_gpus, int) and num_gpus <= cluster["gpus_per_node"]:
        assumptions.append("nic_gbps_per_gpu: empty, unused (single-node job)")
    else:
        preset = _preset_with_gpu(gpu)
        if preset is None and gpu in SYSTEM_NIC_GBPS:
            preset = {"nic_gbps": SYSTEM_NIC_GBPS[gpu][0], "name": SYSTEM_NIC_GBPS[gpu][1]}
        if preset is None:
            raise ConfigError("nic_gbps_per_gpu", "empty in the runs CSV and no built-in cluster preset uses "
                              "this GPU to assume it from", gpu)
        cluster["nic_gbps"] = preset["nic_gbps"]
        assumptions.append(f"nic_gbps_per_gpu: empty, assumed {preset['nic_gbps']:g} "
                           f"(cluster preset {preset['name']})")

    tp, pp = need("tp"), need("pp")
    distributed_optimizer = default("distributed_optimizer", 0, "assumed 0 (no distributed optimizer)")
    zero_stage = default("zero_stage", int(distributed_optimizer == 1), f"assumed {int(distributed_optimizer == 1)}")
    if distributed_optimizer == 1 and isinstance(zero_stage, int):
        zero_stage = max(zero_stage, 1)
    pp_text = f"with pp={pp} the source ran an interleaved schedule of unknown degree; simulated as 1F1B (vpp=1)"
    training = {
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "data_parallel_size": need("dp"),
        "context_parallel_size": need("cp"),
        "expert_model_parallel_size": default("ep", 1, "assumed 1"),
        "virtual_pipeline_model_parallel_size": default(
            "vpp", 1, pp_text if isinstance(pp, int) and pp > 1 else "assumed 1"),
        "sequence_parallel": default("sp", int(isinstance(tp, int) and tp > 1),
                                     "assumed on with tp > 1 (Megatron-style recipes)"),
        "micro_batch_size": default("micro_batch_size", *_default_micro_batch(row, pp)),
        "global_batch_size": need("global_batch_size"),
        "seq_length": need("seq_length"),
        "recompute_granularity": default("recompute", "none", "assumed none"),
        "precision": default("precision", "bf16", "assumed bf16"),
        "use_distributed_optimizer": distributed_optimizer,
        "zero_stage": zero_stage,
    }
    training.update(_v2_settings(row, assumptions))
    training.update(_software_facts(row, model["num_layers"], training, assumptions))
    if model.get("num_moe_experts"):
        training.update(_expert_layout(row, assumptions))
    return {"model": model, "cluster": cluster, "training": training}, tuple(assumptions)


def _moe_fields(row: Mapping, assumptions: list) -> dict:
    """MoE model fields of a row: experts, top-k, expert width, shared experts (as one shared MLP of
    ``moe_shared_experts * moe_ffn_hidden_size``), and from the notes the facts the schema has no column for:
    token-drop routing, leading dense layers ("first N layers dense") and DeepSeek MLA ranks ("q_lora_rank
    1536, kv_lora_rank 512, qk head dim 128 nope + 64 rope, v head dim 128")."""
    experts = row["moe_num_experts"]
    if not _known(experts) or experts <= 0:
        return {}
    if not _known(row["moe_topk"]):
        raise ConfigError("moe_topk", "empty in the runs CSV; needed to simulate the row")
    out = {"num_moe_experts": int(experts), "moe_router_topk": int(row["moe_topk"])}
    if _known(row["moe_ffn_hidden_size"]) and row["moe_ffn_hidden_size"] > 0:
        out["moe_ffn_hidden_size"] = int(row["moe_ffn_hidden_size"])
    shared = row["moe_shared_experts"]
    if _known(shared) and shared > 0:
        out["moe_shared_expert_intermediate_size"] = int(shared) * out.get("moe_ffn_hidden_size", 0)
    notes = str(row.get("notes", ""))
    if re.search(r"token-drop routing", notes):
        # NeMo's MegatronTokenDropCallback defaults (nemo/lightning/pytorch/callbacks/moe_token_drop.py)
        out.update(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
        assumptions.append("moe: token drop = capacity factor 1.0, padded to capacity (NeMo's token-drop defaults)")
    if re.search(r"force-balanced", notes):
        # Megatron-LM --moe-router-force-load-balancing: the benchmark router spreads tokens evenly
        out["moe_imbalance_factor"] = 1.0
        assumptions.append("moe: force-balanced routing (from the notes), imbalance factor 1")
    dense = re.search(r"first (\d+) layers dense", notes)
    if dense:
        out["moe_first_k_dense"] = int(dense.group(1))
        assumptions.append(f"moe_first_k_dense: {dense.group(1)} (from the notes)")
    mla = re.search(r"q_lora_rank (\d+), kv_lora_rank (\d+), qk head dim (\d+) nope \+ (\d+) rope, "
                    r"v head dim (\d+)", notes)
    if mla:
        q, kv, qk, rope, v = (int(x) for x in mla.groups())
        out.update(multi_latent_attention=True, q_lora_rank=q, kv_lora_rank=kv, qk_head_dim=qk,
                   qk_pos_emb_head_dim=rope, v_head_dim=v)
        assumptions.append("attention: MLA (ranks from the notes)")
    return out


def _expert_layout(row: Mapping, assumptions: list) -> dict:
    """Expert tensor parallelism and token dispatcher of a MoE row from the v2 columns ``etp`` and
    ``moe_token_dispatcher`` (empty: ETP 1 and Megatron-LM's default ``alltoall``), each stated in the row's
    assumptions whether read or assumed."""
    etp = row.get("etp", math.nan)
    out = {}
    if _known(etp) and etp != "":
        out["expert_tensor_parallel_size"] = _int_or_value(etp)
        assumptions.append(f"etp: {out['expert_tensor_parallel_size']} (from the CSV)")
    else:
        out["expert_tensor_parallel_size"] = 1
        assumptions.append("etp: empty, assumed 1")
    dispatcher = row.get("moe_token_dispatcher", "") or ""
    if dispatcher in ("alltoall", "allgather"):
        out["moe_token_dispatcher_type"] = dispatcher
        assumptions.append(f"moe_token_dispatcher: {dispatcher} (from the CSV)")
    elif dispatcher == "deepep":
        out.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep")
        assumptions.append("moe_token_dispatcher: flex with DeepEP (from the CSV)")
    elif dispatcher == "flex":
        # the runs README: "flex (Megatron flex dispatcher, e.g. HybridEP backend)"
        out.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")
        assumptions.append("moe_token_dispatcher: flex (from the CSV), backend assumed HybridEP")
    elif dispatcher:
        out["moe_token_dispatcher_type"] = dispatcher  # build_config names the allowed values
    else:
        out["moe_token_dispatcher_type"] = "alltoall"
        assumptions.append("moe_token_dispatcher: empty, assumed alltoall (Megatron-LM's default)")
    release = row.get("framework_version", "") or ""
    legacy = release in LEGACY_EXPERT_RELEASES
    out["expert_rank_order"] = "tp-cp-ep-dp-pp" if legacy else "tp-ep-dp-pp"
    assumptions.append(f"expert placement: {out['expert_rank_order']} (" + (
        f"{release} runs {LEGACY_EXPERT_RELEASES[release]}" if legacy else
        f"{release or 'no release stated'}: Megatron-core >= 0.10 order") + ")")
    return out


def _default_micro_batch(row: Mapping, pp) -> tuple[int, str]:
    """Micro-batch size for an empty cell, and the assumption's text: torchtitan splits each data-parallel
    rank's batch into as many micro-batches as there are pipeline stages unless told otherwise
    (``pipeline_parallel_microbatches`` defaults to the stage count); everything else gets 1."""
    local = row["global_batch_size"] / row["dp"] if _known(row["global_batch_size"]) and _known(row["dp"]) else 0
    if row.get("framework") == "torchtitan" and isinstance(pp, int) and pp > 1 and local and \
            float(local / pp).is_integer():
        return int(local // pp), f"assumed {int(local // pp)} (torchtitan's default: {pp} micro-batches, one per stage)"
    return 1, "assumed 1"


def _software_facts(row: Mapping, num_layers, training: dict, assumptions: list) -> dict:
    """Settings the schema has no column for, taken from the row's own source text (recorded as assumptions).

    * A source dated before FlashAttention (Dao et al., May 2022, arXiv 2205.14135) ran unfused attention.
    * ``tp-comm-overlap`` / "TP comm overlap" in the notes: tensor-parallel communication overlapped.
    * (These two, and eager kernels for torchtitan, only where the row's v2 columns ``attention_impl``,
      ``tp_comm_overlap`` and ``torch_compile`` do not state the setting: ``training`` holds what they state.)
    * Selective recompute outside Megatron-LM / NeMo is the source's own policy (:mod:`flowsim.model.recompute`):
      notes that say every n-th block (or layer-level) is checkpointed give ``selective_ac_option: N``, with
      N = 2 (torchtitan's default option) when the notes do not give it; other torchtitan rows run its
      op-level policy (``op``, the llama3 8B recipe's setting).
    * torchtitan rows whose notes do not say torch.compile ran eager kernels (``training.compile`` is off
      by default in torchtitan's job config): ``kernel_fusion: eager``.
    * torchtitan with FSDP and pipeline parallelism keeps each stage's parameters gathered after the forward
      (``apply_fsdp``: "for PP, do not reshard after forward to avoid per-microbatch all-gathers") and
      reduce-scatters the gradients once, after the last micro-batch's backward
      (``torch.distributed.pipelining`` ``PipelineStage.backward_maybe_with_nosync``): ``zero_stage: 2``
      with ``overlap_grad_reduce: false``.
    * Layers that do not divide into pp * vpp stages: Megatron-LM / NeMo recipes count the embedding and
      the loss as one layer each (``account_for_*_in_pipeline_split``, as in the Llama-3.1-405B recipes)
      when that makes them divide; otherwise the remainder is spread (``balanced``, the uniform
      partitioners of DeepSpeed and torchtitan).
    """
    out = {}
    year = re.search(r"(19|20)\d\d", str(row.get("source", "")))
    if year and int(year.group(0)) < 2022 and "use_flash_attn" not in training:
        out["use_flash_attn"] = False
        assumptions.append(f"attention: unfused (the source, {year.group(0)}, predates FlashAttention)")
    text = f"{row.get('notes', '')} {row.get('source_detail', '')}"
    if row.get("framework") == "torchtitan" and not re.search(r"torch\.compile", text) \
            and "kernel_fusion" not in training:
        out["kernel_fusion"] = "eager"
        why = "stated in the source notes" if re.search(r"\beager\b", text) else \
            "torchtitan without torch.compile, its default"
        assumptions.append(f"kernels: eager PyTorch ({why})")
    if training["recompute_granularity"] == "selective" and row.get("framework") not in ("megatron-lm", "nemo"):
        every = re.search(r"every (\d+|n)-?(?:th)? (?:block|layer)|layer-level selective", text, re.IGNORECASE)
        if every:
            n = every.group(1) if every.group(1) and every.group(1).isdigit() else None
            out["selective_ac_option"] = n or "2"
            if n:
                assumptions.append(f"recompute: every {n}-th block fully recomputed (from the notes)")
            else:
                assumptions.append("recompute: every 2nd block fully recomputed (n not stated; torchtitan's "
                                   "default option 2)")
        elif row.get("framework") == "torchtitan":
            out["selective_ac_option"] = "op"
            stated = re.search(r"per-op|\bop-level", text) and not re.search(r"op- or layer-level not stated", text)
            why = "stated in the notes" if stated else "not stated; the setting of torchtitan's llama3 8B recipe"
            assumptions.append(f"recompute: torchtitan op-level selective policy ({why})")
    if row.get("framework") == "torchtitan" and training["pipeline_model_parallel_size"] != 1 \
            and training["zero_stage"] == 3:
        out.update(zero_stage=2, overlap_grad_reduce=False)
        assumptions.append("fsdp with pp: torchtitan keeps parameters gathered after forward and reduce-scatters "
                           "gradients after the last backward (zero_stage 2, no overlap"
                           + (", whatever overlap_grad_reduce says for FSDP2 alone)"
                              if training.get("overlap_grad_reduce") else ")"))
    if re.search(r"tp[-_ ]comm[-_ ]overlap", text, re.IGNORECASE) and "tp_comm_overlap" not in training:
        out["tp_comm_overlap"] = True
        assumptions.append("tp_comm_overlap: on (stated in the source notes)")
    pp, vpp = training["pipeline_model_parallel_size"], training["virtual_pipeline_model_parallel_size"]
    if all(isinstance(x, int) and x > 0 for x in (num_layers, pp, vpp)) and num_layers % (pp * vpp):
        if row.get("framework") in ("megatron-lm", "nemo") and (num_layers + 2) % (pp * vpp) == 0:
            out["account_for_embedding_in_pipeline_split"] = True
            out["account_for_loss_in_pipeline_split"] = True
            assumptions.append("pipeline split: embedding and loss count as layers (Megatron-LM recipe)")
        else:
            out["pipeline_layer_split"] = "balanced"
            assumptions.append("pipeline split: balanced (layers do not divide into pp*vpp stages)")
    return out


SYSTEM_NIC_GBPS = {
    # curated/README.md "System facts used": Meta Grand Teton (torchtitan, Llama 3) 400 Gb/s per GPU
    "h100-sxm-hbm2e": (400.0, "Meta Grand Teton system facts in the runs README"),
}
"""NIC line rate per GPU for GPUs with no built-in cluster preset, from the runs README's system facts."""


def _preset_with_gpu(gpu: str) -> dict | None:
    """The first built-in cluster preset (by name) whose GPU is ``gpu``, with its name; None if none."""
    for name in list_presets("clusters"):
        preset = load_preset("clusters", name)
        if preset.get("gpu") == gpu:
            return preset
    return None


def _spearmanr(a, b):
    """scipy.stats.spearmanr, imported on first use (scipy.stats takes most of a second to import)."""
    from scipy import stats

    return stats.spearmanr(a, b)


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
    rho = float(_spearmanr(predicted_s, measured_s).statistic) if defined else math.nan
    return ErrorSummary(n=n, median_abs_error_pct=float(np.median(abs_err)), mape_pct=float(np.mean(abs_err)),
                        p90_abs_error_pct=float(np.percentile(abs_err, 90)), spearman=rho)


def _skip_reason(row: Mapping) -> str | None:
    """Why a row is not simulated before a config is built, or None."""
    from flowsim.gpu_specs import get_gpu

    measured = row["measured_step_time_s"]
    if not _known(measured):
        return "no measured step time"
    if not measured > 0:
        return f"measured_step_time_s: must be > 0 (got {measured:g})"
    try:
        get_gpu(row["gpu"])
    except ConfigError:
        return f"no GPU spec for {row['gpu']!r}"
    return None


def config_of_row(row: Mapping, calibration: str = "") -> tuple:
    """The config flowsim simulates for one row of :func:`read_runs`, or why the row is not simulated.

    Parameters
    ----------
    row : Mapping
        One row of :func:`read_runs`.
    calibration : str
        Calibration profile applied to the row (config key ``calibration``; empty = none).

    Returns
    -------
    (SimConfig or None, assumptions, reason or None)
        ``reason`` is a one-line text when the row is skipped (no measured step time, no GPU spec, or the
        ConfigError of a field the mapping or build_config rejects).
    """
    reason = _skip_reason(row)
    if reason is not None:
        return None, (), reason
    try:
        mapping, assumptions = row_to_config(row)
        if calibration:
            mapping["training"]["calibration"] = calibration
        cfg = build_config(mapping)
    except ConfigError as e:
        return None, (), str(e)
    if cfg.training.framework:
        filled = ", ".join(f"{k}={v}" for k, v in cfg.framework_defaults) or "none"
        assumptions += (f"settings from the {cfg.training.framework_version} profile: {filled}",)
    return cfg, assumptions, None


def _row_key(cfg) -> str:
    from flowsim.explore.point import config_key

    return config_key(cfg)


def _simulate_rows(configs: list, simulate: Callable, jobs: int, time_limit_s: float, progress: bool) -> dict:
    """Result (anything with ``step_time_s`` and ``fits_memory``) or skip reason of each distinct config, by
    :func:`flowsim.explore.point.config_key`: in this process with ``simulate`` when ``jobs`` is 1, else on
    :func:`flowsim.simulate_many`'s worker pool."""
    from flowsim.explore.runner import Progress, simulate_many
    from flowsim.explore.time_limit import TimeLimitExceeded, time_limit
    from flowsim.step.invariants import InvariantError, check_result
    from flowsim.step.result import Result

    distinct = {}
    for cfg in configs:
        distinct.setdefault(_row_key(cfg), cfg)
    if jobs != 1:
        frame = simulate_many(list(distinct.values()), jobs=jobs, progress=progress, time_limit_s=time_limit_s)
        out = {}
        for key, (_, r) in zip(distinct, frame.iterrows()):
            err = r["error"]
            known = err.startswith(("ConfigError: ", "TimeLimitExceeded: ", "InvariantError: "))
            out[key] = (err.split(": ", 1)[1] if known else err) if err else \
                SimpleNamespace(step_time_s=float(r["step_time_s"]), fits_memory=bool(r["fits_memory"]))
        return out
    out = {}
    bar = Progress(len(distinct), "validate", progress, unit="run")
    try:
        for key, cfg in distinct.items():
            try:
                with time_limit(time_limit_s):
                    out[key] = simulate(cfg)
                if isinstance(out[key], Result):
                    check_result(out[key])
            except (ConfigError, TimeLimitExceeded, InvariantError) as e:
                out[key] = str(e)
            bar.advance(1)
    finally:
        bar.close()
    return out


def validate_runs(path: str | Path, simulate: Callable | None = None, *,
                  only_ids=None, calibration: str = "", jobs: int = 1, time_limit_s: float = 0.0,
                  progress: bool = False) -> ValidationReport:
    """Simulate every row of a runs-schema-v1 CSV that flowsim supports and compare with the measurement.

    Parameters
    ----------
    path : str or Path
        The runs CSV.
    simulate : callable, optional
        ``simulate(SimConfig) -> Result``-like (anything with ``step_time_s`` and ``fits_memory``);
        default :func:`flowsim.simulate`. Tests pass a stand-in to check the arithmetic.
    only_ids : iterable of int, optional
        Compare only these row ids (others are neither simulated nor listed as skipped).
    calibration : str
        Calibration profile applied to every row (``--calibration``; a path or ``default``); empty = none.
    jobs : int
        Worker processes (:func:`flowsim.simulate_many`; 0 = one per CPU); 1 (default) simulates the rows in
        this process with ``simulate``. Identical configs are simulated once either way.
    time_limit_s : float
        Wall-clock limit of one row's simulation, seconds (0 = none): a row past it is skipped with the
        reason, the others go on.
    progress : bool
        Draw a progress line on stderr (rows simulated).

    Returns
    -------
    ValidationReport
        Per-row comparison, summary (overall and per ``source``), and the skipped rows with reasons:
        malformed lines, no measured step time, MoE models, GPUs without a spec, a config that
        build_config rejects, and layouts the simulator rejects (the ConfigError message).

    Raises
    ------
    ConfigError
        When the file cannot be read or lacks a required column, or an id of ``only_ids`` is not in it.
    """
    if simulate is None:
        from flowsim.step.simulate import simulate
    runs, skipped = read_runs(path)
    if only_ids is not None:
        wanted = [int(i) for i in only_ids]
        absent = sorted(set(wanted) - set(runs["id"]) - {s.id for s in skipped})
        if absent:
            raise ConfigError("only_ids", "not in the runs file", ", ".join(map(str, absent)))
        runs = runs[runs["id"].isin(wanted)]
        skipped = [s for s in skipped if s.id in wanted]
    rows: list[RunComparison] = []
    built = [(row, *config_of_row(row, calibration)) for _, row in runs.iterrows()]
    results = _simulate_rows([cfg for _, cfg, _, reason in built if reason is None], simulate, jobs, time_limit_s,
                             progress)
    for row, cfg, assumptions, reason in built:
        if reason is None:
            result = results[_row_key(cfg)]
            if isinstance(result, str):
                reason = result
        if reason is not None:
            skipped.append(SkippedRun(int(row["id"]), reason))
            continue
        t = cfg.training
        measured = float(row["measured_step_time_s"])
        predicted = float(result.step_time_s)
        rows.append(RunComparison(
            id=int(row["id"]), source=row["source"], model=row["model"], gpu=row["gpu"],
            num_gpus=cfg.cluster.num_gpus, tp=t.tp, pp=t.pp, dp=t.dp, cp=t.cp,
            predicted_step_time_s=predicted, measured_step_time_s=measured,
            error_pct=(predicted - measured) / measured * 100.0, fits_memory=bool(result.fits_memory),
            assumptions=assumptions,
            family="moe" if cfg.model.is_moe else ("dense-fsdp" if t.zero_stage >= 2 else "dense")))
    by_source: dict[str, list[RunComparison]] = {}
    by_family: dict[str, list[RunComparison]] = {}
    for r in rows:
        by_source.setdefault(r.source, []).append(r)
        by_family.setdefault(r.family, []).append(r)
    return ValidationReport(
        by_family={f: summarize([r.predicted_step_time_s for r in rs], [r.measured_step_time_s for r in rs])
                   for f, rs in sorted(by_family.items())},
        rows=tuple(rows),
        summary=summarize([r.predicted_step_time_s for r in rows], [r.measured_step_time_s for r in rows]),
        by_source={src: summarize([r.predicted_step_time_s for r in rs], [r.measured_step_time_s for r in rs])
                   for src, rs in by_source.items()},
        skipped=tuple(skipped))
