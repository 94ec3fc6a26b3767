"""FP8 scaling recipes (``fp8_recipe``): the bytes of each GEMM operand's quantisation kernels."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.workload import build_workload

SMALL = dict(num_layers=2, hidden_size=1024, num_attention_heads=8, seq_length=1024, vocab_size=32000,
             activation="swiglu", normalization="rmsnorm", position_embedding="rope", add_bias_linear=False,
             cluster="dgx-h100", gpus=1, gbs=2, mbs=2, precision="fp8")


def _quant_bytes(recipe, name="qkv"):
    ops = build_workload(build_config(**SMALL, fp8_recipe=recipe)).layer.compute
    return {n.split(".")[-1]: float(ops.loc[ops["name"] == n, "bytes"].sum())
            for n in (f"{name}.cast_in", f"{name}.cast_grad", f"{name}.transpose")}


@pytest.mark.parametrize("recipe, cast, wgrad_copy", [
    ("delayed", 3, 2),      # read 2 write 1 with the amax in the cast; FP8 transpose read 1 write 1
    ("tensorwise", 5, 2),   # an amax pass (read 2) before the cast
    ("rowwise", 3, 5),      # row amax fused in the cast; the weight-gradient copy re-scaled along columns
    ("blockwise", 3 + 4 / 128, 3 + 4 / 128),  # both copies from 16-bit, a 4-byte scale per 128 elements
    ("mxfp8", 3 + 1 / 32, 3 + 1 / 32),        # a 1-byte E8M0 scale per 32 elements
])
def test_quantisation_bytes_per_recipe(recipe, cast, wgrad_copy):
    tokens, h = 2 * 1024, 1024
    qkv_out = (8 + 2 * 8) * 128  # no GQA: q, k and v of 8 heads of 128
    got = _quant_bytes(recipe)
    assert got["cast_in"] == pytest.approx(tokens * h * cast)
    assert got["cast_grad"] == pytest.approx(tokens * qkv_out * cast)
    assert got["transpose"] == pytest.approx((tokens * h + tokens * qkv_out) * wgrad_copy)


def test_recipes_order_the_step_and_leave_16_bit_alone():
    steps = {r: flowsim.simulate(SMALL, fp8_recipe=r).step_time_s
             for r in ("delayed", "tensorwise", "rowwise")}
    assert steps["delayed"] < steps["tensorwise"] < steps["rowwise"]
    bf16 = {**SMALL, "precision": "bf16"}
    assert flowsim.simulate(bf16, fp8_recipe="rowwise").step_time_s == flowsim.simulate(bf16).step_time_s


def test_fp8_recipe_defaults_and_errors():
    assert build_config(**SMALL).training.fp8_recipe == "delayed"
    assert build_config(**SMALL, framework="torchtitan").training.fp8_recipe == "tensorwise"
    assert build_config(**SMALL, framework="megatron-lm",
                        framework_version="megatron-lm-core_r0.8").training.fp8_recipe == "delayed"
    with pytest.raises(ConfigError) as e:
        build_config(**SMALL, fp8_recipe="fast")
    assert str(e.value).startswith("fp8_recipe: must be one of delayed, tensorwise, rowwise, blockwise, mxfp8")
