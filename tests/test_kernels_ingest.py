"""Kineto trace ingest: GEMM rows with the aten shapes, and the model against those measured kernels."""
import json

import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.errors import ConfigError
from flowsim.kernels.db import DB_COLUMNS
from flowsim.kernels.ingest import ingest_trace, trace_accuracy

H200_TRACE = "traces/flowsim_h200_4rank_sglang_tp4.json.gz"
B200_TRACE = "traces/tracelens_b200_8rank_vllm_tp8_rank0.json.gz"


@pytest.fixture(scope="module")
def h200_rows(shared_data):
    return ingest_trace(shared_data / H200_TRACE)


def test_h200_trace_gemm_rows_match_aten_shapes(h200_rows):
    rows = h200_rows
    assert tuple(rows.columns) == DB_COLUMNS and rows.attrs["gpu"] == "h200"
    assert len(rows) == 90 and set(rows.dtype) == {"bf16"} and (rows.op == "gemm").all()
    assert (rows.flops == 2.0 * rows.m * rows.n * rows.k * rows.batch).all()
    # The aten::mm with Input Dims [[1024, 7168], [7168, 2112]] ran one nvjet kernel of 42.176 us
    # (shared/research/maxmin-and-traces.md quotes this launch).
    hit = rows[(rows.m == 1024) & (rows.n == 2112) & (rows.k == 7168)]
    assert 42.176e-6 in list(hit.time_s.round(12)) and hit.source.str.contains("nvjet_tst_144x128").any()
    assert (rows[rows.batch > 1].k.isin([128, 512])).all()  # the aten::bmm rows (batch 32)
    assert rows.date.iloc[0] == "2025-07-01"


def test_model_against_h200_trace_gemms(h200_rows):
    acc = trace_accuracy(h200_rows)
    # Regression bounds (docs/KERNELS.md, "GEMMs in profiler traces"): median |error| 5.9%, max 37.4%.
    assert acc.error.abs().median() <= 0.06
    assert acc.error.abs().max() <= 0.38
    big = acc[acc.m >= 6145]  # prefill GEMMs, mostly compute-bound: median |error| 4.3%, max 20.7%
    assert big.error.abs().median() <= 0.045 and big.error.abs().max() <= 0.21


def test_b200_trace_and_unknown_gpu(shared_data, tmp_path):
    rows = ingest_trace(shared_data / B200_TRACE)
    assert rows.attrs["gpu"] == "b200" and len(rows) == 109
    assert (rows.flops == 2.0 * rows.m * rows.n * rows.k).all()
    err = trace_accuracy(rows).error.abs()  # docs/KERNELS.md: median 3.1%, max 13.8%
    assert err.median() <= 0.035 and err.max() <= 0.14
    odd = tmp_path / "t.json"
    odd.write_text(json.dumps({"traceEvents": [], "deviceProperties": [{"name": "Mystery GPU"}]}))
    message = r"^gpu: cannot tell the GPU from the trace; pass its key \(got Mystery GPU\)$"
    with pytest.raises(ConfigError, match=message):
        ingest_trace(odd)
    assert len(ingest_trace(odd, gpu="h100-sxm")) == 0


def test_cli_ingest(shared_data, tmp_path):
    out = tmp_path / "rows.csv"
    res = CliRunner().invoke(main, ["kernels", "ingest", str(shared_data / B200_TRACE), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1].startswith("109 GEMMs on b200: median |error| ")
    assert out.read_text().splitlines()[0] == ",".join(DB_COLUMNS)
    res = CliRunner().invoke(main, ["kernels", "ingest", str(tmp_path / "rows.csv")])
    assert res.exit_code == 2 and res.output.startswith("Error: trace: ")
