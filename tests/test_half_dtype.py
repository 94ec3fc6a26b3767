"""The job's 16-bit type: fp16 jobs run their 16-bit GEMMs in fp16 (V100 has no bf16), bf16 and low-precision
jobs keep bf16 for the GEMMs that stay 16-bit."""
import numpy as np
import pytest

import flowsim
from flowsim.model.workload import build_workload

BASE = {"model": "llama2-7b", "cluster": "dgx-h100", "gpus": 8, "gbs": 16}


@pytest.mark.parametrize("precision, linear, half", [("fp16", "fp16", "fp16"), ("bf16", "bf16", "bf16"),
                                                      ("fp8", "fp8", "bf16")])
def test_gemm_dtypes_follow_the_precision(precision, linear, half):
    cfg = flowsim.build_config(BASE, precision=precision, use_flash_attn=False)
    table = build_workload(cfg).op_table[0]
    names, dtypes, kinds = (np.asarray(table[c]) for c in ("name", "dtype", "kind"))
    gemm = kinds == "gemm"
    assert set(dtypes[gemm & (names == "fc1")]) == {linear}
    assert set(dtypes[gemm & (names == "lm_head")]) == {half}
    assert set(dtypes[gemm & (names == "attn_scores")]) == {half}  # unfused attention's batched GEMMs


def test_fp16_and_bf16_cost_the_same_where_both_peaks_are_equal():
    fp16 = flowsim.simulate(flowsim.build_config(BASE, precision="fp16")).step_time_s
    bf16 = flowsim.simulate(flowsim.build_config(BASE, precision="bf16")).step_time_s
    assert fp16 == pytest.approx(bf16, rel=1e-9)  # H100: 989.4 TFLOP/s in both
