"""The router's gating GEMM in fp32 (``moe_router_dtype``, Megatron-LM ``--moe-router-dtype``)."""
import pytest
from click.testing import CliRunner

import flowsim
from flowsim.cli import main
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import op_times
from flowsim.model.ops import finish, gemm
from flowsim.model.workload import build_workload

MIX = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, ep=8, gbs=8, mbs=1, moe_imbalance_factor=1.0)
TOK, H, E = 4096, 4096, 8


def _router_rows(cfg):
    c = build_workload(cfg).moe_layer.compute
    return c[c["name"].str.startswith("router") & (c["name"] != "router_topk") & (c["name"] != "router_topk.bwd")]


def test_fp32_router_runs_its_gemms_in_fp32_and_casts_its_input():
    half = _router_rows(build_config(**MIX))
    assert set(half["dtype"]) == {"bf16"} and list(half["name"]) == ["router", "router.dgrad", "router.wgrad"]
    fp32 = _router_rows(build_config(**MIX, moe_router_dtype="fp32"))
    gemms = fp32[fp32["kind"] == "gemm"]
    assert set(gemms["dtype"]) == {"fp32"}
    assert (gemms[["m", "n", "k"]].to_numpy() == half[["m", "n", "k"]].to_numpy()).all()  # same shapes
    casts = fp32[fp32["kind"] == "memory"]
    assert list(casts["phase"]) == ["fwd", "bwd"]
    assert list(casts["bytes"]) == [TOK * H * (2 + 4)] * 2  # bf16 read + fp32 write, and back


def test_fp32_router_gemm_runs_at_the_fp32_rate():
    # DeepSeek-V3's gating GEMM (4096 tokens, 256 experts, h 7168) is compute-bound in fp32: CUDA cores, 67 of the
    # H100's 989 dense 16-bit TFLOP/s (Mixtral's 8 experts leave it bound by its bytes either way)
    h100 = get_gpu("h100-sxm")
    t32, t16 = (float(op_times(finish([gemm("router", 4096, 256, 7168, dt, "fwd")], []).compute, h100)[0])
                for dt in ("fp32", "bf16"))
    assert t32 >= 2 * 4096 * 256 * 7168 / h100.peak_flop_per_s["fp32"]  # no faster than the fp32 peak
    assert t32 > 5 * t16
    cfg = build_config(**MIX, moe_router_dtype="fp32")
    slow, fast = flowsim.simulate(cfg), flowsim.simulate(build_config(**MIX))
    assert slow.step_time_s > fast.step_time_s
    assert slow.model_flops == fast.model_flops  # the same work, in a slower dtype


@pytest.mark.parametrize("value", ["fp64", "bf16", "int8"])
def test_router_dtype_rule(value):
    with pytest.raises(ConfigError, match="^moe_router_dtype: must be empty"):
        build_config(**MIX, moe_router_dtype=value)
    res = CliRunner().invoke(main, ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "8",
                                    "--ep", "8", "--set", f"moe_router_dtype={value}"])
    assert res.exit_code == 2 and res.output.startswith("Error: moe_router_dtype:") and res.output.count("\n") == 1


def test_router_dtype_from_megatron_arguments():
    from flowsim.config.importers import from_megatron_args

    args = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --bf16 --seq-length 1024 --vocab-size 32000 "
            "--num-experts 8 --moe-router-topk 2 --moe-router-dtype fp32").split()
    assert from_megatron_args(args).config["training"]["moe_router_dtype"] == "fp32"
