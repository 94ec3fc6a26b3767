"""Block-scaled FP4 training (nvfp4, mxfp4): GEMM peaks and ceilings, quantisation kernels, which GEMMs run in
FP4, and an MLPerf-style Llama 3.1 405B job on GB300 NVL72."""
import pandas as pd
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import KernelStack, gemm_time, op_breakdown
from flowsim.model.ops import linear
from flowsim.model.workload import build_workload

GB200, GB300 = get_gpu("gb200"), get_gpu("gb300")
AZURE_GB200 = KernelStack("azure-gb200-v6-cuda12.8")
N = 16384

# MLPerf Training Llama 3.1 405B style: seq 8192, TP4 PP8 (interleaved, 4 chunks) on 8 GB300 NVL72 racks
MLPERF_405B = {
    "model": "llama3.1-405b", "cluster": {"gpu": "gb300", "num_gpus": 576, "gpus_per_node": 4, "nvlink_domain": 72,
                                          "nics_per_node": 4, "nic_gbps": 800, "cpu": "arm"},
    "tp": 4, "pp": 8, "vpp": 4, "gbs": 1152, "mbs": 1, "seq": 8192, "sp": True, "distributed_optimizer": True,
    "account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True,
}


def test_fp4_gemm_time_known_answer():
    # Azure ND GB200 v6 cuBLASLt, 16384^3: FP8 2,906.9 and FP4 7,627.6 TFLOP/s; both ceilings are calibrated on that
    # shape, so the FP4 GEMM takes 2906.9 / 7627.6 = 0.381 of the FP8 one
    t4 = gemm_time(N, N, N, "nvfp4", GB200, stack=AZURE_GB200)
    t8 = gemm_time(N, N, N, "fp8", GB200, stack=AZURE_GB200)
    assert t4 / t8 == pytest.approx(2906.9 / 7627.6, rel=1e-9)
    assert 2 * N**3 / t4 == pytest.approx(7627.6e12, rel=1e-9)
    # GB300 (no FP4 measurement) is priced from GB200's ceiling at its own FP4 peak: 15,000 vs 10,000 TFLOP/s dense
    ops = pd.DataFrame({"kind": ["gemm"], "dtype": ["nvfp4"], "m": [N], "n": [N], "k": [N]})
    c300 = op_breakdown(ops, GB300, stack=AZURE_GB200).compute_s.iloc[0]
    c200 = op_breakdown(ops, GB200, stack=AZURE_GB200).compute_s.iloc[0]
    assert c300 / c200 == pytest.approx(10000 / 15000, rel=1e-12)
    # MXFP4 runs on the same FP4 tensor cores: same compute time; it moves 1/32 instead of 1/16 byte of scale
    mx = op_breakdown(ops.assign(dtype="mxfp4"), GB300, stack=AZURE_GB200).iloc[0]
    assert mx.compute_s == pytest.approx(c300, rel=1e-12)


def test_fp4_gemm_bytes_and_quantisation_kernels():
    rows = []
    linear(rows, "fc1", 8192, 4096, 2048, "nvfp4", False)
    by = {r["name"]: r for r in rows}
    e = 0.5 + 1 / 16  # NVFP4: E2M1 element + one E4M3 scale per 16
    # operands in FP4 with their scales, output written in 16-bit: HBM traffic 0.28x of the operands in bf16
    assert by["fc1"]["bytes"] == pytest.approx(e * (8192 * 2048 + 2048 * 4096) + 2 * 8192 * 4096)
    assert by["fc1"]["dtype"] == "nvfp4"
    # quantise the input (read 2 B, write e), the output gradient, and both wgrad operands again (RHT)
    assert by["fc1.quant_in"]["bytes"] == pytest.approx(8192 * 2048 * (2 + e))
    assert by["fc1.quant_grad"]["bytes"] == pytest.approx(8192 * 4096 * (2 + e))
    assert by["fc1.quant_wgrad"]["bytes"] == pytest.approx((8192 * 2048 + 8192 * 4096) * (2 + e))


def test_fp4_recipe_runs_linear_layers_in_fp4_and_the_rest_higher():
    wl = build_workload(build_config({**MLPERF_405B, "precision": "nvfp4"}))
    layer = wl.layer.compute
    gemms = layer[layer.kind == "gemm"]
    assert set(gemms.dtype) == {"nvfp4"}  # qkv, attention output, fc1, fc2 (forward, dgrad, wgrad)
    assert set(layer[layer.kind.str.startswith("attn")].dtype) == {"bf16"}  # attention stays 16-bit
    assert set(wl.head.compute[wl.head.compute.kind == "gemm"].dtype) == {"bf16"}  # output layer
    assert wl.gemm_dtype == "nvfp4"


def test_mlperf_style_405b_nvfp4_on_gb300_nvl72_simulates():
    times = {p: flowsim.simulate({**MLPERF_405B, "precision": p}).step_time_s for p in ("bf16", "fp8", "nvfp4")}
    assert times["nvfp4"] < times["fp8"] < times["bf16"]
    r = flowsim.simulate({**MLPERF_405B, "precision": "mxfp4"})
    assert r.step_time_s == pytest.approx(times["nvfp4"], rel=0.01)  # same tensor rate, slightly fewer scale bytes


@pytest.mark.parametrize("gpu, dtype, message", [
    ("h100-sxm", "nvfp4", r"^dtype: h100-sxm has no fp4 peak in its spec \(got nvfp4\)$"),
    ("mi300x", "nvfp4", r"^dtype: nvfp4 runs on NVIDIA Blackwell tensor cores only \(mi300x is amd\)"),
])
def test_fp4_on_a_gpu_without_it_is_named(gpu, dtype, message):
    with pytest.raises(ConfigError, match=message):
        gemm_time(4096, 4096, 4096, dtype, get_gpu(gpu))


def test_unknown_precision_is_named():
    with pytest.raises(ConfigError, match=r"^precision: must be one of bf16, fp16, fp8, nvfp4, mxfp4 \(got fp4\)$"):
        build_config({**MLPERF_405B, "precision": "fp4"})


def test_fp4_weight_copy_memory_known_answer():
    # Transformer Engine keeps a low-precision copy of every transformer-layer GEMM weight beside the bf16 weights
    # (not of the embedding, LM head or final norm, which run outside its modules): 1 B per parameter for FP8,
    # 0.5 + 1/16 B for NVFP4 (4-bit elements, one FP8 scale per 16) -> FP4 saves 7/16 B per parameter against FP8
    base = dict(model="llama3-8b", cluster="dgx-b200", gpus=8, tp=1, gbs=64)
    w = {p: flowsim.simulate(base, precision=p).memory_detail["weights"] for p in ("bf16", "fp8", "nvfp4")}
    vocab, hidden = 128256, 4096  # Llama 3 8B: untied embedding and LM head, final RMSNorm
    n_params = w["bf16"] / 2 - (2 * vocab * hidden + hidden)
    assert w["fp8"] - w["bf16"] == pytest.approx(1.0 * n_params)
    assert w["nvfp4"] - w["bf16"] == pytest.approx((0.5 + 1 / 16) * n_params)
    assert w["fp8"] - w["nvfp4"] == pytest.approx(7 / 16 * n_params)
