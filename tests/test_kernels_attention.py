"""Attention implementations: cuDNN on Hopper (measured), Blackwell (cuDNN scaled, FA2 anchored on GB200), and the
kernel each software release runs."""
import pandas as pd
import pytest

from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import attention_time, op_times
from flowsim.kernels.attention import IMPLS, anchor_scale
from flowsim.kernels.calibration import job_stack
from flowsim.kernels.stack import attention_kernel, release, releases
from flowsim.kernels.tables import load_table

FA = load_table("flash_attention")


def _tflops(gpu, r, backward_too, impl):
    f = 4 * r.batch * r.heads * r.seq_len**2 * r.head_dim / (2 if r.causal else 1)
    args = (r.batch, r.heads, r.seq_len, r.seq_len, r.head_dim, "bf16", gpu)
    t = attention_time(*args, causal=bool(r.causal), attention_impl=impl)
    if backward_too:
        t += attention_time(*args, causal=bool(r.causal), backward=True, attention_impl=impl)
        f *= 3.5
    return f / t / 1e12


def test_every_row_names_a_listed_stack_and_an_implementation():
    assert set(FA["impl"]) <= set(IMPLS)
    assert set(FA["stack"]) <= set(releases())
    assert release(FA[FA["gpu"] == "gb200"]["stack"].item()).date == "2025-01"


@pytest.mark.parametrize("r", list(FA[FA["impl"] == "cudnn"].itertuples()), ids=lambda r: f"hd{r.head_dim}-"
                         f"{'causal' if r.causal else 'full'}-{r.seq_len}")
def test_cudnn_forward_reproduces_the_h100_figure(r):
    """The 36 cuDNN bars of the FlashAttention-3 figure (kernel_measurements.md s3), within the interpolation."""
    assert _tflops(get_gpu("h100-sxm"), r, False, "cudnn") == pytest.approx(r.tflops, rel=1e-6)


def test_blackwell_cudnn_keeps_the_h100_fraction_of_peak():
    # B200 has no cuDNN measurement: H100's figure scaled by the fp16 peaks (2,250 / 989.4 TFLOP/s).
    # hd128 causal 8k forward on H100: 529 TFLOP/s (kernel_measurements.md s3).
    r = FA[(FA["impl"] == "cudnn") & (FA["head_dim"] == 128) & (FA["causal"] == 1) & (FA["seq_len"] == 8192)]
    assert _tflops(get_gpu("b200"), next(r.itertuples()), False, "cudnn") == pytest.approx(529 * 2250 / 989.4)


def test_gb200_fa2_anchor_reproduces_azure_and_sets_the_level_of_blackwell_fa2():
    """Azure ND GB200 v6: FlashAttention-2 fwd+bwd, batch 2, seq 8192, hd 128 = 373.9 TFLOP/s
    (kernel_measurements_additions.md s1c); H100's grids give the shape, the anchor the level."""
    r = next(FA[FA["gpu"] == "gb200"].itertuples())
    gb200 = get_gpu("gb200")
    assert _tflops(gb200, r, True, "fa2") == pytest.approx(373.9, rel=1e-6)
    # Level: 373.9 / 2500 over H100's 335 / 989.4 at the same point (README bar, non-causal hd128 8k fwd+bwd).
    assert anchor_scale("gb200", "h100-sxm", "fa2") == pytest.approx((373.9 / 2500) / (335 / 989.4))
    # B200 (no FA2 row of its own) takes the GB200 anchor (same architecture), scaled by its peak.
    assert _tflops(get_gpu("b200"), r, True, "fa2") == pytest.approx(373.9 * 2250 / 2500, rel=1e-6)


def test_azure_fa2_points_of_a100_and_h100_agree_with_the_readme_tables():
    """The anchor's pass and mask (non-causal fwd+bwd) inferred from the same script's A100 and H100 figures:
    179.5 (A100, hd 64) and 327.9 TFLOP/s (H100, hd 128) at batch 2, seq 8192 (s1c)."""
    for gpu, hd, azure in (("a100-sxm4-80gb", 64, 179.5), ("h100-sxm", 128, 327.9)):
        r = pd.Series({"batch": 2, "heads": 2048 // hd, "seq_len": 8192, "head_dim": hd, "causal": 0})
        assert _tflops(get_gpu(gpu), r, True, "fa2") == pytest.approx(azure, rel=0.03)


def test_release_selects_the_attention_kernel():
    assert attention_kernel("megatron-bridge-25.09", "blackwell") == "cudnn"
    assert attention_kernel("megatron-bridge-25.09", "hopper") == "fa2"
    assert attention_kernel("torchtitan-2025-06", "blackwell") == "fa2"
    assert attention_kernel("", "blackwell") == ""
    assert job_stack(get_gpu("gb200"), "megatron-bridge-25.11").attention_impl == "cudnn"
    assert job_stack(get_gpu("gb200")).attention_impl == ""


def test_stack_attention_prices_the_job_and_an_explicit_impl_overrides_it():
    ops = pd.DataFrame({"kind": ["attn_fwd"], "dtype": ["bf16"], "batch": [1], "heads": [32], "kv_heads": [8],
                        "seq_q": [8192], "seq_k": [8192], "head_dim": [128], "causal": [True]})
    gpu = get_gpu("gb200")
    te = job_stack(gpu, "megatron-bridge-25.11")
    assert op_times(ops, gpu, stack=te)[0] == op_times(ops, gpu, attention_impl="cudnn")[0]
    assert op_times(ops, gpu, attention_impl="fa2", stack=te)[0] == op_times(ops, gpu)[0]
    assert op_times(ops, gpu, stack=te)[0] < op_times(ops, gpu)[0] / 3  # cuDNN vs FA2's SM80 path on SM100


def test_cudnn_off_nvidia_is_an_error():
    with pytest.raises(ConfigError, match=r"^attention_impl: cuDNN attention runs on NVIDIA GPUs only"):
        attention_time(1, 16, 1024, 1024, 128, "bf16", get_gpu("mi300x"), attention_impl="cudnn")


def test_kernels_predict_takes_the_release_attention_kernel():
    import json

    from click.testing import CliRunner

    from flowsim.cli import main

    args = ["kernels", "predict", "--gpu", "gb200", "--op", "attn_fwd", "--shape", "1,32,8192,8192,128", "--causal",
            "--json"]
    te = json.loads(CliRunner().invoke(main, args + ["--software-release", "megatron-bridge-25.11"]).stdout)
    plain = json.loads(CliRunner().invoke(main, args).stdout)
    forced = json.loads(CliRunner().invoke(main, args + ["--software-release", "megatron-bridge-25.11",
                                                         "--attention-impl", "fa2"]).stdout)
    # cuDNN at H100's causal hd128 8k fraction (529 / 989.4) of GB200's 2,500 TFLOP/s; FA2 at the GB200 anchor.
    assert te["flops"] / te["time_s"] / 1e12 == pytest.approx(529 * 2500 / 989.4, rel=1e-6)
    assert plain["time_s"] == forced["time_s"] > 3 * te["time_s"]
    assert [r["measured"] for r in te["references"] if r["table"] == "flash_attention"] == ["h100-sxm"]
