"""FlashAttention on unpadded tokens (``flash_attn_unpad``, llm-foundry's flash_attn_fn): flash_attn.bert_padding's
gathers and scatters around the attention kernels (flowsim.model.ops.unpad_rows)."""
import pytest

from flowsim.config import build_config
from flowsim.model.ops import unpad_rows
from flowsim.model.workload import build_workload

BASE = dict(cluster="dgx-h100", gpus=8, gbs=8, mbs=1)


def _layer(**kw):
    cfg = build_config(**{**BASE, **kw})
    return cfg, build_workload(cfg).layer.compute


def _bytes(ops, name, phase):
    return ops.loc[(ops["name"] == name) & (ops["phase"] == phase), "bytes"].sum()


def test_multi_head_attention_moves_40_hidden_bytes_per_token():
    cfg, ops = _layer(model="llama2-7b", flash_attn_unpad=True)  # 32 heads, 32 key-value heads
    tokens, h = cfg.microbatch_tokens, cfg.model.hidden_size
    # forward: q, k, v gathered (read + write 2 bytes each), the output scattered into zeros (write, read, write)
    assert _bytes(ops, "attention_unpad", "fwd") == pytest.approx(tokens * (3 * 4 + 6) * h)
    # backward: the output gradient gathered, the q, k, v gradients scattered into zeros
    assert _bytes(ops, "attention_unpad.bwd", "bwd") == pytest.approx(tokens * (4 + 3 * 6) * h)
    assert (_bytes(ops, "attention_unpad", "fwd") + _bytes(ops, "attention_unpad.bwd", "bwd")) == \
        pytest.approx(40 * h * tokens)


def test_grouped_keys_and_recompute():
    q, kv, tokens = 4096, 1024, 8192
    fwd, = unpad_rows(tokens, q, kv, "fwd")
    bwd, = unpad_rows(tokens, q, kv, "bwd")
    assert fwd["bytes"] == tokens * (4 * (q + 2 * kv) + 6 * q)
    assert bwd["bytes"] == tokens * (4 * q + 6 * (q + 2 * kv))
    assert unpad_rows(tokens, q, kv, "recompute")[0]["bytes"] == fwd["bytes"]
    # a recomputed attention gathers again; unfused attention and the default flash path have no copies
    _, ops = _layer(model="llama3-8b", flash_attn_unpad=True, recompute="selective")
    assert _bytes(ops, "attention_unpad", "recompute") == pytest.approx(_bytes(ops, "attention_unpad", "fwd"))
    for kw in (dict(flash_attn_unpad=True, use_flash_attn=False), {}):
        _, ops = _layer(model="llama3-8b", **kw)
        assert not ops["name"].str.startswith("attention_unpad").any()


def test_llm_foundry_profile():
    assert build_config(model="llama2-7b", **BASE, framework="llm-foundry").training.flash_attn_unpad
    assert not build_config(model="llama2-7b", **BASE, framework="torchtitan").training.flash_attn_unpad
    assert not build_config(model="llama2-7b", **BASE, framework="llm-foundry",
                            flash_attn_unpad=False).training.flash_attn_unpad
