"""Activation recompute: which forward ops a transformer layer re-runs in its backward pass, and on which layers.

A layer's op table (:mod:`flowsim.model.workload`) holds the ops it re-runs as rows of phase ``recompute``; the
workload's ``chunk_recompute_layers`` says how many layers of each pipeline chunk run them. Four policies,
each as the framework that names it implements it:

* ``full`` (Megatron-LM ``--recompute-granularity full``): the whole forward of the layer, its tensor-parallel
  collectives included, on ``recompute_num_layers`` layers per chunk (Megatron's ``block`` method; 0 = all).
* ``modules`` (Megatron-LM ``--recompute-granularity selective --recompute-modules ...``, megatron-core
  ``TransformerConfig.recompute_modules``): the listed submodules of every layer
  (:data:`flowsim.config.training.MEGATRON_MODULES`; ``core_attn``, the default, re-runs the attention kernel,
  Korthikanti et al. 2022 sec. 5).
* ``op`` (torchtitan ``activation_checkpoint.selective_ac_option = "op"``, the llama3 8B recipe): every layer
  re-runs each op of its forward except those in torchtitan's ``_save_list``, whose outputs are kept: the
  attention kernel and ``aten.mm``, except that every second ``mm`` of a block is recomputed (the block's
  ``forward_mm_count`` policy). Linear layers with a bias run ``aten.addmm``, which is not in the list.
  Source: torchtitan ``parallelize_llama.py``, ``_apply_ac_to_transformer_block`` and its ``_custom_policy``
  (torchtitan 9dec370, the commit of its Dec 2024 H100 benchmarks).
* ``every_n`` (torchtitan ``selective_ac_option`` = an integer N): every N-th block of a pipeline rank (the
  counter runs over the rank's blocks in order, one process per rank) is wrapped in a full checkpoint.
"""
from __future__ import annotations

import numpy as np

from flowsim._moved import module_getattr

POLICIES = ("none", "full", "modules", "op", "every_n")

__getattr__ = module_getattr(__name__)  # MEGATRON_MODULES moved to flowsim.config.training


def policy(t) -> str:
    """The recompute policy of a :class:`flowsim.config.TrainingConfig` (one of :data:`POLICIES`)."""
    if t.recompute_granularity == "none":
        return "none"
    if t.recompute_granularity == "full":
        return "full"
    if t.selective_ac_option == "op":
        return "op"
    if t.selective_ac_option:
        return "every_n"
    return "modules"


def recomputes(t, module: str) -> bool:
    """Whether the layer re-runs Megatron-core submodule ``module`` (a key of
    :data:`flowsim.config.training.MEGATRON_MODULES`) in backward: always under ``full`` and ``every_n`` (on the
    layers they recompute), when listed under ``modules``, never under ``op`` (which works op by op,
    :func:`op_sac_projections`)."""
    p = policy(t)
    if p in ("full", "every_n"):
        return True
    return p == "modules" and module in t.recompute_modules


def op_sac_projections(gated: bool, bias: bool) -> tuple[str, ...]:
    """Projections of a dense block that torchtitan's op policy recomputes, in forward order.

    torchtitan's Llama block runs its matmuls as ``wq, wk, wv`` (attention inputs), ``wo``, then ``w1``
    (gate), ``w3`` (up), ``w2`` (down) in ``w2(silu(w1(x)) * w3(x))``; the policy keeps the odd-numbered
    ``aten.mm`` outputs and recomputes the even ones (``wk``, ``wo``, ``w3``). Without a gate the MLP is
    ``w2(act(w1(x)))`` and the even ones are ``wk``, ``wo``, ``w2``. With biases every projection is an
    ``addmm`` and none is saved. Names: ``q k v o gate up down``.
    """
    order = ("q", "k", "v", "o") + (("gate", "up", "down") if gated else ("up", "down"))
    if bias:
        return order
    return tuple(name for i, name in enumerate(order, start=1) if i % 2 == 0)


def recompute_layer_counts(t, layers: np.ndarray) -> np.ndarray:
    """Layers of each (pipeline stage, model chunk) that run their ``recompute`` rows, int64[p, v].

    ``layers`` is :func:`flowsim.model.workload.chunk_layer_counts`. ``modules`` and ``op`` recompute part of every
    layer; ``full`` the first ``recompute_num_layers`` of each chunk (all when 0); ``every_n`` the blocks
    numbered N, 2N, ... along each rank's chunks in order.
    """
    p = policy(t)
    if p == "none":
        return np.zeros_like(layers)
    if p in ("modules", "op"):
        return layers.copy()
    if p == "full":
        return np.minimum(layers, t.recompute_num_layers) if t.recompute_num_layers else layers.copy()
    n = int(t.selective_ac_option)
    ends = np.cumsum(layers, axis=1)
    return (ends // n - (ends - layers) // n).astype(np.int64)
