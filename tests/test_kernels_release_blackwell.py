"""Blackwell kernels: SM100 GEMM tiles (with 2-CTA MMA) and the measured Blackwell GEMM shapes."""
import numpy as np
import pytest

from flowsim.gpu_specs import get_gpu
from flowsim.kernels.accuracy import leave_one_out
from flowsim.kernels.gemm import TILES_SM90, TILES_SM100, best_shape_efficiency, gemm_candidates, tiles_for

B200 = get_gpu("b200")  # 148 SMs


def test_blackwell_takes_sm100_tiles():
    assert tiles_for(B200) is TILES_SM100 and tiles_for(get_gpu("gb300")) is TILES_SM100
    assert tiles_for(get_gpu("h100-sxm")) is TILES_SM90 and tiles_for(get_gpu("mi355x")) is TILES_SM90
    # UMMA: at most 128 rows per SM; the 256-row tiles are 2-CTA (an SM pair)
    assert set(TILES_SM100[TILES_SM100[:, 0] > 128, 2]) == {2}


def test_sm100_tile_quantisation_of_a_skinny_gemm():
    # C[192, 8192] = A[192, 64] B[64, 8192] on 148 SMs; one K step, so no split-K.
    useful = 192 * 8192
    eff, _ = gemm_candidates([192], [8192], [64], [1], B200.sm_count, TILES_SM100)
    by_tile = dict(zip(map(tuple, TILES_SM100), eff[0, ::5]))  # split-K factor 1 is the first of 5 per tile
    # 1-SM 128x128: ceil(192/128) * 8192/128 = 128 tiles in one wave of 148 SMs, m padded to 256
    assert by_tile[(128, 128, 1)] == pytest.approx(useful / (148 * 128 * 128))  # 0.6486
    # 1-SM 128x256: 64 tiles, one wave, half the machine's tile area used
    assert by_tile[(128, 256, 1)] == pytest.approx(useful / (148 * 128 * 256))  # 0.3243
    # 2-CTA 256x256: 32 tiles on 74 SM pairs, one wave; each SM computes 128 x 256
    assert by_tile[(256, 256, 2)] == pytest.approx(useful / (148 * 128 * 256))  # 0.3243
    # 2-CTA 256x64: 128 tiles on 74 pairs -> 2 waves
    assert by_tile[(256, 64, 2)] == pytest.approx(useful / (2 * 148 * 128 * 64))  # 0.6486
    assert best_shape_efficiency([192], [8192], [64], [1], B200.sm_count, TILES_SM100)[0] == \
        pytest.approx(0.6486, abs=1e-4)


def test_two_cta_pairs_quantise_by_pairs():
    # 75 tiles of 256x128 on 148 SMs = 74 SM pairs: the 75th tile needs a second wave of pairs
    m, n, k = 256, 75 * 128, 64
    pair = gemm_candidates([m], [n], [k], [1], 148, np.array([(256, 128, 2)]))[0][0, 0]
    assert pair == pytest.approx(m * n / (2 * 148 * 128 * 128))  # 0.507
    # the same as 150 1-SM 128x128 tiles on 148 SMs: the pair's gain (each SM loads half of B) is not modelled
    single = gemm_candidates([m], [n], [k], [1], 148, np.array([(128, 128, 1)]))[0][0, 0]
    assert single == pytest.approx(pair)


def test_measured_blackwell_gemm_shapes_are_checked():
    shape = leave_one_out().query("kind == 'gemm' and mode == 'shape'")
    gb200 = shape[shape.gpu == "gb200"]
    # Azure ND GB200 v6, FP8 and FP4, 9 shapes each less the two ceiling shapes, one FP4 shape not run
    assert len(gb200) == 15
    big = gb200[gb200.case.str.contains("8192x8192x8192")]
    assert (big.error.abs() < 0.05).all()  # large squares within 5 % of the measured rate
