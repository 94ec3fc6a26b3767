"""How a config's transformer layers and parameters split over pipeline stages and model chunks.

:func:`chunk_layer_counts` places the layers (and the MoE layers among them) on each (stage, chunk),
:func:`stage_params` counts the parameters each stage holds, and :func:`stage_split` gives both with the recomputed
layers, built once per set of the fields they read (:func:`split_key`): the configs of a tune that differ in what
the split does not read (batch, data-parallel size, ZeRO stage, micro-batch size, sequence parallelism, ...) share
one (gpt3-175b on 1,024 H100, the default tune space: 49,548 configs, 348 keys).
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import numpy as np

from flowsim.config import SimConfig
from flowsim.config.layout import end_chunks, parse_pipeline_layout
from flowsim.model import recompute
from flowsim.model.memo import BoundedCache
from flowsim.model.moe import expert_params_per_gpu


def padded_vocab(cfg: SimConfig) -> int:
    """Vocabulary padded to a multiple of 128 x tp, as Megatron-LM's ``make_vocab_size_divisible_by``."""
    mult = 128 * cfg.training.tp
    return -(-cfg.model.vocab_size // mult) * mult



def layer_params(cfg: SimConfig, moe: bool = False) -> float:
    """Parameters of one transformer layer held by one GPU, routed experts excluded (see
    :func:`flowsim.model.moe.expert_params_per_gpu`): TP-sharded weights plus replicated norms and router."""
    m, tp = cfg.model, cfg.training.tp
    h, d, f = m.hidden_size, m.kv_channels, m.ffn_hidden_size
    a, g = m.num_attention_heads, m.num_query_groups
    if moe:
        sharded = m.attention_weights() + m.mlp_weights(m.moe_shared_expert_intermediate_size)
        replicated = h * m.num_moe_experts  # router
    else:
        sharded = m.attention_weights() + m.mlp_weights(f)
        replicated = 0
    if m.add_bias_linear:
        sharded += d * (a + 2 * g) + f * (2 if m.gated else 1)
    replicated += 2 * h * (2 if m.normalization == "layernorm" else 1) + (2 * h if m.add_bias_linear else 0)
    return sharded / tp + replicated


def chunk_layer_counts(cfg: SimConfig, with_moe: bool = False):
    """Transformer layers per (pipeline stage, model chunk), int64[p, v] (and, ``with_moe``, how many of
    them are MoE layers, same shape).

    Virtual stage ``k = c * p + s`` (Megatron-LM's interleaved assignment) holds layers in order. With
    ``account_for_embedding_in_pipeline_split`` (``..._loss_...``) the embedding (loss) counts as one
    layer of virtual stage 0 (the last). ``balanced`` gives the remainder layers one each to the virtual
    stages after the first. The ``mtp_num_layers`` multi-token prediction layers join the last virtual stage
    (as MoE layers when the decoder's last layer is one). ``pipeline_model_parallel_layout`` gives each virtual
    stage its own count (its ``t`` symbols; ``E``, ``L`` and ``m`` sit where the rules above put them). DualPipe
    (DeepSeek-V3 report sec. 3.2.1) splits the model into ``p`` stages and gives stage ``s`` two chunks: model
    stage ``s`` (chunk 0, the pipeline fed at stage 0) and model stage ``p - 1 - s`` (chunk 1, the pipeline fed
    at stage ``p - 1``), so each GPU holds two stages' layers.
    """
    t = cfg.training
    p, v = t.pp, t.vpp
    k = p * v
    if t.pipeline_model_parallel_layout:  # Megatron-core's explicit layout: the t of each virtual stage
        per = np.array([s.count("t") for s in parse_pipeline_layout(t.pipeline_model_parallel_layout)],
                       dtype=np.int64)
    else:
        e = int(t.account_for_embedding_in_pipeline_split)
        lo = int(t.account_for_loss_in_pipeline_split)
        total = cfg.model.num_layers + e + lo
        per = np.full(k, total // k, dtype=np.int64)
        rem = total % k
        per[1:1 + rem] += 1
        if rem > k - 1:  # only with one virtual stage
            per[0] += rem - (k - 1)
        per[0] -= e
        per[-1] -= lo
    # virtual stage idx is (stage idx % p, chunk idx // p); its MoE layers from the model's running count
    ends = np.cumsum(per)
    before = moe_layers_before(cfg.model)
    counts = per.reshape(v, p).T.copy()
    moe = np.where(per > 0, before[np.clip(ends, 0, None)] - before[np.clip(ends - per, 0, None)], 0)
    moe = moe.reshape(v, p).T.copy()
    # multi-token prediction layers follow the decoder on the last virtual stage (Megatron-LM builds the MTP
    # block beside the output layer)
    counts[p - 1, v - 1] += cfg.model.mtp_num_layers
    moe[p - 1, v - 1] += cfg.model.mtp_num_layers * cfg.model.mtp_moe()
    if t.schedule == "dualpipe":
        counts, moe = np.hstack([counts, counts[::-1]]), np.hstack([moe, moe[::-1]])
    return (counts, moe) if with_moe else counts


# MoE layers before each layer index, by model (moe_layers_before)
_MOE_BEFORE = BoundedCache(64)


def moe_layers_before(m) -> np.ndarray:
    """int64[num_layers + 1]: how many of the first ``i`` layers of model ``m`` are MoE layers
    (:meth:`flowsim.config.ModelConfig.moe_layer`), read-only, built once per model."""
    def build():
        out = np.concatenate([[0], np.cumsum([m.moe_layer(i) for i in range(m.num_layers)], dtype=np.int64)])
        out.flags.writeable = False
        return out

    return _MOE_BEFORE.get(m, build)


def stage_params(cfg: SimConfig, chunk_layers: np.ndarray, moe_layers: np.ndarray | None = None) -> tuple:
    """Parameters held by one GPU of each pipeline stage, routed experts excluded (TP-sharded, before ZeRO
    sharding)."""
    m, t = cfg.model, cfg.training
    h, v = m.hidden_size, padded_vocab(cfg)
    moe_layers = np.zeros_like(chunk_layers) if moe_layers is None else moe_layers
    # stages holding the embedding and the LM head (DualPipe's two paths put both on each end rank)
    first, last = ({sc for sc, _ in ends} for ends in end_chunks(t.schedule, t.pp, t.vpp))
    out = []
    dense_params, moe_params = layer_params(cfg), layer_params(cfg, moe=True)
    for s in range(t.pp):
        n_moe = int(moe_layers[s].sum())
        n = (int(chunk_layers[s].sum()) - n_moe) * dense_params + n_moe * moe_params
        if s in first:
            n += v * h / t.tp + (cfg.seq_length * h if m.position_embedding == "learned" else 0)
        if s in last:
            norm = h * (2 if m.normalization == "layernorm" else 1)
            n += norm + m.mtp_num_layers * (2 * h * h / t.tp + 3 * norm)  # MTP projections and norms
            if m.untie_embeddings_and_output_weights or t.pp > 1:
                # a tied head on another stage keeps its own copy of the word embedding (Megatron-LM)
                n += v * h / t.tp
        out.append(float(n))
    return tuple(out)


class StageSplit(NamedTuple):
    """The split of one config (arrays read-only; the :class:`flowsim.model.workload.Workload` fields of the same
    names).

    Attributes
    ----------
    chunk_layers, chunk_recompute_layers, chunk_moe_layers, chunk_recompute_moe_layers : int64[p, v]
        Transformer layers per (stage, chunk), those that re-run their ``recompute`` rows, and how many of each
        are MoE layers.
    stage_params, stage_expert_params : tuple[float, ...]
        Parameters one GPU of each stage holds, routed experts excluded (TP-sharded, before ZeRO sharding), and
        its routed-expert parameters, counts.
    """

    chunk_layers: np.ndarray
    chunk_recompute_layers: np.ndarray
    chunk_moe_layers: np.ndarray
    chunk_recompute_moe_layers: np.ndarray
    stage_params: tuple
    stage_expert_params: tuple


# The training fields the split reads (chunk_layer_counts, recompute.recompute_layer_counts, stage_params,
# padded_vocab, layer_params, expert_params_per_gpu; properties by their names); the model and the sequence length
# complete the key. tests/test_tune_speed_split.py checks that the split reads nothing else.
SPLIT_FIELDS = ("tp", "pp", "vpp", "schedule", "pipeline_model_parallel_layout",
                "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                "recompute_granularity", "selective_ac_option", "recompute_num_layers", "ep",
                "expert_tensor_parallel_size")
_SPLIT_VALUES = operator.attrgetter(*SPLIT_FIELDS)
# Splits by split_key, 4,096 kept (a few KB each; the default tune space of gpt3-175b on 1,024 H100 has 348)
_SPLITS = BoundedCache(4096)


def split_key(cfg: SimConfig) -> tuple:
    """What :func:`stage_split` reads: the model, the sequence length and the :data:`SPLIT_FIELDS` of training."""
    return (cfg.model, cfg.seq_length) + _SPLIT_VALUES(cfg.training)


def stage_split(cfg: SimConfig) -> StageSplit:
    """The :class:`StageSplit` of ``cfg`` (a validated SimConfig), built once per :func:`split_key` and shared."""
    return _SPLITS.get(split_key(cfg), lambda: _stage_split(cfg))


def _stage_split(cfg: SimConfig) -> StageSplit:
    t = cfg.training
    layers, moe = chunk_layer_counts(cfg, with_moe=True)
    rec = recompute.recompute_layer_counts(t, layers)
    # recomputed layers split between the kinds in proportion (layers of a chunk are recomputed in order)
    rec_moe = np.where(layers > 0, np.rint(rec * moe / np.maximum(layers, 1)), 0).astype(np.int64)
    for a in (layers, moe, rec, rec_moe):
        a.flags.writeable = False
    experts = expert_params_per_gpu(cfg) if cfg.model.is_moe else 0.0
    return StageSplit(layers, rec, moe, rec_moe, stage_params(cfg, layers, moe),
                      tuple(float(moe[s].sum()) * experts for s in range(t.pp)))
