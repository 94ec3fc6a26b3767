"""Hypothesis strategies for the fuzz suites (tests/test_fuzz_*.py): configs near and far from valid ones.

A config starts from a consistent layout (a preset model on a preset cluster, GPUs = tp * pp * dp * cp, a global
batch that divides) so that most examples reach the simulator, then up to three keys are replaced by hostile
values (zero, negative, huge, NaN, infinity, wrong types, strings) so that the checks are exercised too.
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

MODELS = ("llama3-8b", "llama2-7b", "gpt3-175b", "llama3-70b", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3")
CLUSTERS = ("dgx-h100", "dgx-a100", "dgx-b200", "gb200-nvl72", "hgx-h800", "dgx-h200")

HOSTILE_INTS = (0, -1, 1, 2, 3, 7, 2**31, 2**40, 10**9, 10**12, 1099511627776)
HOSTILE_FLOATS = (0.0, -1.0, 1e-9, 1e-300, 1e300, math.inf, -math.inf, math.nan, 0.5, 3.0)
HOSTILE_OTHER = ("", "abc", "1e3", "inf", "nan", "-5", True, False, None, [1, 2], {"a": 1})

INT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "gbs", "seq", "num_layers", "hidden_size",
            "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "vocab_size",
            "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "zero_stage", "recompute_num_layers",
            "gpus", "gpus_per_node", "nics_per_node", "switch_radix", "nvlink_domain", "overlap_comm_sms",
            "data_parallel_shard_size", "moe_layer_freq", "moe_first_k_dense", "leaves_per_rail")
FLOAT_KEYS = ("nic_gbps", "oversubscription", "nic_latency_s", "bucket_size_bytes", "hidden_dropout",
              "moe_expert_capacity_factor")
CHOICE_KEYS = {
    "recompute": ("none", "selective", "full", "partial"),
    "precision": ("bf16", "fp16", "fp8", "fp64"),
    "schedule": ("auto", "gpipe", "1f1b", "interleaved", "zb-h1", "dualpipe", "pipedream"),
    "network": ("rail_optimized", "rail_only", "fat_tree", "torus"),
    "kernel_fusion": ("fused", "eager"),
    "cp_comm_type": ("p2p", "all_gather"),
    "moe_token_dispatcher_type": ("alltoall", "allgather"),
    "ecmp": ("hash", "ideal"),
}
BOOL_KEYS = ("sp", "distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
             "use_flash_attn", "overlap_moe_expert_parallel_comm")


@st.composite
def layouts(draw) -> dict:
    """A config that is usually valid: preset model and cluster, a consistent parallel layout and batch."""
    model = draw(st.sampled_from(MODELS))
    tp = draw(st.sampled_from((1, 2, 4, 8)))
    pp = draw(st.sampled_from((1, 1, 2, 4)))
    cp = draw(st.sampled_from((1, 1, 2)))
    dp = draw(st.sampled_from((1, 2, 4, 8, 16)))
    mbs = draw(st.sampled_from((1, 2)))
    cfg = {"model": model, "cluster": draw(st.sampled_from(CLUSTERS)), "tp": tp, "pp": pp, "cp": cp, "dp": dp,
           "gpus": tp * pp * cp * dp, "mbs": mbs, "gbs": mbs * dp * draw(st.sampled_from((1, 2, 4, 8, 16))),
           "seq": draw(st.sampled_from((1024, 2048, 4096))), "pipeline_layer_split": "balanced"}
    if tp > 1:
        cfg["sp"] = draw(st.booleans()) or model in ("mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3")
    if model in ("mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"):
        cfg["ep"] = draw(st.sampled_from((1, 2, 4, 8)))
    if draw(st.booleans()):
        cfg["recompute"] = draw(st.sampled_from(("none", "selective", "full")))
    if draw(st.booleans()):
        cfg["distributed_optimizer"] = True
    if pp > 1 and draw(st.booleans()):
        cfg["vpp"] = 2
    return cfg


def hostile_value(key: str):
    """A strategy of values for ``key``: mostly plausible, sometimes hostile."""
    if key in INT_KEYS:
        return st.one_of(st.sampled_from(HOSTILE_INTS), st.integers(-10, 10**6), st.sampled_from(HOSTILE_FLOATS),
                         st.sampled_from(HOSTILE_OTHER))
    if key in FLOAT_KEYS:
        return st.one_of(st.sampled_from(HOSTILE_FLOATS), st.floats(allow_nan=True, allow_infinity=True),
                         st.integers(-10, 10**4), st.sampled_from(HOSTILE_OTHER))
    if key in CHOICE_KEYS:
        return st.one_of(st.sampled_from(CHOICE_KEYS[key]), st.sampled_from(HOSTILE_OTHER))
    return st.one_of(st.booleans(), st.sampled_from(HOSTILE_OTHER), st.sampled_from(HOSTILE_INTS))


ALL_KEYS = INT_KEYS + FLOAT_KEYS + tuple(CHOICE_KEYS) + BOOL_KEYS


@st.composite
def configs(draw) -> dict:
    """A layout with 0-3 keys replaced by :func:`hostile_value` draws."""
    cfg = draw(layouts())
    for key in draw(st.lists(st.sampled_from(ALL_KEYS), max_size=3, unique=True)):
        cfg[key] = draw(hostile_value(key))
    return cfg
