"""Benchmark harness: shape lists, kernel-DB rows measured on the CPU, input rotation, `flowsim kernels bench`.

Tests that run torch skip only when torch (the `bench` extra) is not installed.
"""
import importlib.util
import sys
from datetime import datetime, timezone

import pandas as pd
import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.kernels import bench
from flowsim.kernels.db import DB_COLUMNS, read_db
from flowsim.explore.kernel_shapes import ATTN_SWEEP_SEQ, MEMORY_SWEEP_ROWS, default_shapes
from flowsim.kernels.shapes import MEMORY_OPS, parse_ops, validate_shapes
from flowsim.model.workload import build_workload

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (extra: flowsim[bench])")

# One tiny case per benchmark op; origin is free text.
TINY = pd.DataFrame([
    dict(op="gemm", m=24, n=16, k=40, origin="plain"),
    dict(op="gemm", m=8, n=12, k=16, batch=3, origin="batched"),
    dict(op="attention", batch=2, heads=2, seq=32, head_dim=16, causal=True),
    dict(op="attention", batch=1, heads=3, seq=16, head_dim=8, causal=False),
    dict(op="rmsnorm", rows=8, cols=64),
    dict(op="layernorm", rows=8, cols=64),
    dict(op="swiglu", rows=4, cols=32),
    dict(op="gelu", rows=8, cols=64),
    dict(op="add", rows=8, cols=64),
])


def test_parse_ops_expands_groups_in_canonical_order():
    assert parse_ops("norm,gemm") == ("gemm", "rmsnorm", "layernorm")
    assert parse_ops(" activation , add ") == ("swiglu", "gelu", "add")
    assert len(parse_ops("all")) == 7
    with pytest.raises(ConfigError, match=r"^ops: must be among gemm, .*all \(got conv\)$"):
        parse_ops("gemm,conv")
    with pytest.raises(ConfigError, match=r"^ops: give at least one op"):
        parse_ops(" , ")


def test_default_shapes_cover_every_gemm_and_attention_flowsim_prices():
    shapes = default_shapes(models=["llama3-8b", "gpt3-175b"], tp_sizes=(1, 4))
    gemms = set(map(tuple, shapes[shapes.op == "gemm"][["m", "n", "k", "batch"]].to_numpy()))
    attn = set(map(tuple, shapes[shapes.op == "attention"][["batch", "heads", "seq", "head_dim"]].to_numpy()))
    for model in ("llama3-8b", "gpt3-175b"):
        for tp in (1, 4):
            wl = build_workload(build_config(model=model, cluster="dgx-h100", tp=tp, sp=tp > 1, mbs=1, gbs=1))
            for block in (wl.layer, wl.embedding, wl.head):
                c = block.compute
                g = c[c.kind == "gemm"]
                assert set(map(tuple, g[["m", "n", "k", "batch"]].to_numpy())) <= gemms
                a = c[c.kind == "attn_fwd"]
                assert set(map(tuple, a[["batch", "heads", "seq_q", "head_dim"]].to_numpy())) <= attn
    # llama3-8b TP 4 with sequence parallelism: fc1 (SwiGLU, 2 x 14336 / 4) over 8192 tokens, the RMSNorm over
    # the 8192 / 4 sequence shard and the activation over [8192, 14336 / 4]
    assert (8192, 7168, 4096, 1) in gemms
    mem = shapes[shapes.op.isin(MEMORY_OPS)]
    assert ((mem.op == "rmsnorm") & (mem.rows == 2048) & (mem.cols == 4096)).any()
    assert ((mem.op == "swiglu") & (mem.rows == 8192) & (mem.cols == 3584)).any()
    assert ((mem.op == "layernorm") & (mem.cols == 12288)).any()  # GPT-3 uses LayerNorm and GELU
    # sweeps: attention by sequence length (16k tokens, hidden 2048) and every memory op by size
    sweep = shapes[(shapes.op == "attention") & (shapes.origin == "sweep")]
    assert set(sweep.seq) == set(ATTN_SWEEP_SEQ) and set(sweep.batch * sweep.seq) == {16384}
    for op in MEMORY_OPS:
        assert set(MEMORY_SWEEP_ROWS) <= set(mem[(mem.op == op) & (mem.cols == 4096)].rows)
    assert not shapes.drop(columns="origin").duplicated().any()
    assert (shapes.dtype == "bf16").all()


@pytest.mark.parametrize("row, message", [
    (dict(op="conv", m=1), r"^op: must be one of gemm, .* \(got 'conv' in row 0\)$"),
    (dict(op="gemm", m=4, n=0, k=4), r"^n: must be >= 1 for gemm rows \(got 0 in row 0\)$"),
    (dict(op="gemm", m=4, n=4, k=2.5), r"^k: must be a whole number \(got 2.5 in row 0\)$"),
    (dict(op="add", rows=-2, cols=4), r"^rows: must be >= 0 \(got -2 in row 0\)$"),
    (dict(op="attention", heads=2, seq=8, head_dim=8, causal="maybe"), r"^causal: must be true/false"),
    (dict(op="add", rows=2, cols=4, dtype="fp8"), r"^dtype: must be one of bf16, fp16, fp32"),
])
def test_validate_shapes_names_column_and_row(row, message):
    with pytest.raises(ConfigError, match=message):
        validate_shapes(pd.DataFrame([row]))


def test_missing_torch_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(ConfigError, match=r"^torch: is required .* pip install 'flowsim\[bench\]'$"):
        bench.import_torch()
    res = CliRunner().invoke(main, ["kernels", "bench", "--gpu-name", "cpu-test", "--ops", "add"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "Error: torch: is required by the benchmark harness; pip install 'flowsim[bench]'"]


@needs_torch
def test_cpu_rows_are_valid_db_rows_with_the_shapes_arithmetic(tmp_path):
    import torch

    rows = bench.run_bench(TINY, "cpu-test", device="cpu", repeats=3, warmup=1)
    assert tuple(rows.columns) == DB_COLUMNS
    rows.to_csv(tmp_path / "rows.csv", index=False)
    db = read_db(tmp_path / "rows.csv")  # the DB loader accepts them
    assert list(db.op) == ["gemm", "gemm", "attn_fwd", "attn_fwd_bwd", "attn_fwd", "attn_fwd_bwd"] + ["memory"] * 5
    assert (db.time_s > 0).all() and (db.gpu == "cpu-test").all() and (db.dtype == "bf16").all()
    assert (db.achieved_Bps == db.bytes / db.time_s).all()
    assert (db.achieved_flop_per_s == db.flops / db.time_s).all()
    # GEMM: 2 m n k batch FLOP; operands read once (2-byte elements) and C written once
    assert list(db.flops[:2]) == [2 * 24 * 16 * 40, 2 * 8 * 12 * 16 * 3]
    assert list(db.bytes[:2]) == [2 * (24 * 40 + 40 * 16 + 24 * 16), 3 * 2 * (8 * 16 + 16 * 12 + 8 * 12)]
    assert list(db.impl[:2]) == ["torch.mm", "torch.bmm"]
    # attention: forward 4 b h s^2 d, halved when causal; forward + backward 3.5 x forward
    fwd_causal = 4 * 2 * 2 * 32**2 * 16 / 2
    fwd_full = 4 * 1 * 3 * 16**2 * 8
    assert list(db.flops[2:6]) == [fwd_causal, 3.5 * fwd_causal, fwd_full, 3.5 * fwd_full]
    assert list(db.causal[2:6]) == [True, True, False, False]
    assert db.bytes[2] == 2 * (2 * 2 * 2 * 32 * 16 + 2 * 2 * 2 * 32 * 16)  # Q, K, V read, O written
    # memory-bound: no FLOP; bytes the torch calls move (rmsnorm reads x and its weight, writes y;
    # layernorm also a bias; swiglu 5 elements per output element; gelu 2; add 3)
    mem = db[db.op == "memory"]
    assert list(mem.impl) == ["torch.rms_norm", "torch.layer_norm", "torch.silu*mul", "torch.gelu", "torch.add"]
    assert list(mem.bytes) == [2 * (2 * 512 + 64), 2 * (2 * 512 + 128), 2 * 5 * 128, 2 * 2 * 512, 2 * 3 * 512]
    assert (mem.flops == 0).all() and (mem.bottleneck == "memory").all()
    # provenance: torch version, device, method, repeats, date
    today = datetime.now(timezone.utc).date().isoformat()
    assert (db.date == today).all()
    src = db.source[0]
    assert f"torch {torch.__version__}" in src and "device cpu (cpu)" in src and "wall clock" in src
    assert "median of 3 after 1 warm-up; 3 input sets" in src and src.endswith("shape 24x16x40")


@needs_torch
def test_cpu_rows_cannot_carry_a_flowsim_gpu_key():
    with pytest.raises(ConfigError, match=r"^gpu_name: is a flowsim GPU key but the run is on the CPU"):
        bench.run_bench(TINY.head(1), "h200", device="cpu", repeats=1, warmup=0)


def test_gemm_rows_on_a_flowsim_gpu_get_the_roofline_bound():
    from flowsim.gpu_specs import get_gpu

    rows = pd.DataFrame([dict(dtype="bf16", m=24, n=16, k=40, batch=1), dict(dtype="bf16", m=8192, n=8192, k=8192,
                                                                             batch=1)])
    # a 24x16x40 GEMM is far below one wave, so the fixed launch latency bounds it; 8192^3 is compute-bound
    assert bench._gemm_bound(rows, get_gpu("h200")) == ["latency", "compute"]
    assert bench._gemm_bound(rows, None) == ["", ""]


@needs_torch
def test_repeats_rotate_through_distinct_input_sets(monkeypatch):
    import torch

    seen = []
    real_mm = torch.mm

    def spy(a, b):
        seen.append(a.data_ptr())
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", spy)
    rows = bench.run_bench(TINY.head(1), "cpu-test", device="cpu", repeats=4, warmup=2)
    # tiny inputs: as many sets as repeats; warm-up uses sets 0, 1, then the timed repeats 0, 1, 2, 3
    assert len(set(seen)) == 4 and seen[:2] == seen[2:4]
    # 4 sets of 3 kB stay far below 256 MiB, so a 256 MiB buffer is also overwritten before each repeat
    assert "4 input sets, 256 MiB cache flush before each repeat;" in rows.source[0]
    monkeypatch.setattr(bench, "ROTATE_BYTES", 1)  # one set already exceeds the rotation size
    seen.clear()
    rows = bench.run_bench(TINY.head(1), "cpu-test", device="cpu", repeats=3, warmup=0)
    assert len(set(seen)) == 1 and "1 input sets; shape" in rows.source[0]


@needs_torch
def test_cli_writes_loadable_rows(tmp_path):
    shapes = tmp_path / "shapes.csv"
    TINY.to_csv(shapes, index=False)
    out = tmp_path / "rows.csv"
    args = ["kernels", "bench", "--gpu-name", "cpu-test", "--ops", "gemm,norm", "--shapes", str(shapes),
            "--device", "cpu", "--repeats", "2", "--warmup", "0", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    db = read_db(out)
    assert list(db.impl) == ["torch.mm", "torch.bmm", "torch.rms_norm", "torch.layer_norm"]
    assert res.output.splitlines()[-1] == f"4 rows from 4 shapes on cpu-test, written to {out}"
    res = CliRunner().invoke(main, args[:-2] + ["--ops", "add", "--json"])
    assert res.exit_code == 0, res.output
    assert '"impl": "torch.add"' in res.output


@pytest.mark.parametrize("extra, message", [
    (["--ops", "conv"], "Error: ops: must be among gemm,"),
    (["--gpu-name", "my gpu"], "Error: gpu_name: must be a flowsim GPU key or a device name"),
    (["--shapes", "missing.csv"], "Error: shapes: cannot read a shape CSV (FileNotFoundError) (got missing.csv)"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, extra, message):
    shapes = tmp_path / "shapes.csv"
    TINY.to_csv(shapes, index=False)
    args = ["kernels", "bench", "--gpu-name", "cpu-test", "--device", "cpu", "--shapes", str(shapes)]
    res = CliRunner().invoke(main, args + extra)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message)


def test_predicted_device_time_is_the_model_time_of_every_launch():
    from flowsim.gpu_specs import get_gpu
    from flowsim.kernels import attention_time, gemm_time, memory_time

    h200 = get_gpu("h200")
    shapes = pd.DataFrame([dict(op="gemm", m=4096, n=4096, k=4096),
                           dict(op="attention", batch=1, heads=8, seq=8192, head_dim=128, causal=True),
                           dict(op="add", rows=8192, cols=4096)])
    attn = [attention_time(1, 8, 8192, 8192, 128, "bf16", h200, causal=True, backward=b) for b in (False, True)]
    one_launch_each = (gemm_time(4096, 4096, 4096, "bf16", h200) + 2 * attn[0] + attn[1]
                       + memory_time(2 * 3 * 8192 * 4096, h200))
    assert bench.predicted_device_time_s(shapes, h200, repeats=7, warmup=3) == pytest.approx(10 * one_launch_each)


def test_cli_dry_run_counts_shapes_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    res = CliRunner().invoke(main, ["kernels", "bench", "--gpu-name", "h200", "--ops", "norm", "--dry-run"])
    assert res.exit_code == 0, res.output
    first, second = res.output.splitlines()
    assert first.startswith("rmsnorm ") and first.endswith(" shapes")
    assert second.startswith("predicted kernel time on h200: ")


def test_cli_compares_rows_of_a_flowsim_gpu_with_the_model(monkeypatch):
    from flowsim.cli import kernels_cmd
    from flowsim.gpu_specs import get_gpu
    from flowsim.kernels import gemm_time

    t_model = gemm_time(4096, 4096, 4096, "bf16", get_gpu("h200"))

    def fake_iter_bench(shapes, gpu_name, **kwargs):  # what an H200 run of one GEMM yields
        yield bench._db_frame(pd.DataFrame([dict(
            op="gemm", impl="torch.mm", gpu=gpu_name, dtype="bf16", m=4096, n=4096, k=4096, batch=1,
            flops=2.0 * 4096**3, bytes=3 * 2.0 * 4096**2, time_s=1.25 * t_model,
            achieved_flop_per_s=2.0 * 4096**3 / (1.25 * t_model), achieved_Bps=6.0 * 4096**2 / (1.25 * t_model),
            bottleneck="compute", source="test", date="2026-11-29")]))

    monkeypatch.setattr(kernels_cmd, "iter_bench", fake_iter_bench)
    res = CliRunner().invoke(main, ["kernels", "bench", "--gpu-name", "h200", "--ops", "gemm"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].endswith(f"model {t_model / 1e-6:.2f} us (-20.0%)")
    assert lines[1] == "gemm: 1 rows, model vs measured median |error| 20.0%, max 20.0%"
    assert lines[2].startswith("1 rows from ") and lines[2].endswith(" shapes on h200")  # default GEMM shapes
