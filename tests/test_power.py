"""Power limits: compute ceilings derated by (limit / measured board power) ** (1/3) (flowsim.kernels.power)."""
import pandas as pd
import pytest

from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.kernels import KernelStack, op_breakdown
from flowsim.kernels.power import clock_fraction

H100 = get_gpu("h100-sxm")
TETON = get_gpu("h100-sxm-hbm2e")  # 500 W Grand Teton H100, priced from the 700 W h100-sxm's measurements
GEMM = pd.DataFrame({"kind": ["gemm"], "dtype": ["bf16"], "m": [8192], "n": [8192], "k": [8192]})
ATTN = pd.DataFrame({"kind": ["attn_fwd"], "dtype": ["bf16"], "batch": [2], "heads": [32], "seq_q": [8192],
                     "seq_k": [8192], "head_dim": [128], "causal": [True]})
MEM = pd.DataFrame({"kind": ["memory"], "dtype": ["bf16"], "bytes": [1e9]})


def _compute_s(ops, gpu, stack=None):
    return float(op_breakdown(ops, gpu, stack=stack).compute_s.iloc[0])


def test_500w_derate_known_answer():
    # P ~ f^3: a 500 W cap on a ceiling measured at 700 W sustains (500 / 700) ** (1/3) = 0.8939 of the clock
    derate = (500 / 700) ** (1 / 3)
    assert derate == pytest.approx(0.8939, abs=1e-4)
    assert clock_fraction(TETON, "h100-sxm") == pytest.approx(derate, rel=1e-12)
    # same die and peaks: the GEMM's and the attention's compute time grow by 1 / 0.8939 = +11.9 %
    assert _compute_s(GEMM, TETON) == pytest.approx(_compute_s(GEMM, H100) / derate, rel=1e-12)
    assert _compute_s(ATTN, TETON) == pytest.approx(_compute_s(ATTN, H100) / derate, rel=1e-12)


def test_cluster_power_limit_derates_like_the_spec():
    capped = KernelStack(power_limit_w=500)
    assert _compute_s(GEMM, H100, capped) == pytest.approx(_compute_s(GEMM, TETON), rel=1e-12)
    # a limit at or above the measured board power changes nothing; memory-bound ops keep their bandwidth
    assert _compute_s(GEMM, H100, KernelStack(power_limit_w=700)) == _compute_s(GEMM, H100)
    assert _compute_s(GEMM, H100, KernelStack(power_limit_w=1000)) == _compute_s(GEMM, H100)
    assert op_breakdown(MEM, H100, stack=capped).time_s.iloc[0] == op_breakdown(MEM, H100).time_s.iloc[0]


def test_cube_law_against_a100_pcie_vs_sxm():
    # same peak (312 TFLOP/s), MAMF 252.9 (PCIe, 300 W) vs 271.2 (SXM, 400 W): 0.933 measured, 0.909 modelled
    assert (300 / 400) ** (1 / 3) == pytest.approx(252.9 / 271.2, abs=0.03)
    assert clock_fraction(get_gpu("a100-sxm4-80gb"), "a100-sxm4-80gb", 300) == pytest.approx(0.9086, abs=1e-4)


@pytest.mark.parametrize("value", [-1, float("nan"), 1e6])
def test_bad_power_limit_is_named(value):
    with pytest.raises(ConfigError, match=r"^power_limit_w: must be a finite number in \[0, 5000\] W"):
        build_config({"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "tp": 8, "power_limit_w": value})
    if value < 0 or value != value:
        with pytest.raises(ConfigError, match=r"^power_limit_w: must be a number of watts >= 0"):
            KernelStack(power_limit_w=value)


def test_spec_power_limit_is_read_and_checked(tmp_path):
    assert TETON.power_limit_w == 500.0 and H100.power_limit_w != H100.power_limit_w  # NaN: not set
