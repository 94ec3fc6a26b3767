"""Sane bounds on config values: what any real job or cluster could have, each limit with its reason.

The limits keep one simulation finite in time and memory (no hang, no MemoryError, no integer overflow in
the op tables) while staying far above every published training run. Each one is checked at the boundary
(the config classes' ``validate``) and broken ones raise :class:`flowsim.ConfigError` naming the field and
the limit.
"""
from __future__ import annotations

import math

from flowsim.errors import ConfigError

# --- model sizes -------------------------------------------------------------------------------------------
# Published dense and MoE models have at most ~126-160 layers (Llama 3 405B: 126; Megatron-LM's 1T GPT:
# 128, arXiv 2104.04473 Tab. 1): 10,000 is ~60x that, and a layer table this long still builds in < 0.1 s.
MAX_LAYERS = 10_000
# Widest published models: hidden 25,600 (Megatron 1T GPT), ffn 4 x that; 2**18 (262,144) is 10x. Bounding
# width also bounds the FLOP counts (h * ffn * tokens) well inside float64 and int64.
MAX_HIDDEN = 2**18
MAX_FFN = 2**20
# Heads: at most 128-160 in published models (GPT-3 175B: 96, Megatron 1T: 160); 4,096 is 25x.
MAX_HEADS = 4096
# Per-head widths (kv_channels, MLA head dims): 128-256 in practice; 2**14 bounds them with room.
MAX_HEAD_DIM = 2**14
# MLA ranks (DeepSeek-V3: q 1,536, kv 512): bounded by the model width.
MAX_LORA_RANK = MAX_HIDDEN
# Vocabularies: at most 256k (Gemma 3: 262,144); 2**22 is 16x.
MAX_VOCAB = 2**22
# Routed experts: at most 384 (Kimi K2) in production; 2**14 leaves room for fine-grained-expert research.
MAX_EXPERTS = 2**14
# Parameters of a whole model: the largest published are 1.0-1.6T (Kimi K2 1.04T, Switch-C 1.57T); 2**45
# (3.5e13) is ~20x. Each sized field can be in range while their product is not: 16,288 experts of hidden
# 16,288 make 1.8e15 parameters, whose 45M default (40M-parameter) gradient buckets take ~25 s to lay out.
MAX_PARAMETERS = 2**45
# Sequence length: the longest published pre-training contexts are 256k-1M tokens (Llama 4 Scout trains
# at 256k); 2**24 (16.8M) is 16x the longest.
MAX_SEQ = 2**24

# --- batch and pipeline -------------------------------------------------------------------------------------
# Sequences per micro-batch and per step: real global batches are up to ~16k sequences (Llama 3 405B: 16M
# tokens at 8k); 2**24 sequences is 1,000x that.
MAX_BATCH = 2**24
# Tokens of one micro-batch (micro_batch_size * seq_length): 2**30 keeps activation sizes (tokens x hidden x
# bytes) finite in int64 with the widths above.
MAX_MICROBATCH_TOKENS = 2**30
# Forward passes the pipeline schedule lays out (pp * vpp * micro-batches): its order arrays hold about
# 50 bytes per pass and the timeline runs in ~1 s per million passes (measured on a 2-core VM, 2026-12);
# 2**21 is 16x a large real job (pp 16 x vpp 8 x 1,000 micro-batches).
MAX_PIPELINE_PASSES = 2**21

# --- cluster ------------------------------------------------------------------------------------------------
# GPUs: the largest announced clusters hold ~200k GPUs; 2**20 (1,048,576) is 5x, and its topology builds in
# ~5 s and 1.2 GB (flowsim topo, measured 2026-12).
MAX_GPUS = 2**20
# The flow engine puts every group's flows into one solver: 2**14 GPUs take ~4 s per estimate, 65,536
# take 33-48 s and ~500 MB (gpt3-175b, tp 8, pp 8; benchmarks/bench_flow_scaling.py, docs/PERFORMANCE.md,
# 2026-12), so it is bounded where it stays interactive.
MAX_GPUS_FLOW = 2**14
# Scale-up domains: NVL72 today, NVL576 announced; 2**16 is 100x.
MAX_NVLINK_DOMAIN = 2**16
MAX_GPUS_PER_NODE = 2**10
MAX_NICS_PER_NODE = 2**10
# Switch radix: 512 ports (Broadcom Tomahawk 6 at 200G); 2**12 is 8x.
MAX_SWITCH_RADIX = 2**12
# NIC line rate: 1 Gb/s (the slowest Ethernet NIC still sold) to 100 Tb/s (125x today's 800 Gb/s). Slower
# "NICs" make step times of years and overflow the timeline's sums.
MIN_NIC_GBPS = 1.0
MAX_NIC_GBPS = 1e5
# Leaf oversubscription: 1:1 to 1:3 in GPU clusters; 100 is far beyond any design.
MAX_OVERSUBSCRIPTION = 100.0
# One network hop: ~1-5 us; 1 s would be a broken network, not a slow one.
MAX_NIC_LATENCY_S = 1.0

# --- training settings --------------------------------------------------------------------------------------
# Gradient buckets per stage: the reduction holds per-bucket arrays, so their count is bounded, which sets a
# floor on bucket_size_bytes of 4 bytes x parameters / 65,536 (Megatron-core's default, 40M parameters per
# bucket, makes 1-500 buckets for today's models; PyTorch DDP's 25 MiB ~5,000 for a 30B model).
MAX_BUCKETS = 2**16
# SMs a collective holds: no GPU has more than 1,024 SMs (B200: 148).
MAX_COMM_SMS = 1024
# Token-drop capacity factor: 1.0-2.0 in practice (Switch Transformer, GShard); a factor above the expert
# count already keeps every token.
MAX_CAPACITY_FACTOR = 1e4


def check_int_max(obj, names, maximum: int, why: str) -> None:
    """Raise ConfigError for the first integer attribute of ``obj`` in ``names`` above ``maximum``.

    Parameters
    ----------
    obj : object
        A config dataclass (its integer fields already checked for type and lower bound).
    names : iterable of str
        Field names.
    maximum : int
        Largest allowed value.
    why : str
        The reason, shown in the message (e.g. ``"60x the deepest published model"``).
    """
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, int) and v > maximum:
            raise ConfigError(name, f"must be <= {maximum:,} ({why})", v)


def check_float(name: str, value, low: float, high: float, rule: str) -> None:
    """Raise ConfigError unless ``value`` is a finite real number in ``[low, high]``.

    ``rule`` states the range and its reason (e.g. ``"must be a finite number in [1, 100000] Gb/s"``).
    """
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and low <= value <= high)
    if not ok:
        raise ConfigError(name, rule, value)
