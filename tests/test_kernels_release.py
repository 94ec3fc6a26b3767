"""Kernel efficiency by software release: the release table, GEMM ceilings per release and their fallback."""
import json
import re
import warnings

import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.config import build_config
from flowsim.errors import ConfigError, FlowsimWarning
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import KernelStack, gemm_time
from flowsim.kernels.calibration import job_stack
from flowsim.kernels.db import seed_db
from flowsim.kernels.gemm import ceiling_rows, gemm_ceiling
from flowsim.kernels.stack import release, releases

H100 = get_gpu("h100-sxm")


def _tflops(m, n, k, dtype, gpu, stack=None):
    return 2.0 * m * n * k / gemm_time(m, n, k, dtype, gpu, stack=stack) / 1e12


def test_every_kernel_row_names_a_dated_release():
    rows = ceiling_rows()
    assert set(rows.release) <= set(releases())
    assert all(re.match(r"^\d{4}-\d{2}$", d) for d in rows.date)
    # the MAMF rows' stack is their torch version (kernel_measurements.md s1)
    assert "pytorch-2.7.0+cu126" in set(rows[(rows.gpu == "h100-sxm") & (rows.mdt == "bf16")].release)


def test_release_lookup_reproduces_its_own_measurement():
    # Azure ND H100 v5 (CUDA 12.6): FP8 cuBLASLt 32768^3 at 1382.2 TFLOP/s; the ceiling is calibrated to it
    stack = KernelStack("azure-h100-v5-cuda12.6")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _tflops(32768, 32768, 32768, "fp8", H100, stack) == pytest.approx(1382.2, rel=1e-9)
    # the default stack is the newest measurement: MAMF 1402.6 at 1024x9216x14336 (torch 2.7.0, 2025-04)
    assert _tflops(1024, 9216, 14336, "fp8", H100) == pytest.approx(1402.6, rel=1e-9)


def test_release_without_measurement_falls_back_to_nearest_older_with_a_warning():
    # megatron-bridge-25.11 (2025-11): H100 FP8 rows are Azure (2024-08) and MAMF torch 2.7.0 (2025-04) -> MAMF
    with pytest.warns(FlowsimWarning, match=r"software_release megatron-bridge-25.11: no h100-sxm fp8 GEMM "
                                            r"measurement on it; using pytorch-2.7.0\+cu126 \(2025-04\), the "
                                            r"nearest older release"):
        t = gemm_time(8192, 8192, 8192, "fp8", H100, stack=KernelStack("megatron-bridge-25.11"))
    assert t == gemm_time(8192, 8192, 8192, "fp8", H100)
    c = gemm_ceiling("h100-sxm", "fp8", "megatron-bridge-25.11")
    assert (c.release, c.date, c.fallback) == ("pytorch-2.7.0+cu126", "2025-04", "older")


def test_release_older_than_every_measurement_takes_the_nearest_newer():
    # Megatron-LM 2021-04 on A100: FP16 rows of Azure (PyTorch 2.4.1, 2024-09) and MAMF bf16 (torch 2.6, 2025-01);
    # the nearest newer is Azure's 16384^3 at 256.5 TFLOP/s
    a100 = get_gpu("a100-sxm4-80gb")
    with pytest.warns(FlowsimWarning, match="nearest newer release"):
        got = _tflops(16384, 16384, 16384, "fp16", a100, KernelStack("megatron-lm-2021-04"))
    assert got == pytest.approx(256.5, rel=1e-9)


def test_unknown_release_is_a_one_line_error():
    with pytest.raises(ConfigError, match=r"^software_release: unknown release; known: .*nemo-24.07.* "
                                          r"\(got nemo-99.01\)$"):
        KernelStack("nemo-99.01")
    with pytest.raises(ConfigError, match=r"^software_release: unknown release"):
        build_config({"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "tp": 8,
                      "software_release": "nemo-99.01"})


def test_release_keys_are_case_insensitive_and_carry_a_family():
    assert release(" NeMo-24.07 ").family == "megatron-core-2024"
    assert KernelStack("NEMO-24.07").release == "nemo-24.07"


def test_families_group_releases_by_their_gemm_code_path():
    """PyTorch-native stacks (ATen cuBLAS GEMMs, PyTorch FSDP, no Transformer Engine) share one family whatever
    the publisher; Transformer Engine stacks are split by TE generation (flowsim.kernels.stack)."""
    native = ("llm-foundry-0.x", "fms-fsdp", "torchtitan", "torchtitan-2024-12", "torchtitan-2025-06")
    assert {release(k).family for k in native} == {"pytorch-native"}
    assert {release(k).attention for k in native} == {"fa2"}
    assert release("megatron-bridge-25.11").family == "megatron-bridge-2025"
    assert release("megatron-bridge-25.11").attention == "te"


def test_job_stack_takes_framework_version_when_no_release_is_given():
    assert job_stack(H100, framework_version="nemo-24.07").release == "nemo-24.07"
    assert job_stack(H100, "megatron-bridge-25.09", framework_version="nemo-24.07").release == \
        "megatron-bridge-25.09"
    assert job_stack(H100, framework_version="some-fork").release == ""


def test_config_keys_reach_the_training_section():
    cfg = build_config({"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "tp": 8,
                        "software_release": "NeMo-24.07", "power_limit_w": 500})
    assert (cfg.training.software_release, cfg.cluster.power_limit_w) == ("nemo-24.07", 500.0)


def test_kernels_show_lists_the_stack_of_each_row():
    db = seed_db()
    gemm = db[(db.op == "gemm") & (db.gpu == "gb200")]
    assert set(gemm["stack"]) == {"pytorch-2.10.0.dev20250916+cu130", "azure-gb200-v6-cuda12.8"}
    res = CliRunner().invoke(main, ["kernels", "show", "--gpu", "gb200"])
    assert res.exit_code == 0, res.output
    assert "measured on" in res.output and "azure-gb200-v6-cuda12.8" in res.output
    res = CliRunner().invoke(main, ["kernels", "show", "--json"])
    assert res.exit_code == 0
    assert {"gpu": "gb200", "op": "gemm", "impl": "cublaslt", "dtype": "fp4", "stack": "azure-gb200-v6-cuda12.8",
            "rows": 8} in json.loads(res.output)["db"]


def test_kernels_predict_names_the_release_of_the_ceiling():
    res = CliRunner().invoke(main, ["kernels", "predict", "--gpu", "h100-sxm", "--op", "gemm", "--shape",
                                    "8192,8192,8192", "--dtype", "fp8", "--software-release", "nemo-24.07", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["ceiling_release"] == {"release": "azure-h100-v5-cuda12.6", "date": "2024-08", "fallback": "newer"}
    res = CliRunner().invoke(main, ["kernels", "predict", "--gpu", "h100-sxm", "--op", "gemm", "--shape", "8,8,8",
                                    "--software-release", "foo"])
    assert res.exit_code == 2 and res.output.startswith("Error: software_release: unknown release")
