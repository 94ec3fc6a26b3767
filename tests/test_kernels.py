"""Kernel compute model: calibrated GEMM/attention/memory efficiencies, quantisation arithmetic, cross-GPU."""
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import yaml

from flowsim.errors import ConfigError, FlowsimWarning
from flowsim.gpu_specs import get_gpu, list_gpus
from flowsim.gpu_specs.catalog import DATA_DIR as GPU_DATA_DIR
from flowsim.kernels import (
    KERNEL_MIN_TIME_S,
    OP_COLUMNS,
    attention_time,
    gemm_time,
    kernel_references,
    memory_time,
    op_breakdown,
    op_times,
)
from flowsim.kernels.gemm import best_shape_efficiency, gemm_candidates
from flowsim.kernels.tables import load_table, read_measurement_csv

MAMF = load_table("gemm_mamf")
FA = load_table("flash_attention")


def test_mamf_table_matches_shared_measurements(shared_data):
    """The shipped MAMF rows are the figures of kernel_measurements.md section 1 (same value, theory, shape)."""
    text = (shared_data / "kernel_measurements.md").read_text()
    bf16, fp8 = text.split("**BF16**")[1].split("**FP8")
    for dtype, section in (("bf16", bf16), ("fp8", fp8)):
        pattern = r"\|\s*(NVIDIA|AMD) ([\w ]+?)\s*\|\s*([\d.]+) \|\s*(\d+) \|[^|]+\|\s*(\d+)x(\d+)x(\d+)"
        rows = re.findall(pattern, section)
        ours = MAMF[MAMF["dtype"] == dtype]
        assert len(ours) == len(rows) - 1  # GH200 has no flowsim key
        for vendor, name, mamf, theory, m, n, k in rows:
            hit = ours[(ours["best_m"] == int(m)) & (ours["best_n"] == int(n)) & (ours["best_k"] == int(k))]
            if name.startswith("GH200"):
                assert hit.empty
                continue
            assert hit["mamf_tflops"].item() == float(mamf) and hit["theory_tflops"].item() == float(theory)


@pytest.mark.parametrize("row", list(MAMF.itertuples()), ids=lambda r: f"{r.gpu}-{r.dtype}")
def test_gemm_reproduces_mamf_at_best_shape(row):
    gpu = get_gpu(row.gpu)
    t = gemm_time(row.best_m, row.best_n, row.best_k, row.dtype, gpu)
    achieved_tflops = 2 * row.best_m * row.best_n * row.best_k / t / 1e12
    assert achieved_tflops == pytest.approx(row.mamf_tflops, rel=0.05)


def test_tile_quantisation_arithmetic():
    # One SM, so only tiles matter. m = 100 pads to 128 rows in every tile shape (64-row tiles: 2 x 64):
    # useful 100*256*64 / issued 128*256*64 = 100/128. K = 100 pads to 2 steps of 64 = 128 as well.
    assert best_shape_efficiency([100], [256], [64], [1], 1)[0] == pytest.approx(100 / 128)
    assert best_shape_efficiency([100], [256], [100], [1], 1)[0] == pytest.approx((100 / 128) ** 2)
    # m = 192 fits 3 tiles of 64 exactly: no loss.
    assert best_shape_efficiency([192], [256], [64], [1], 1)[0] == pytest.approx(1.0)


def test_wave_quantisation_arithmetic():
    # H100 (132 SMs), m = n = 1408 = 11 x 128, k = 64 (one K step, so no split-K):
    # 128x128 tiles: 121 units in one wave of 132 -> 121/132; 256x128: 6 x 11 = 66 tiles of which the last row is
    # half empty -> 1408^2 / (132*256*128) = 0.458; 64x128: 242 units in 2 waves -> 242/264 = 121/132.
    eff, extra = gemm_candidates([1408], [1408], [64], [1], 132)
    assert eff.max() == pytest.approx(121 / 132)
    assert eff.min() == 0  # split-K candidates with fewer than 64 K elements per slice are invalid
    assert extra[0, 0] == 0
    assert eff[0, 0] == pytest.approx(1408**2 / (132 * 256 * 128))  # candidate 0: 256x128 tile, no split


# Fixed GEMM latency on Hopper: the shortest GEMM in the H200 trace (a 32-batch 32x512x128 bmm, 4.384 us) minus
# its ideal work time, the larger of 2*32*512*128*32 FLOP / 989.4e12 and 2*32*(32*128 + 128*512 + 32*512) bytes
# / 4.8e12 B/s = 1.147 us.
HOPPER_LATENCY_S = 4.384e-6 - max(
    2 * 32 * 512 * 128 * 32 / 989.4e12, 2 * 32 * (32 * 128 + 128 * 512 + 32 * 512) / 4.8e12
)


def test_large_gemm_gets_mamf_and_skinny_gemms_get_less():
    h100 = get_gpu("h100-sxm")
    mamf = 794.5e12
    big = 2 * 8192**3 / gemm_time(8192, 8192, 8192, "bf16", h100)
    assert big == pytest.approx(mamf, rel=0.05)
    # 1024x8192x128 moves 2*(1024*128 + 128*8192 + 1024*8192) bytes at 3.35e12 * (3534/4800) B/s (H200 stream
    # triad over spec, the Hopper reference for memory) after the 3.24 us GEMM latency: memory-bound, 18% of peak
    # instead of 80%.
    eff_m, latency = 3534 / 4800, HOPPER_LATENCY_S
    t_skinny = gemm_time(1024, 8192, 128, "bf16", h100)
    bytes_skinny = 2 * (1024 * 128 + 128 * 8192 + 1024 * 8192)
    assert t_skinny == pytest.approx(latency + bytes_skinny / (3.35e12 * eff_m), rel=1e-9)
    assert 2 * 1024 * 8192 * 128 / t_skinny < 0.3 * mamf
    # m = 64 against an 8192x8192 weight: the weight read dominates, 2*(64*8192*2 + 8192^2) bytes.
    t_m64 = gemm_time(64, 8192, 8192, "bf16", h100)
    assert t_m64 == pytest.approx(latency + 2 * (2 * 64 * 8192 + 8192**2) / (3.35e12 * eff_m), rel=1e-9)
    assert 2 * 64 * 8192 * 8192 / t_m64 < 0.2 * mamf


def test_batched_gemm_fills_waves():
    # 4 GEMMs of 1408x1408x64 in one launch: 484 128x128 units = 3.67 waves of 132 -> 484/528 of the machine.
    h100 = get_gpu("h100-sxm")
    assert best_shape_efficiency([1408], [1408], [64], [4], 132)[0] == pytest.approx(484 / 528)
    # 4096^3: 2048 tiles of 128x64 in 16 waves of 132 -> 2048/2112; batch 8: 16384 in 125 waves -> 16384/16500.
    # Both pay the launch latency once.
    latency = HOPPER_LATENCY_S
    work8 = gemm_time(4096, 4096, 4096, "bf16", h100, batch=8) - latency
    work1 = gemm_time(4096, 4096, 4096, "bf16", h100) - latency
    assert work8 / work1 == pytest.approx(8 * (2048 / 2112) / (16384 / 16500), rel=1e-9)


def _fa_time(row, gpu, backward, impl="fa2"):
    return attention_time(
        row.batch, row.heads, row.seq_len, row.seq_len, row.head_dim, "bf16", gpu,
        causal=bool(row.causal), backward=backward, attention_impl=impl,
    )


@pytest.mark.parametrize("gpu_key", ["a100-sxm4-80gb", "h100-sxm"])
def test_attention_reproduces_fa2_fwd_bwd_table(gpu_key):
    gpu = get_gpu(gpu_key)
    rows = FA[(FA["gpu"] == gpu_key) & (FA["pass"] == "fwd_bwd")]
    assert len(rows) == 24  # 2 head dims x causal/not x 6 sequence lengths
    for r in rows.itertuples():
        f = 4 * r.batch * r.heads * r.seq_len**2 * r.head_dim / (2 if r.causal else 1)
        t = _fa_time(r, gpu, False) + _fa_time(r, gpu, True)
        assert 3.5 * f / t / 1e12 == pytest.approx(r.tflops, rel=0.05), r


@pytest.mark.parametrize("impl", ["fa2", "fa3"])
def test_attention_reproduces_h100_forward_table(impl):
    gpu = get_gpu("h100-sxm")
    rows = FA[(FA["impl"] == impl) & (FA["pass"] == "fwd")]
    assert len(rows) == 36  # 3 head dims x causal/not x 6 sequence lengths
    for r in rows.itertuples():
        f = 4 * r.batch * r.heads * r.seq_len**2 * r.head_dim / (2 if r.causal else 1)
        assert f / _fa_time(r, gpu, False, impl) / 1e12 == pytest.approx(r.tflops, rel=0.05), r


def test_attention_backward_derived_from_fwd_bwd_and_fwd():
    # H100 non-causal hd128 at 16k: fwd_bwd 338, fwd 370 TFLOP/s -> bwd = 2.5 / (3.5/338 - 1/370) = 326.7 TFLOP/s.
    h100 = get_gpu("h100-sxm")
    f = 4 * 1 * 16 * 16384**2 * 128
    t_bwd = attention_time(1, 16, 16384, 16384, 128, "bf16", h100, backward=True)
    assert 2.5 * f / t_bwd / 1e12 == pytest.approx(2.5 / (3.5 / 338 - 1 / 370), rel=1e-6)


def test_attention_interpolates_monotonically_in_seq_and_between_head_dims():
    seqs = np.unique(np.geomspace(512, 16384, 40).astype(int))
    for gpu_key in ("a100-sxm4-80gb", "h100-sxm"):
        gpu = get_gpu(gpu_key)
        for causal in (False, True):
            for backward in (False, True):
                for hd in (64, 96, 128):
                    tput = [
                        4 * s * s * 16 * hd / (2 if causal else 1) * (2.5 if backward else 1)
                        / attention_time(1, 16, s, s, hd, "bf16", gpu, causal=causal, backward=backward)
                        for s in seqs
                    ]
                    assert np.all(np.diff(tput) >= -1e-6 * tput[0]), (gpu_key, causal, backward, hd)
    # hd 96 lies between hd 64 and hd 128: A100 non-causal at 4k: (171 + 196) / 2 = 183.5 fwd+bwd TFLOP/s
    a100 = get_gpu("a100-sxm4-80gb")
    f = 4 * 4 * 16 * 4096**2 * 96
    t = attention_time(4, 16, 4096, 4096, 96, "bf16", a100) + attention_time(
        4, 16, 4096, 4096, 96, "bf16", a100, backward=True
    )
    assert 3.5 * f / t / 1e12 == pytest.approx((171 + 196) / 2, rel=1e-9)


HOPPER_MEMORY_LATENCY_S = 3.011e-6  # data/memory_latency.csv, h200 (reproduced from the trace in test_kernels_ingest)


def test_memory_bound_ops_pay_latency_plus_bytes_over_measured_bandwidth():
    # h100-pcie has its own stream row: triad 1832 of 2000 GB/s; h100-sxm borrows H200's 3534 of 4800. Both take
    # the H200 memory-bound launch latency (same architecture), V100 too (same vendor, closest HBM bandwidth).
    lat = HOPPER_MEMORY_LATENCY_S
    assert memory_time(1e9, get_gpu("h100-pcie")) == pytest.approx(lat + 1e9 / (2.0e12 * 1832 / 2000))
    assert memory_time(1e9, get_gpu("h100-sxm")) == pytest.approx(lat + 1e9 / (3.35e12 * 3534 / 4800))
    # V100: scale 804 > triad 814? No: triad 814 is the better of the two -> 814/900.
    assert memory_time(1e9, get_gpu("v100-sxm2-32gb")) == pytest.approx(lat + 1e9 / (0.9e12 * 814 / 900))
    # A tiny kernel costs about the latency: 4 KiB on H200 = 3.011 us + 1.2 ns; B200 and MI300X have their own.
    assert memory_time(4096, get_gpu("h200")) == pytest.approx(lat + 4096 / (4.8e12 * 3534 / 4800), rel=1e-12)
    assert memory_time(0, get_gpu("b200")) == pytest.approx(2.786e-6, rel=1e-12)
    assert memory_time(0, get_gpu("mi300x")) == pytest.approx(3.599e-6, rel=1e-12)
    assert memory_time(0, get_gpu("h100-sxm")) == pytest.approx(lat) and lat > KERNEL_MIN_TIME_S
    b = op_breakdown(pd.DataFrame({"kind": ["memory"], "dtype": ["bf16"], "bytes": [4096.0]}), get_gpu("h200"))
    assert (b.latency_s.iloc[0], b.bound.iloc[0]) == (pytest.approx(lat), "latency")
    refs = {r.table: r for r in kernel_references(get_gpu("a100-sxm4-80gb"))}
    assert (refs["memory_latency"].measured, refs["memory_latency"].rule) == ("h200", "same vendor (nvidia)")


def _random_ops(n, seed=0):
    rng = np.random.default_rng(seed)
    kind = rng.choice(["gemm", "attn_fwd", "attn_bwd", "memory"], n)
    return pd.DataFrame(
        {
            "kind": kind,
            "dtype": np.where(kind == "memory", "fp32", rng.choice(["bf16", "fp16", "fp8"], n)),
            "m": rng.integers(1, 9000, n), "n": rng.integers(1, 9000, n), "k": rng.integers(1, 9000, n),
            "batch": rng.integers(0, 5, n), "heads": rng.integers(1, 64, n), "kv_heads": 0,
            "seq_q": rng.integers(1, 20000, n), "seq_k": rng.integers(1, 20000, n),
            "head_dim": rng.choice([64, 96, 128, 256], n), "causal": rng.random(n) < 0.5,
            "bytes": np.where(kind == "memory", rng.random(n) * 1e9, 0.0),
        }
    )


def test_vectorised_call_equals_per_row_calls():
    ops = _random_ops(60)
    assert set(ops.columns) <= set(OP_COLUMNS)
    for key in ("h100-sxm", "b200", "mi300x"):
        gpu = get_gpu(key)
        whole = op_times(ops, gpu)
        rows = np.array([op_times(ops.iloc[[i]], gpu)[0] for i in range(len(ops))])
        np.testing.assert_allclose(whole, rows, rtol=1e-12)
        assert np.all(whole >= KERNEL_MIN_TIME_S)


def test_scalar_helpers_equal_table_rows():
    gpu = get_gpu("h200")
    ops = pd.DataFrame(
        {"kind": ["gemm", "attn_bwd"], "dtype": ["bf16", "bf16"], "m": [4096, 0], "n": [4096, 0], "k": [4096, 0],
         "batch": [1, 2], "heads": [0, 32], "kv_heads": [0, 8], "seq_q": [0, 4096], "seq_k": [0, 4096],
         "head_dim": [0, 128], "causal": [False, True]}
    )
    t = op_times(ops, gpu)
    assert t[0] == gemm_time(4096, 4096, 4096, "bf16", gpu)
    assert t[1] == attention_time(2, 32, 4096, 4096, 128, "bf16", gpu, kv_heads=8, causal=True, backward=True)


GEMM_1 = {"kind": ["gemm"], "dtype": ["bf16"], "m": [1], "n": [1], "k": [1]}


@pytest.mark.parametrize(
    "ops, message",
    [
        ({"kind": ["conv"], "dtype": ["bf16"]},
         r"^kind: must be one of gemm, attn_fwd, attn_bwd, memory \(got 'conv' in row 0\)$"),
        ({**GEMM_1, "dtype": ["int8"]},
         r"^dtype: must be one of fp32, tf32, bf16, fp16, fp8, nvfp4, mxfp4 \(got 'int8' in row 0\)$"),
        ({**GEMM_1, "m": [-4]}, r"^m: must be >= 0 \(got -4 in row 0\)$"),
        ({**GEMM_1, "k": [0]}, r"^k: must be >= 1 for gemm rows \(got 0 in row 0\)$"),
        ({"kind": ["attn_fwd"], "dtype": ["bf16"], "heads": [8], "seq_q": [1], "seq_k": [1]},
         r"^head_dim: must be >= 1 for attn_fwd/attn_bwd rows \(got 0 in row 0\)$"),
        ({"kind": ["memory"], "dtype": ["bf16"], "bytes": [float("inf")]},
         r"^bytes: must be a finite number \(got inf in row 0\)$"),
        ({"kind": ["memory"], "dtype": ["bf16"], "bytes": ["lots"]}, r"^bytes: must be a finite number \(got 'lots'"),
        ({**GEMM_1, "m": [1.5]}, r"^m: must be a whole number \(got 1.5 in row 0\)$"),
        ({"kind": ["gemm"], "m": [1]}, r"^dtype: column is required in the op table$"),
        ({**GEMM_1, "causal": ["yes"]}, r"^causal: must be true/false \(or 1/0\) \(got 'yes' in row 0\)$"),
        ({**GEMM_1, "m": [float("nan")]}, r"^m: must be >= 1 for gemm rows \(got 0 in row 0\)$"),
    ],
)
def test_bad_op_tables_name_the_column(ops, message):
    with pytest.raises(ConfigError, match=message):
        op_times(pd.DataFrame(ops), get_gpu("h100-sxm"))


def test_concatenated_tables_with_empty_cells_price_like_separate_tables():
    gemm = pd.DataFrame({"kind": ["gemm"], "dtype": ["bf16"], "m": [4096], "n": [4096], "k": [4096]})
    attn = pd.DataFrame({"kind": ["attn_fwd"], "dtype": ["bf16"], "batch": [2], "heads": [16], "seq_q": [4096],
                         "seq_k": [4096], "head_dim": [128], "causal": [True]})
    both = pd.concat([gemm, attn], ignore_index=True)  # NaN where a kind has no such column
    gpu = get_gpu("h200")
    assert list(op_times(both, gpu)) == [op_times(gemm, gpu)[0], op_times(attn, gpu)[0]]


def test_empty_op_table_prices_nothing():
    empty = pd.DataFrame({"kind": pd.Series([], dtype=object), "dtype": pd.Series([], dtype=object)})
    assert op_times(empty, get_gpu("h100-sxm")).shape == (0,)


def test_dtype_the_gpu_lacks_and_fa3_off_hopper_are_errors():
    with pytest.raises(ConfigError, match=r"^dtype: a100-sxm4-80gb has no fp8 peak in its spec \(got fp8\)$"):
        gemm_time(1024, 1024, 1024, "fp8", get_gpu("a100-sxm4-80gb"))
    with pytest.raises(ConfigError, match=r"^attention_impl: FlashAttention-3 runs on Hopper GPUs only"):
        attention_time(1, 16, 1024, 1024, 128, "bf16", get_gpu("b200"), attention_impl="fa3")


def test_cross_gpu_references_are_reported():
    refs = {(r.table, r.dtype): r for r in kernel_references(get_gpu("h200"))}
    bf16, fp8 = refs["gemm_mamf", "bf16"], refs["gemm_mamf", "fp8"]
    assert (bf16.measured, bf16.rule) == ("h100-sxm", "same architecture (hopper)")
    assert (fp8.measured, fp8.rule) == ("h200", "own measurement")
    assert refs["flash_attention", "fp16"].measured == "h100-sxm"
    assert refs["hbm_stream", "-"].rule == "own measurement"
    b200 = {(r.table, r.dtype): r for r in kernel_references(get_gpu("b200"))}
    assert (b200["flash_attention", "fp16"].measured, b200["flash_attention", "fp16"].rule) == (
        "gb200", "same architecture (blackwell)")  # FA2: the GB200 anchor (tests/test_kernels_attention.py)
    b200_cudnn = {r.table: r for r in kernel_references(get_gpu("b200"), attention_impl="cudnn")}
    assert (b200_cudnn["flash_attention"].measured, b200_cudnn["flash_attention"].rule) == (
        "h100-sxm", "same vendor (nvidia)")
    # H200 and H100 have the same bf16 peak and SM count: compute-bound GEMMs take the same time.
    h200, h100 = get_gpu("h200"), get_gpu("h100-sxm")
    assert gemm_time(8192, 8192, 8192, "bf16", h200) == gemm_time(8192, 8192, 8192, "bf16", h100)


def test_builtin_gpu_priced_across_architectures_warns_and_same_architecture_does_not():
    with pytest.warns(FlowsimWarning) as record:
        gemm_time(8192, 8192, 8192, "fp16", get_gpu("v100-sxm2-32gb"))
    assert [str(w.message) for w in record] == [
        "gpu v100-sxm2-32gb: no GEMM measurement of its architecture (volta); efficiencies transferred across "
        "architectures (bf16 from a100-pcie-80gb), expect larger errors"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlowsimWarning)
        gemm_time(8192, 8192, 8192, "bf16", get_gpu("h200"))  # priced from H100: same architecture, no warning


def test_user_spec_gpu_is_scaled_by_flops_and_bandwidth_with_a_warning(tmp_path):
    raw = yaml.safe_load((GPU_DATA_DIR / "h100-sxm.yaml").read_text())
    raw.update(key="x100", name="Hypothetical X100", peak_TFLOPS={"bf16": 2 * 989.4}, hbm_TBps=2 * 3.35)
    path = tmp_path / "x100.yaml"
    path.write_text(yaml.safe_dump(raw))
    x100, h100 = get_gpu(str(path)), get_gpu("h100-sxm")
    with pytest.warns(FlowsimWarning) as record:
        t_x = gemm_time(8192, 8192, 8192, "bf16", x100)
    assert [str(w.message) for w in record] == [
        "gpu x100: no own kernel measurements, scaled: hbm_stream - from h200 (same architecture (hopper)); "
        "gemm_mamf bf16 from h100-sxm (same architecture (hopper)); gemm_latency - from h200 (same architecture "
        "(hopper))"
    ]
    latency = HOPPER_LATENCY_S  # the same fixed launch latency; the work part halves with twice the FLOP/s
    assert t_x - latency == pytest.approx((gemm_time(8192, 8192, 8192, "bf16", h100) - latency) / 2, rel=1e-12)
    with pytest.warns(FlowsimWarning):  # the bandwidth term halves, the fixed launch time stays
        lat = HOPPER_MEMORY_LATENCY_S
        assert memory_time(1e9, x100) - lat == pytest.approx((memory_time(1e9, h100) - lat) / 2, rel=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gemm_time(8192, 8192, 8192, "bf16", get_gpu("h200"))  # built-in GPUs do not warn


def test_measurement_rows_without_source_are_rejected(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("gpu,mamf_tflops,source\nh100-sxm,794.5,somewhere\nb200,1745,\n")
    with pytest.raises(ConfigError, match=r"^t.csv: source: every row needs a source \(got row 2\)$"):
        read_measurement_csv(bad)
    bad.write_text("gpu,mamf_tflops\nh100-sxm,794.5\n")
    with pytest.raises(ConfigError, match=r"^t.csv: source: column is required$"):
        read_measurement_csv(bad)


def test_public_functions_document_every_parameter():
    import inspect

    import flowsim.gpu_specs as gs
    import flowsim.kernels as ks

    funcs = [getattr(ks, n) for n in ks.__all__] + [gs.get_gpu, gs.list_gpus, gs.load_spec_file]
    for f in (f for f in funcs if inspect.isfunction(f)):
        doc = inspect.getdoc(f) or ""
        for p in inspect.signature(f).parameters:
            assert re.search(rf"\b{p}\b", doc), f"{f.__name__}: parameter {p} undocumented"


def test_docstring_examples():
    import doctest

    import flowsim.kernels.model

    assert doctest.testmod(flowsim.kernels.model).failed == 0


def test_memory_rows_are_priced_by_bytes_on_every_gpu():
    # Adam-like row: FLOP are reported, not priced, so GPUs without an fp32 figure (B300, GB300) work too.
    ops = pd.DataFrame({"kind": ["memory"], "dtype": ["fp32"], "flops": [1e9], "bytes": [1e9]})
    for gpu in list_gpus():
        assert op_times(ops, gpu)[0] == memory_time(1e9, gpu)
