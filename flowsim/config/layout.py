"""Rules of the parallel layout that every layer above the config reads: Megatron-LM's rank order (the size
and stride of each communicator) and which model chunks and micro-batches a pipeline schedule places where.

Pure Python: the pipeline simulator (:mod:`flowsim.step.schedule`, numba) builds on these rules, and the
config checks them without loading it.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from flowsim.errors import ConfigError

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe")
"""Pipeline schedules flowsim simulates (:mod:`flowsim.step.schedule`), in the order of its integer ids."""


EXPERT_RANK_ORDERS = ("tp-ep-dp-pp", "tp-cp-ep-dp-pp")
"""Megatron-core's rank orders for expert layers, newest first.

* ``tp-ep-dp-pp`` (Megatron-core >= 0.10, "MoE parallel folding"): NVIDIA/Megatron-LM core_r0.10.0
  megatron/core/parallel_state.py ``initialize_model_parallel`` builds ``expert_decoder_rank_generator =
  RankGenerator(tp=expert_tensor_parallel_size, ep=expert_model_parallel_size, dp=expert_data_parallel_size,
  pp=pipeline_model_parallel_size, cp=1)``: an EP group is ``ep`` ranks ``etp`` apart, so with ETP 1 it is
  ``ep`` consecutive GPUs whatever the attention layout.
* ``tp-cp-ep-dp-pp`` (Megatron-core <= 0.9): core_r0.9.0 megatron/core/parallel_state.py builds one
  ``RankGenerator(tp, ep, dp, pp, cp, order="tp-cp-ep-dp-pp")`` and takes the expert groups out of the
  data-parallel dimension (``get_ranks('ep', independent_ep=True)``): experts are split by the attention's
  TP group, an EP group is ``ep`` ranks ``tp * cp`` apart (EP 8 with TP 4 spans 32 GPUs, four 8-GPU nodes)
  and ``data_parallel_size`` must be a multiple of ``ep``.
"""

LEGACY_EXPERT_RELEASES = {
    # framework_version (flowsim.config.profiles) -> Megatron-core release it runs, all before core_r0.10.0
    "megatron-lm-2021-04": "before Megatron-core",
    "megatron-lm-core_r0.8": "core_r0.8",
    "mlperf-v3.1-nemo": "NeMo of 2023 (Megatron-core < 0.5)",
    "nemo-24.03.01": "NeMo 24.03 (Megatron-core 0.5-0.6)",
    "nemo-24.07": "NeMo 24.07 (Megatron-core 0.8)",
}
"""Framework releases that place experts in the ``tp-cp-ep-dp-pp`` order; every other release (NeMo 25.x and
Megatron-Bridge, built on Megatron-core >= 0.10) and no release at all get ``tp-ep-dp-pp``."""


def expert_rank_order(training) -> str:
    """The expert rank order of a training config: ``expert_rank_order`` when set, else the one its
    ``framework_version`` runs (:data:`LEGACY_EXPERT_RELEASES`), else Megatron-core's current ``tp-ep-dp-pp``."""
    if training.expert_rank_order:
        return training.expert_rank_order
    return "tp-cp-ep-dp-pp" if training.framework_version in LEGACY_EXPERT_RELEASES else "tp-ep-dp-pp"


def check_expert_layout(training) -> None:
    """Raise ConfigError when the expert layout breaks the rules of its rank order (:data:`EXPERT_RANK_ORDERS`).

    ``tp-ep-dp-pp``: ``ep * etp`` divides the ``tp * cp * dp`` ranks of a stage. ``tp-cp-ep-dp-pp``: ETP is the
    TP size (experts are split by the attention's TP group), ``ep`` divides ``dp``, and without context
    parallelism (its expert groups with CP are not evenly strided, which flowsim does not model).
    """
    t = training
    order, etp = expert_rank_order(t), t.expert_tensor_parallel_size
    if order not in EXPERT_RANK_ORDERS:
        raise ConfigError("expert_rank_order", f"must be one of {', '.join(EXPERT_RANK_ORDERS)}", order)
    if order == "tp-ep-dp-pp":
        if (t.tp * t.cp * t.dp) % (t.ep * etp):
            raise ConfigError("expert_model_parallel_size", "expert_model_parallel_size * "
                              "expert_tensor_parallel_size must divide tp * cp * dp",
                              f"{t.ep}*{etp} and {t.tp}*{t.cp}*{t.dp}")
        return
    if etp != t.tp:
        raise ConfigError("expert_tensor_parallel_size", "must equal tensor_model_parallel_size with expert rank "
                          "order tp-cp-ep-dp-pp (Megatron-core <= 0.9 splits experts by the TP group)",
                          f"{etp} and tp {t.tp}")
    if t.dp % t.ep:
        raise ConfigError("expert_model_parallel_size", "must divide data_parallel_size with expert rank order "
                          "tp-cp-ep-dp-pp (Megatron-core <= 0.9 takes EP out of DP)", f"{t.ep} and dp {t.dp}")
    if t.ep > 1 and t.cp > 1:
        raise ConfigError("context_parallel_size", "with expert parallelism in expert rank order tp-cp-ep-dp-pp "
                          "is not modelled (its expert groups are not evenly strided)", t.cp)


def group_spans(training) -> dict[str, tuple[int, int]]:
    """(ranks, stride between consecutive members' global ranks) of each communicator kind.

    Megatron-LM's rank order (``tp`` fastest, then ``cp``, ``dp``, ``pp``; a pipeline stage holds
    ``tp * cp * dp`` consecutive ranks). Expert layers follow the release's expert rank order
    (:func:`expert_rank_order`, :data:`EXPERT_RANK_ORDERS`).

    Parameters
    ----------
    training : flowsim.config.TrainingConfig
        A resolved training config (``data_parallel_size`` filled in).

    Returns
    -------
    dict
        ``tp``, ``cp``, ``dp`` (the gradient-reduction group: data- and context-parallel ranks), ``dps`` and
        ``dpr`` (hybrid sharding: shard groups of ``dp_shard`` consecutive DP ranks, replicas across them),
        ``pp`` (a pair of neighbouring stages), ``etp``, ``ep``, ``edp`` (expert data parallel) and ``tpep``
        (the all-gather token dispatcher's group, Megatron-LM ``tp_ep_group``); with the flex dispatcher's
        ``moe_flex_nvlink_ranks`` set, ``epn`` (the members of an EP group inside one NVLink stage) and ``epx``
        (one member per stage, at the same place in each: the rail of its network stage).
    """
    t = training
    return dict(_spans(t.tp, t.cp, t.dp, t.dp_shard, t.ep, t.expert_tensor_parallel_size, expert_rank_order(t),
                       t.moe_flex_nvlink_ranks))


@functools.lru_cache(maxsize=4096)  # a tune's ~50,000 layouts have a few dozen (gpt3-175b on 1,024 GPUs: 94)
def _spans(tp: int, cp: int, dp: int, dp_shard: int, ep: int, etp: int, order: str, flex_ranks: int) -> dict:
    """:func:`group_spans` by the fields it reads (read-only: the caller gets a copy)."""
    stage = tp * cp * dp
    if order == "tp-ep-dp-pp":
        experts = {"etp": (etp, 1), "ep": (ep, etp), "edp": (stage // (ep * etp), ep * etp), "tpep": (etp * ep, 1)}
    else:  # EP out of DP, experts split by TP; check_expert_layout keeps cp 1 when ep > 1
        experts = {"etp": (tp, 1), "ep": (ep, tp * cp), "edp": (dp // ep, tp * cp * ep), "tpep": (tp * ep, 1)}
    spans = {
        "tp": (tp, 1),
        "cp": (cp, tp),
        "dp": (dp * cp, tp),
        "dps": (dp_shard, tp),
        "dpr": (dp * cp // dp_shard, tp * dp_shard),
        "pp": (2, stage),
        **experts,
    }
    if flex_ranks:
        stride = spans["ep"][1]
        inside = min(ep, max(flex_ranks // stride, 1))  # EP members per NVLink stage
        spans.update(epn=(inside, stride), epx=(max(ep // inside, 1), stride * inside))
    return spans


def chunks_per_stage(schedule: str, vpp: int) -> int:
    """Model chunks each pipeline stage holds: 2 for DualPipe (one per direction), else ``vpp``."""
    return 2 if schedule == "dualpipe" else vpp


def microbatches_per_chunk(schedule: str, m: int, v: int) -> np.ndarray:
    """int64[v]: micro-batches that pass through each model chunk of a stage in one step.

    DualPipe sends half of the ``m`` micro-batches each way, each through one chunk; the other schedules
    send every micro-batch through every chunk.
    """
    return np.full(v, m // 2 if schedule == "dualpipe" else m, dtype=np.int64)


def end_chunks(schedule: str, p: int, v: int) -> tuple[tuple, tuple]:
    """((stage, chunk) of each path's first virtual stage, ... of each path's last): where the embedding
    and the LM head / loss run. DualPipe's two paths start at opposite ends."""
    if schedule == "dualpipe":
        return ((0, 0), (p - 1, 1)), ((p - 1, 0), (0, 1))
    return ((0, 0),), ((p - 1, v - 1),)


PIPELINE_LAYOUT_SYMBOLS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
"""Symbols of Megatron-core's ``pipeline_model_parallel_layout`` (megatron-core 0.14.0
``transformer/pipeline_parallel_layer_layout.py``, ``PipelineParallelLayerLayout.from_str``): ``E`` the embedding,
``t`` a transformer (decoder) layer, ``m`` a multi-token prediction layer, ``L`` the loss (output layer); ``|``
separates virtual pipeline stages, ``X*n`` and ``(...)*n`` repeat, commas are cosmetic."""


def parse_pipeline_layout(text: str) -> tuple:
    """Virtual stages of a ``pipeline_model_parallel_layout`` string, in model order, each a string of
    :data:`PIPELINE_LAYOUT_SYMBOLS` (``"Et*3|(tt|)*2L"`` -> ``("Ettt", "tt", "ttL")``).

    Virtual stage ``k`` runs on pipeline rank ``k % pp`` as its model chunk ``k // pp`` (Megatron-LM's
    interleaved assignment, as :func:`flowsim.model.workload.chunk_layer_counts` numbers them). Raises
    ConfigError naming ``pipeline_model_parallel_layout`` for a symbol outside the table or a malformed repeat.
    """
    field = "pipeline_model_parallel_layout"
    s = str(text).replace(",", "").replace(" ", "")
    group = re.compile(r"\(([^()]*)\)\*(\d+)")
    while group.search(s):
        s = group.sub(lambda g: g.group(1) * int(g.group(2)), s)
    s = re.sub(r"([EtmL])\*(\d+)", lambda g: g.group(1) * int(g.group(2)), s)
    bad = set(s) - set(PIPELINE_LAYOUT_SYMBOLS) - {"|"}
    if bad:
        raise ConfigError(field, "may hold only E, t, m, L, |, commas and repeats X*n or (...)*n",
                          f"{text!r} ({''.join(sorted(bad))})")
    return tuple(s.split("|"))


def check_pipeline_layout(training, num_layers: int, mtp_num_layers: int = 0) -> tuple:
    """The virtual stages of ``training.pipeline_model_parallel_layout`` (:func:`parse_pipeline_layout`) once it
    passes Megatron-core's rules (``PipelineParallelLayerLayout.validate_layer_layout``): ``pp * vpp`` stages,
    ``num_layers`` ``t`` and ``mtp_num_layers`` ``m`` symbols, one ``E`` leading the first stage and one ``L``
    closing the last. flowsim also runs the multi-token prediction layers in the last stage, beside the loss, and
    takes the layout instead of the other split options; any break raises ConfigError naming the field.
    """
    field = "pipeline_model_parallel_layout"
    t = training
    stages = parse_pipeline_layout(t.pipeline_model_parallel_layout)
    joined = "|".join(stages)
    if len(stages) != t.pp * t.vpp:
        raise ConfigError(field, "must list pipeline_model_parallel_size * virtual_pipeline_model_parallel_size "
                          "stages", f"{len(stages)} stages for {t.pp}*{t.vpp}")
    if joined.count("t") != num_layers:
        raise ConfigError(field, "must hold num_layers transformer layers (t)",
                          f"{joined.count('t')} t for {num_layers} layers")
    if joined.count("E") != 1 or not stages[0].startswith("E"):
        raise ConfigError(field, "needs one embedding (E), first in the first stage", t.pipeline_model_parallel_layout)
    if joined.count("L") != 1 or not stages[-1].endswith("L"):
        raise ConfigError(field, "needs one loss (L), last in the last stage", t.pipeline_model_parallel_layout)
    if joined.count("m") != mtp_num_layers or "m" in joined[:-len(stages[-1])]:
        raise ConfigError(field, "must hold mtp_num_layers multi-token prediction layers (m), all in the last "
                          "stage", f"{joined.count('m')} m for {mtp_num_layers} layers")
    if t.pipeline_schedule == "dualpipe" or t.account_for_embedding_in_pipeline_split \
            or t.account_for_loss_in_pipeline_split or t.pipeline_layer_split != "even":
        raise ConfigError(field, "replaces account_for_*_in_pipeline_split and pipeline_layer_split (Megatron-core "
                          "takes one split option) and does not run with dualpipe, which places its own chunks",
                          t.pipeline_model_parallel_layout)
    return stages


def check_layout(schedule: str, p: int, v: int, m: int) -> None:
    """Raise ConfigError when ``schedule`` cannot run ``m`` micro-batches on ``p`` stages of ``v`` chunks.

    DualPipe needs an even ``p``, two chunks and an even ``m >= 2p`` (``DualPipe.step`` asserts
    ``num_ranks % 2 == 0`` and ``num_chunks % 2 == 0 and num_chunks >= num_ranks * 2``).
    """
    if schedule not in PIPELINE_SCHEDULES:
        raise ConfigError("pipeline_schedule", f"must be one of {', '.join(PIPELINE_SCHEDULES)}", schedule)
    if schedule == "dualpipe":
        if p % 2 or v != 2:
            raise ConfigError("pipeline_schedule", "dualpipe runs two chunks on an even number of stages",
                              f"pp={p}, chunks={v}")
        if m % 2 or m < 2 * p:
            raise ConfigError("global_batch_size", "dualpipe needs an even number of micro-batches, at least "
                              "2 * pipeline_model_parallel_size", f"{m} micro-batches, pp={p}")
    elif schedule != "interleaved" and v != 1:
        raise ConfigError("pipeline_schedule", f"{schedule} runs one model chunk per stage", f"vpp={v}")
