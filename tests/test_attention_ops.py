"""Attention and dropout ops of a layer: unfused attention's FLOPs and bytes against the formula, fused and eager
softmax, attention dropout (unfused: its own kernel and mask; flash: inside the kernel), hidden dropout."""
from flowsim.config import build_config
from flowsim.model.ops import EAGER_SOFTMAX_BYTES
from flowsim.model.workload import build_layer

B, S, A, D, TP = 2, 1024, 16, 64, 2  # micro-batch, sequence, heads, head dim, tensor parallel
BASE = dict(num_layers=4, hidden_size=A * D, num_attention_heads=A, seq_length=S, vocab_size=32000,
            cluster="dgx-h100", gpus=TP, tp=TP, mbs=B, gbs=B, use_flash_attn=False)
BH = B * A // TP  # heads of one GPU times the micro-batch


def _rows(phase="fwd", **kw):
    c = build_layer(build_config(**{**BASE, **kw})).compute
    return {r["name"]: r for r in c[c["phase"] == phase].to_dict(orient="records")}


def test_unfused_forward_equals_the_formula():
    r = _rows(attention_dropout=0.1)
    sq = BH * S * S
    # Q K^T and P V over the full square: 2 * bh * s^2 * d FLOPs each
    assert r["attn_scores"]["flops"] == r["attn_context"]["flops"] == 2 * BH * S * S * D
    # GEMM bytes: both operands and the output, 2 bytes each
    assert r["attn_scores"]["bytes"] == BH * 2 * (S * D + D * S + S * S)
    assert r["attn_context"]["bytes"] == BH * 2 * (S * S + S * D + S * D)
    assert r["softmax"]["bytes"] == sq * 4  # fused scale-mask-softmax: read and write the 2-byte scores
    assert r["attn_dropout"]["bytes"] == sq * 5  # read, write, 1-byte mask


def test_unfused_backward_equals_the_formula():
    r = _rows("bwd", attention_dropout=0.1)
    gemms = [v for k, v in r.items() if k.startswith(("attn_scores.", "attn_context."))]
    assert len(gemms) == 4 and sum(g["flops"] for g in gemms) == 8 * BH * S * S * D
    assert r["softmax.bwd"]["bytes"] == BH * S * S * 6
    assert r["attn_dropout.bwd"]["bytes"] == BH * S * S * 5


def test_attention_dropout_is_its_own_setting():
    assert "attn_dropout" not in _rows(hidden_dropout=0.1)  # hidden dropout does not drop attention probabilities
    assert "attn_dropout" in _rows(attention_dropout=0.1)
    # hidden dropout fuses into bias-dropout-add after attention and MLP, forward and backward
    fwd, plain = _rows(hidden_dropout=0.1), _rows()
    assert fwd["attn_residual"]["bytes"] - plain["attn_residual"]["bytes"] == B * S * A * D  # its 1-byte mask
    assert fwd["mlp_residual"]["bytes"] > plain["mlp_residual"]["bytes"]
    assert _rows("bwd", hidden_dropout=0.1)["mlp_residual.bwd"]["bytes"] > _rows("bwd")["mlp_residual.bwd"]["bytes"]


def test_eager_softmax_runs_scale_mask_and_softmax_as_separate_kernels():
    fused, eager = _rows(), _rows(kernel_fusion="eager")
    sq = BH * S * S
    assert eager["softmax"]["bytes"] == sq * EAGER_SOFTMAX_BYTES[0] == sq * 13
    assert _rows("bwd", kernel_fusion="eager")["softmax.bwd"]["bytes"] == sq * 15
    assert eager["attn_scores"] == fused["attn_scores"]  # the GEMMs do not change


def test_flash_attention_applies_dropout_inside_its_kernels():
    flash = dict(use_flash_attn=True)
    for phase in ("fwd", "bwd"):
        assert _rows(phase, attention_dropout=0.1, **flash) == _rows(phase, **flash)


def test_recompute_reruns_the_unfused_forward():
    rec = _rows("recompute", attention_dropout=0.1, recompute="selective")
    fwd = _rows(attention_dropout=0.1)
    for name in ("attn_scores", "softmax", "attn_dropout", "attn_context"):
        assert {k: v for k, v in rec[name].items() if k != "phase"} == \
            {k: v for k, v in fwd[name].items() if k != "phase"}
