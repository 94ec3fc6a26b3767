"""GEMMs under sustained load (flowsim.kernels.sustained): burst vs sustained measurements, the power transfer."""
import pytest
import yaml

from flowsim.errors import ConfigError, FlowsimWarning
from flowsim.gpu_specs import get_gpu
from flowsim.gpu_specs.catalog import DATA_DIR as GPU_DATA_DIR
from flowsim.kernels import KernelStack, gemm_time
from flowsim.kernels import gemm as gemm_mod
from flowsim.kernels import sustained as sus
from flowsim.kernels.calibration import job_stack
from flowsim.kernels.gemm import ceiling_rows, gemm_ceiling
from flowsim.kernels.tables import load_table

pytestmark = pytest.mark.filterwarnings("ignore:software_release .* nearest older release")
BRIDGE = "megatron-bridge-25.09"  # its GB200 FP8 ceiling is MAMF's burst row (torch nightly of 2025-09)


def _tflops(m, n, k, dtype, gpu, stack):
    return 2.0 * m * n * k / gemm_time(m, n, k, dtype, get_gpu(gpu), stack=stack) / 1e12


def test_tables_say_how_long_each_measurement_loaded_the_gpu():
    assert set(load_table("gemm_mamf")["load"]) == {"burst"}  # 50 warm-up + 100 timed launches per shape
    assert set(load_table("gemm_release")["load"]) == {"sustained"}  # 10,000 warm-up launches (Azure)
    assert set(ceiling_rows()["load"]) == {"burst", "sustained"}


def test_sustained_fractions_of_the_gpus_measured_both_ways():
    pairs = sus.sustained_pairs().frame().set_index("gpu")
    assert sorted(pairs.index) == ["a100-sxm4-80gb", "gb200", "h100-sxm", "h200"]
    # GB200 FP8: Azure 16384^3 (2906.9 TFLOP/s) against MAMF 19456x5120x1536 (3615.6): the raw ratio is 0.804,
    # and MAMF's smaller best shape loses more to tiles, waves and the 5 us launch latency, so the ceilings' is lower
    assert 2906.9 / 3615.6 == pytest.approx(0.804, abs=1e-3)
    assert pairs.loc["gb200", "fraction"] == pytest.approx(0.752, abs=2e-3)
    assert pairs.loc["h100-sxm", "fraction"] == pytest.approx(0.940, abs=2e-3)
    assert pairs.loc["h200", "fraction"] == pytest.approx(0.881, abs=2e-3)
    assert pairs.loc["a100-sxm4-80gb", "fraction"] == pytest.approx(0.928, abs=2e-3)
    for gpu, row in pairs.iterrows():
        assert row.fraction == pytest.approx(row.sustained_ceiling / row.burst_ceiling, rel=1e-12)


def test_sustained_stack_reproduces_the_sustained_measurement_from_a_burst_release():
    # the job's release prices GB200 FP8 from the MAMF burst row; under sustained load it runs at Azure's rate
    assert gemm_ceiling("gb200", "fp8", BRIDGE).load == "burst"
    burst = _tflops(16384, 16384, 16384, "fp8", "gb200", KernelStack(BRIDGE))
    held = _tflops(16384, 16384, 16384, "fp8", "gb200", KernelStack(BRIDGE, sustained=True))
    assert held == pytest.approx(2906.9, rel=0.005)
    assert burst / held == pytest.approx(1 / 0.752, rel=0.01)


def test_b200_from_gb200_by_clock_and_power_per_sm_known_answer():
    # same die (148 SMs), spec clocks in the ratio of the 16-bit peaks (2500 / 2250), 1000 W vs 1200 W: the
    # sustained ceiling is GB200's times (2500 / 2250) x (1000 / 1200) ** (1/3) = 1.0456
    gb200, b200 = get_gpu("gb200"), get_gpu("b200")
    factor = (2500 / 2250) * (1000 / 1200) ** (1 / 3)
    assert factor == pytest.approx(1.0456, abs=1e-4)
    assert sus.sustained_ceiling(b200, "fp8") == pytest.approx(sus.sustained_ceiling(gb200, "fp8") * factor,
                                                               rel=1e-12)
    # an independent route: GB200's sustained FP8 rate scaled by the cube law alone, 2906.9 x 0.9410 = 2735
    held = _tflops(16384, 16384, 16384, "fp8", "b200", KernelStack(BRIDGE, sustained=True))
    assert held == pytest.approx(2906.9 * (1000 / 1200) ** (1 / 3), rel=0.01)
    # far below the B200's own burst rate at that shape (MAMF 3432.5 at its best shape)
    assert held < 0.82 * _tflops(16384, 16384, 16384, "fp8", "b200", KernelStack(BRIDGE))


def test_gb300_sustains_more_at_1400w_and_a_power_cap_sustains_less():
    gb200, gb300 = get_gpu("gb200"), get_gpu("gb300")
    up = (1400 / 1200) ** (1 / 3)  # 1.0527: same peaks and SMs, more power
    assert sus.sustained_ceiling(gb300, "bf16") == pytest.approx(sus.sustained_ceiling(gb200, "bf16") * up,
                                                                 rel=1e-12)
    # a job's power_limit_w enters the same law: GB200 capped at 1000 W sustains (1000 / 1200) ** (1/3)
    assert sus.sustained_ceiling(gb200, "fp8", 1000) == pytest.approx(
        sus.sustained_ceiling(gb200, "fp8") * (1000 / 1200) ** (1 / 3), rel=1e-12)
    # the 500 W Grand Teton H100: H100's sustained fraction on its burst ceiling, times (500 / 700) ** (1/3)
    h100, teton = get_gpu("h100-sxm"), get_gpu("h100-sxm-hbm2e")
    assert sus.sustained_ceiling(teton, "bf16") == pytest.approx(
        sus.sustained_ceiling(h100, "bf16") * (500 / 700) ** (1 / 3), rel=1e-12)
    assert sus.sustained_ceiling(h100, "bf16") == pytest.approx(
        0.940 * gemm_ceiling("h100-sxm", "bf16").value, rel=2e-3)


def test_sustained_load_never_raises_a_ceiling_and_other_vendors_keep_theirs():
    # H20: few SMs at a low clock for its 400 W, so its sustained ceiling is above its burst one: unchanged
    h20 = get_gpu("h20")
    assert sus.sustained_ceiling(h20, "bf16") > gemm_ceiling("h100-sxm", "bf16").value
    for gpu in ("h20", "mi300x"):
        assert gemm_time(8192, 8192, 8192, "bf16", get_gpu(gpu), stack=KernelStack(sustained=True)) == \
            gemm_time(8192, 8192, 8192, "bf16", get_gpu(gpu))
    assert sus.sustained_ceiling(get_gpu("mi300x"), "bf16") is None  # no AMD GPU measured both ways
    # a ceiling already measured under sustained load (NeMo 24.07 on H100 FP8: Azure's row) is not derated again
    stack = KernelStack("nemo-24.07")
    with pytest.warns(Warning):
        t = gemm_time(8192, 8192, 8192, "fp8", get_gpu("h100-sxm"), stack=stack)
        assert gemm_time(8192, 8192, 8192, "fp8", get_gpu("h100-sxm"),
                         stack=KernelStack("nemo-24.07", sustained=True)) == t


def test_a_training_job_runs_under_sustained_load():
    gb200 = get_gpu("gb200")
    assert job_stack(gb200, BRIDGE).sustained and job_stack(gb200).sustained
    assert not KernelStack().sustained


def test_bad_load_in_a_table_is_named(monkeypatch):
    good = gemm_mod.table("gemm_mamf")
    bad = good.with_columns(load=["short"] + list(good["load"][1:]))
    real = gemm_mod.table
    monkeypatch.setattr(gemm_mod, "table", lambda name: bad if name == "gemm_mamf" else real(name))
    gemm_mod.ceiling_rows.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"^gemm_mamf: load: must be one of burst, sustained"):
            gemm_mod.ceiling_rows()
    finally:
        monkeypatch.undo()
        gemm_mod.ceiling_rows.cache_clear()
    with pytest.raises(ConfigError, match=r"^sustained: must be true or false"):
        KernelStack(sustained="yes")



def test_a_user_gpu_priced_from_another_gpus_sustained_fraction_is_warned(tmp_path):
    raw = yaml.safe_load((GPU_DATA_DIR / "gb200.yaml").read_text())
    raw.update(key="gbx", name="Hypothetical GB200 at 1500 W", tdp_W=1500)
    path = tmp_path / "gbx.yaml"
    path.write_text(yaml.safe_dump(raw))
    gbx = get_gpu(str(path))
    with pytest.warns(FlowsimWarning, match=r"gemm sustained/burst - from gb200 \(same architecture"):
        t = gemm_time(16384, 16384, 16384, "fp8", gbx, stack=KernelStack(sustained=True))
    with pytest.warns(FlowsimWarning):
        ref = gemm_time(16384, 16384, 16384, "fp8", gbx, stack=KernelStack("azure-gb200-v6-cuda12.8"))
    # GB200's sustained measurement, and 1500 W sustains (1500 / 1200) ** (1/3) = 1.077x its clock
    assert ref / t == pytest.approx((1500 / 1200) ** (1 / 3), rel=1e-3)
