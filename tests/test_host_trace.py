"""Host figures from Kineto CPU spans (flowsim.validation.host_trace, validate-trace --host): known answers."""
import gzip
import json
import math

import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.validation.host_trace import host_costs_from_trace

TRACES = ("flowsim_h200_4rank_sglang_tp4", "hta_a100_2rank_ddp_nccl", "tracelens_b200_8rank_vllm_tp8_rank0",
          "tracelens_mi300x_8rank_ddp_resnet_rank0")


def _x(name, cat, ts, dur, tid=1):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def _trace(tmp_path):
    ev = [
        # two passes of a layer, each one top-level op launching 2 kernels in 30 us
        _x("nn.Module: MyDecoderLayer_0", "python_function", 0, 40),
        _x("aten::linear", "cpu_op", 5, 30), _x("aten::mm", "cpu_op", 6, 10),
        _x("cudaLaunchKernel", "cuda_runtime", 8, 3), _x("cudaLaunchKernel", "cuda_runtime", 20, 3),
        _x("nn.Module: MyDecoderLayer_0", "python_function", 100, 40),
        _x("aten::linear", "cpu_op", 105, 30),
        _x("cudaLaunchKernel", "cuda_runtime", 108, 3), _x("cudaLaunchKernel", "cuda_runtime", 120, 3),
        # an op that waits for the GPU and one whose launch blocked: both left out of the per-kernel figure
        _x("aten::item", "cpu_op", 200, 500), _x("cudaLaunchKernel", "cuda_runtime", 210, 3),
        _x("cudaStreamSynchronize", "cuda_runtime", 220, 400),
        _x("aten::add", "cpu_op", 800, 200), _x("cudaLaunchKernel", "cuda_runtime", 810, 150),
        # the autograd engine's thread: one backward function launching one kernel in 8 us
        _x("autograd::engine::evaluate_function: MulBackward0", "cpu_op", 300, 8, tid=2),
        _x("cudaLaunchKernel", "cuda_runtime", 302, 3, tid=2),
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": ev}, fh)
    return path


def test_known_answers(tmp_path):
    h = host_costs_from_trace(_trace(tmp_path))
    assert (h.launches, h.threads, h.op_spans) == (7, 2, 3)
    assert h.launch_call_us == 3.0
    assert h.cpu_us_per_kernel == pytest.approx(68 / 5) and h.cpu_us_per_kernel_median == pytest.approx(15)
    assert h.launch_gap_us == 88  # gaps 12, 88, 12, 90, 600 us between the first thread's launches: median 88
    main, autograd = h.threads_detail
    assert (main.launches, main.autograd, main.cpu_us_per_kernel_median) == (6, False, 15)
    assert (autograd.thread, autograd.launches, autograd.autograd, autograd.cpu_us_per_kernel_median) == \
        ("1/2", 1, True, 8)
    (layer,) = h.layers
    assert (layer.module, layer.passes, layer.cpu_us, layer.kernels, layer.cpu_us_per_kernel) == \
        ("MyDecoderLayer", 2, 40, 2, 20)


def test_every_shared_trace(shared_data):
    for name in TRACES:
        h = host_costs_from_trace(shared_data / "traces" / f"{name}.json.gz")
        assert h.launches > 300 and 2.0 < h.launch_call_us < 12.0, name  # host-overhead.md sec. 2: 3.2-10 us
        assert math.isfinite(h.cpu_us_per_kernel_median) and h.cpu_us_per_kernel_median > h.launch_call_us


def test_cli(tmp_path):
    path = str(_trace(tmp_path))
    out = CliRunner().invoke(main, ["validate-trace", path, "--host"])
    assert out.exit_code == 0, out.output
    assert "launch call (median)               3.00 us" in out.output and "MyDecoderLayer" in out.output
    js = json.loads(CliRunner().invoke(main, ["validate-trace", path, "--host", "--json"]).output)
    assert js["cpu_us_per_kernel_median"] == 15 and js["layers"][0]["passes"] == 2
    assert [t["autograd"] for t in js["threads_detail"]] == [False, True]
    assert "(autograd: backward)" in out.output
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    err = CliRunner().invoke(main, ["validate-trace", str(bad), "--host"])
    assert err.exit_code == 2 and err.output.count("\n") == 1
