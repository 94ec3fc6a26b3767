"""Kineto trace reader, extraction and validation against the four shared profiler traces.

Expected counts were taken from the trace files themselves, independently of the code under test:
``zcat TRACE | python -c 'import json,sys; ev=json.load(sys.stdin)["traceEvents"]; ...'`` listing kernel
events (``cat == "kernel"``) whose name starts with ``nccl`` with their args ``Collective name``,
``In/Out msg nelems`` and ``dtype``, and ``cpu_op`` events named ``aten::mm``/``addmm``/``bmm`` with their
``Input Dims``. Sizes are nelems x element size (BFloat16 2 B, Float 4 B, Long 8 B; AllGather = Out nelems).
"""
import gzip
import json
from collections import Counter

import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.errors import ConfigError
from flowsim.validation.kineto import extract
from flowsim.kernels.trace_events import read_events
from flowsim.validation.trace_validation import validate_trace

H200 = "flowsim_h200_4rank_sglang_tp4.json.gz"
A100 = "hta_a100_2rank_ddp_nccl.json.gz"
B200 = "tracelens_b200_8rank_vllm_tp8_rank0.json.gz"
MI300X = "tracelens_mi300x_8rank_ddp_resnet_rank0.json.gz"


@pytest.fixture(scope="module")
def contents(shared_data):
    return {name: extract(read_events(shared_data / "traces" / name)) for name in (H200, A100, B200, MI300X)}


def sizes(contents, library="nccl"):
    c = contents.collectives
    c = c[c.library == library]
    return Counter(zip(c.op, c.size_bytes))


def test_h200_collectives(contents):
    c = contents[H200]
    # 32 ncclDevKernel_* kernels: 25 AllReduce (5 x 7,340,032 + 15 x 58,720,256 + 5 x 44,047,360 bf16 elements)
    # and 7 AllGather (Out nelems 129,280 x1, 904,960 x1, 1,034,240 x3, 4,136,960 x2)
    assert sizes(c) == {("allreduce", 7_340_032 * 2): 5, ("allreduce", 58_720_256 * 2): 15,
                        ("allreduce", 44_047_360 * 2): 5, ("allgather", 129_280 * 2): 1,
                        ("allgather", 904_960 * 2): 1, ("allgather", 1_034_240 * 2): 3,
                        ("allgather", 4_136_960 * 2): 2}
    assert set(c.collectives.n_ranks) == {4} and set(c.collectives.dtype) == {"BFloat16", "bf16"}
    # 10 sglang::cross_device_reduce_1stage kernels, launched by sgl_kernel::all_reduce on a [32, 7168] bf16 tensor
    assert sizes(c, "sgl_kernel::all_reduce") == {("allreduce", 32 * 7168 * 2): 10}


def test_h200_gemms(contents):
    g = contents[H200].compute
    g = g[g.kind == "gemm"]
    # 78 aten::mm + 12 aten::bmm cpu ops, each with Input Dims and at least one kernel
    assert Counter(g.op) == {"aten::mm": 78, "aten::bmm": 12}
    # aten::mm Input Dims [[8192, 7168], [7168, 2112]] appears 6 times: m=8192, n=2112, k=7168
    assert ((g.m == 8192) & (g.n == 2112) & (g.k == 7168)).sum() == 6
    # aten::bmm [[32, 32, 128], [32, 128, 512]]: batch 32 of 32x512x128, 4 times
    assert ((g.batch == 32) & (g.m == 32) & (g.n == 512) & (g.k == 128)).sum() == 4


def test_b200_collectives_and_gemms(contents):
    c = contents[B200]
    # one ncclDevKernel_AllGather: Out msg nelems 201,088 bf16
    assert sizes(c) == {("allgather", 201_088 * 2): 1}
    # 73 multimem_all_reduce_kernel launched by symm_mem::multimem_all_reduce_ on [2557440] (37) or [2727936] (36)
    assert sizes(c, "symm_mem::multimem_all_reduce_") == {("allreduce", 2_557_440 * 2): 37,
                                                          ("allreduce", 2_727_936 * 2): 36}
    g = c.compute[c.compute.kind == "gemm"]
    # 108 aten::addmm + 1 aten::mm; addmm Input Dims [[128], [888, 2880], [2880, 128]] 36 times
    assert Counter(g.op) == {"aten::addmm": 108, "aten::mm": 1}
    assert ((g.m == 888) & (g.n == 128) & (g.k == 2880)).sum() == 36


def test_mi300x_collectives(contents):
    c = contents[MI300X]
    # 17 ncclDevKernel_Generic kernels; the first 5 carry no args and have no launch event (unsized)
    assert c.unsized_collectives == 5
    assert sizes(c) == {("allreduce", 2_873_320 * 2): 3, ("allreduce", 8_816_192 * 2): 3,
                        ("broadcast", 9_600 * 2): 3, ("broadcast", 20 * 8): 3}
    # aten::mm x6 + aten::addmm x3 (the classifier head)
    assert len(c.compute[c.compute.kind == "gemm"]) == 9


def test_a100_collectives_without_shapes(contents):
    c = contents[A100]
    # 21 ncclKernel_* kernels: 15 AllReduce of 5 float sizes, 6 Broadcasts (53,120 float, 53 long)
    assert sizes(c) == {("allreduce", 2_049_000 * 4): 3, ("allreduce", 7_875_584 * 4): 3,
                        ("allreduce", 6_563_840 * 4): 3, ("allreduce", 6_637_568 * 4): 3,
                        ("allreduce", 2_431_040 * 4): 3, ("broadcast", 53_120 * 4): 3, ("broadcast", 53 * 8): 3}
    # recorded without record_shapes: no GEMM has Input Dims
    assert c.compute.empty or not (c.compute.kind == "gemm").any()


def test_waiting_rule_on_h200(shared_data):
    v = validate_trace(shared_data / "traces" / H200)
    ar = v.ops[(v.ops.kind == "collective") & (v.ops.library == "nccl") & (v.ops.op == "allreduce")]
    # 117,440,512 B all-reduces: fastest 541.404 us; only the 1238.455 us one exceeds 1.25 x 541.404 = 676.8 us
    big = ar[ar.bytes == 117_440_512]
    assert (big.status == "waiting").sum() == 1
    assert big[big.status == "waiting"].measured_s.iloc[0] == pytest.approx(1238.455e-6)
    assert v.gpu == "h200"


def test_gpu_names_map_to_keys(shared_data):
    assert validate_trace(shared_data / "traces" / MI300X).gpu == "mi300x"
    assert validate_trace(shared_data / "traces" / A100).gpu == "a100-sxm4-40gb"


def _write(path, text, compress=False):
    data = text.encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


KERNEL = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0, "tid": 7,
          "ts": 100.0, "dur": 50.0, "args": {"Collective name": "allreduce", "In msg nelems": 1048576,
                                             "Out msg nelems": 1048576, "dtype": "BFloat16", "Group size": 8,
                                             "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}}
META = {"deviceProperties": [{"name": "NVIDIA H200"}], "distributedInfo": {"world_size": 8}}


def test_truncated_trace_gives_partial_result(tmp_path):
    events = [dict(KERNEL, ts=100.0 * i) for i in range(3)]
    text = json.dumps({**META, "traceEvents": events})
    cut = text[: text.rfind('{"ph"') + 30]  # the third event is cut in the middle
    t = read_events(_write(tmp_path / "cut.json", cut))
    assert t.truncated and len(t.events) == 2
    # a gzip stream cut short is read as far as it goes
    full = gzip.compress(text.encode())
    (tmp_path / "cut.json.gz").write_bytes(full[: len(full) - 20])
    t = read_events(tmp_path / "cut.json.gz")
    assert t.truncated and len(t.events) >= 1
    assert extract(t).collectives.size_bytes.iloc[0] == 1048576 * 2


def test_malformed_events_are_skipped_and_counted(tmp_path):
    events = [KERNEL, "not an event", dict(KERNEL, dur="x"), dict(KERNEL, ts=300.0)]
    t = read_events(_write(tmp_path / "bad.json", json.dumps({**META, "traceEvents": events})))
    assert (len(t.events), t.skipped, t.skipped_examples) == (2, 2, (1, 2))


def test_non_json_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"trace: junk.json is not a Kineto JSON trace: .* at line 1 column 1"):
        read_events(_write(tmp_path / "junk.json", "hello"))
    with pytest.raises(ConfigError, match=r"no traceEvents list"):
        read_events(_write(tmp_path / "list.json", "[1, 2]"))


def test_cli_validate_trace(shared_data, tmp_path):
    path = str(shared_data / "traces" / B200)
    res = CliRunner().invoke(main, ["validate-trace", path])
    assert res.exit_code == 0, res.output
    assert "gemm" in res.output and "allreduce (symm_mem::multimem_all_reduce_)" in res.output
    res = CliRunner().invoke(main, ["validate-trace", path, "--json"])
    out = json.loads(res.output)
    assert out["gpu"] == "b200" and {r["group"] for r in out["summary"]} >= {"gemm", "allgather (nccl)"}
    bad = _write(tmp_path / "junk.json", "hello")
    res = CliRunner().invoke(main, ["validate-trace", str(bad)])
    assert res.exit_code == 2 and res.output.startswith("Error: trace: junk.json is not a Kineto JSON trace")


def test_sizes_from_cpu_records_when_the_kernel_has_none(tmp_path):
    """Older traces: the size comes from record_param_comms, else from the nccl:<coll> annotation."""
    bare = {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllGather_RING_LL", "pid": 0, "tid": 7, "ts": 10.0,
            "dur": 5.0, "args": {"correlation": 1}}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9.0, "dur": 1.0,
              "args": {"correlation": 1, "External id": 42}}
    annotation = {"ph": "X", "cat": "user_annotation", "name": "nccl:_all_gather_base", "ts": 8.0, "dur": 3.0,
                  "args": {"External id": 42, "Input Dims": [[1024], [8192]], "Input type": ["c10::BFloat16"] * 2}}
    record = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 8.0, "dur": 3.0,
              "args": {"External id": 42, "Collective name": "_allgather_base", "In msg nelems": 1024,
                       "Out msg nelems": 8192, "dtype": "BFloat16", "Group size": 8}}
    meta = {**META, "traceEvents": [annotation, launch, bare]}
    c = extract(read_events(_write(tmp_path / "a.json", json.dumps(meta))))
    # annotation: its largest tensor, the gathered 8192 bf16 elements = 16,384 B
    assert (c.collectives.op.iloc[0], c.collectives.size_bytes.iloc[0]) == ("allgather", 8192 * 2)
    meta["traceEvents"].append(record)
    c = extract(read_events(_write(tmp_path / "b.json", json.dumps(meta))))
    # record_param_comms wins (group size 8 from it, 8 also the job's world size): Out msg nelems 8192 x 2 B
    assert (c.collectives.size_bytes.iloc[0], c.collectives.n_ranks.iloc[0], c.collectives.dtype.iloc[0]) == (
        8192 * 2, 8, "BFloat16")
