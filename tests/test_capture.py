"""flowsim.capture: record a plain-PyTorch GPT step at large world size on CPU and simulate it.

Example model (flowsim.capture.examples.GPTShape defaults unless stated): L = 2 blocks, h = 256, 4 heads
(8 for TP), vocab V = 1024, seq s = 128, micro-batch b = 2, so T = b s = 256 tokens; bf16 (2 bytes).
Parameters per block: ln1 + ln2 2 * 2h = 1024, qkv 3h^2 + 3h = 197376, proj h^2 + h = 65792,
fc1 4h^2 + 4h = 263168, fc2 4h^2 + h = 262400; total 789760. Embedding and head h V = 262144 each, final
LayerNorm 512.
"""
import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flowsim.capture import GPTShape, capture, gpt_example, load, save  # noqa: E402
from flowsim.capture.program import _timeline, simulate_workload  # noqa: E402
from flowsim.step.overlap import slowed_end_s as _slowed  # noqa: E402
from flowsim.errors import ConfigError, FlowsimWarning  # noqa: E402
from flowsim.step.overlap import overlapped_s  # noqa: E402

BLOCK = 1024 + 197376 + 65792 + 263168 + 262400
assert BLOCK == 789760
T, H, L, V = 256, 256, 2, 1024


def _comm_list(w):
    return [(c["op"], c["size_bytes"], len(w.groups[c["group"]])) for c in w.comms()]


@pytest.fixture(scope="module")
def ddp():
    setup, step = gpt_example("ddp", 64, bucket_cap_mb=0.25)
    return capture(step, setup=setup, world_size=64)


@pytest.fixture(scope="module")
def fsdp():
    setup, step = gpt_example("fsdp", 64)
    return capture(step, setup=setup, world_size=64)


@pytest.fixture(scope="module")
def tp_dp():
    setup, step = gpt_example("tp-dp", 512, tp=8, shape=GPTShape(heads=8))
    return capture(step, setup=setup, world_size=512)


def test_ddp_buckets(ddp):
    # bucket cap 0.25 MiB = 262144 B = 131072 bf16 elements; buckets take gradients in the order they become
    # ready in backward and close once >= the cap, i.e. at every weight matrix:
    #   head.w 262144 el                                  -> 524288 B
    #   ln.w, ln.b, fc2.b + fc2.w: 768 + 262144 = 262912   -> 525824 B   (blocks 1 and 0)
    #   fc1.b + fc1.w: 1024 + 262144 = 263168               -> 526336 B   (blocks 1 and 0)
    #   ln2, proj (66304 < cap, stays open), qkv 197376: 263680 -> 527360 B (blocks 1 and 0)
    #   block 0's ln1 (512, after its fc2 bucket: 512 + 256 + 262144 also 262912) ... emb.w + ln1 of block 0
    #   : 262144 + 512 = 262656 -> 525312 B
    sizes = sorted(c["size_bytes"] for c in ddp.comms())
    assert sizes == sorted([524288, 525824, 525824, 526336, 526336, 527360, 527360, 525312])
    # every gradient is reduced exactly once: 2 B x (2 blocks + emb + head + final LN)
    assert sum(sizes) == 2 * (2 * BLOCK + 2 * 262144 + 512) == 4208640
    assert {op for op, _, n in _comm_list(ddp)} == {"allreduce"}
    assert {n for _, _, n in _comm_list(ddp)} == {64}
    # asynchronous, all waited at the end of backward, before the optimizer's foreach kernels
    waits = {c["wait"] for c in ddp.comms()}
    assert all(not c["blocking"] for c in ddp.comms()) and len(waits) == 1
    wait = waits.pop()
    assert all(not o["name"].startswith("aten._foreach") for o in ddp.ops[:wait])
    assert any(o["name"].startswith("aten._foreach") for o in ddp.ops[wait:])


def test_gemm_flops_match_formula(ddp, tp_dp):
    # forward GEMMs: per block 2 T (3h^2 + h^2 + 4h^2 + 4h^2) = 24 T h^2, head 2 T h V; backward 2x
    fwd = 24 * T * H**2 * L + 2 * T * H * V
    gemm = [o for o in ddp.compute() if o["kind"] == "gemm"]
    assert all(o["flops"] == 2 * o["batch"] * o["m"] * o["n"] * o["k"] for o in gemm)
    assert sum(o["flops"] for o in gemm) == 3 * fwd
    # TP 8: block GEMMs split 8 ways, the head is replicated
    gemm_tp = [o for o in tp_dp.compute() if o["kind"] == "gemm"]
    assert sum(o["flops"] for o in gemm_tp) == 3 * (24 * T * H**2 * L // 8 + 2 * T * H * V)


def test_attention_rows(ddp):
    fwd = [o for o in ddp.compute() if o["kind"] == "attn_fwd"]
    bwd = [o for o in ddp.compute() if o["kind"] == "attn_bwd"]
    assert len(fwd) == len(bwd) == L
    o = fwd[0]
    assert (o["batch"], o["heads"], o["seq_q"], o["seq_k"], o["head_dim"], o["causal"]) == (2, 4, 128, 128, 64, True)
    assert o["flops"] == 4 * 2 * 4 * 128 * 128 * 64 / 2  # causal halves flash-attention's 4 b h s^2 d


def test_fsdp2_gathers_and_reduce_scatters(fsdp):
    # every dim-0 is divisible by 64, so no padding: a block's gather is its 789760 bf16 params = 1579520 B;
    # the root (emb + head + final LN = 524800 el) 1049600 B. Blocks gather in forward and again in
    # backward; the root keeps its weights after forward (reshard_after_forward=False at the root).
    c = _comm_list(fsdp)
    assert sorted(c) == sorted([("allgather", 1049600, 64)] + [("allgather", 2 * BLOCK, 64)] * 4
                               + [("reducescatter", 2 * BLOCK, 64)] * 2 + [("reducescatter", 1049600, 64)])
    # side streams: each gather is waited by its copy-out kernel and may start where the previous gather was
    # copied out (one-layer prefetch); each reduce-scatter is waited where the next one is issued
    rows = [(i, o) for i, o in enumerate(fsdp.ops) if o["type"] == "comm"]
    gathers = [(i, o) for i, o in rows if o["op"] == "allgather"]
    assert all(not o["blocking"] for _, o in rows)
    assert all(fsdp.ops[o["wait"]]["name"] == "fsdp.split_with_sizes_copy.default" for _, o in gathers)
    assert "issue" not in gathers[0][1]
    assert [o["issue"] for _, o in gathers[1:]] == [o["wait"] for _, o in gathers[:-1]]
    scatters = [(i, o) for i, o in rows if o["op"] == "reducescatter"]
    assert [o["wait"] for _, o in scatters] == [i for i, _ in scatters[1:]] + [None]


def test_tp_dp_collectives(tp_dp):
    c = _comm_list(tp_dp)
    # TP: all-reduce of the [b, s, h] bf16 activation, 2 * 128 * 256 * 2 B = 131072 B: forward after proj and
    # fc2 (row-parallel), backward before qkv and fc1 (column-parallel input gradient); 4 per block
    assert c.count(("allreduce", 131072, 8)) == 4 * L
    tp_groups = {tuple(tp_dp.groups[x["group"]]) for x in tp_dp.comms() if x["op"] == "allreduce"}
    assert tp_groups == {tuple(range(8))}
    assert all(not x["blocking"] and x["wait"] is not None for x in tp_dp.comms() if x["op"] == "allreduce")
    # FSDP over dp = 64 ranks (stride 8) gathers a block's TP shard. Local shapes: qkv.w [96, 256] and
    # qkv.b [96] pad dim 0 to 128 (2 rows per rank): 32768 + 128; proj.w [256, 32] 8192, proj.b 256;
    # fc1 [128, 256] + 128 = 32896; fc2 [256, 128] + 256 = 33024; LNs 1024: 108288 el = 216576 B.
    assert 32768 + 128 + 8192 + 256 + 32896 + 33024 + 1024 == 108288
    assert c.count(("allgather", 216576, 64)) == 2 * L
    assert c.count(("reducescatter", 216576, 64)) == L
    dp_groups = {tuple(tp_dp.groups[x["group"]]) for x in tp_dp.comms() if x["op"] == "allgather"}
    assert dp_groups == {tuple(range(0, 512, 8))}


def test_save_load_roundtrip_and_validation(ddp, tmp_path):
    path = tmp_path / "w.json"
    save(ddp, path)
    back = load(path)
    assert back.ops == ddp.ops and back.groups == ddp.groups and back.world_size == 64 and back.rank == 0
    good = path.read_text()
    doc = json.loads(good)
    assert (doc["format"], doc["version"]) == ("flowsim-workload", 2)
    assert [st["rank"] for st in doc["stages"]] == [0]
    for mutate, field in ((lambda d: d.pop("world_size"), "workload.world_size"),
                          (lambda d: d.update(version=3), "workload.version"),
                          (lambda d: d["stages"][0]["ops"][0].pop("kind"), "stages[0].ops[0].kind"),
                          (lambda d: d["stages"][0]["ops"][0].update(bytes=-1), "stages[0].ops[0].bytes"),
                          (lambda d: d["stages"][0].update(rank=64), "stages[0].rank"),
                          (lambda d: d["stages"].append(dict(d["stages"][0])), "stages[1].rank"),
                          (lambda d: d["groups"].update(g0=[0, 64]), "workload.groups.g0"),
                          (lambda d: _first_comm(d).update(issue=10**6), "issue"),
                          (lambda d: _first_comm(d).update(peer=3), "peer")):
        bad = json.loads(good)
        mutate(bad)
        path.write_text(json.dumps(bad))
        with pytest.raises(ConfigError) as e:
            load(path)
        assert e.value.field.endswith(field)


def test_version_1_files_still_load(ddp, tmp_path):
    """Version 1 kept one rank's ``rank`` and ``ops`` at the top level; it reads as one stage."""
    path = tmp_path / "w.json"
    save(ddp, path)
    doc = json.loads(path.read_text())
    stage = doc.pop("stages")[0]
    path.write_text(json.dumps(dict(doc, version=1, rank=stage["rank"], ops=stage["ops"])))
    back = load(path)
    assert len(back.stages) == 1 and back.ops == ddp.ops and back.rank == 0
    doc = json.loads(path.read_text())
    doc["ops"][0].pop("kind")
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"^ops\[0\]\.kind: is required"):
        load(path)


def _first_comm(doc):
    return next(o for o in doc["stages"][0]["ops"] if o["type"] == "comm")


def test_simulate_ddp_on_dgx_h100(ddp):
    r = simulate_workload(ddp, "dgx-h100")
    assert r.compute_s > 0 and r.step_time_s >= r.compute_s
    assert r.collectives["n_ranks"].tolist() == [64] * len(r.collectives)
    assert r.collectives["count_per_step"].sum() == 8
    # the bucket all-reduces are hidden behind backward up to its end: exposure < their sum
    assert r.exposed_comm_s < r.comm_s["allreduce"]


def test_timeline_rules():
    comm = [{"type": "comm", "blocking": True, "wait": None}]

    class Est:
        n_ctas = 33

    # blocking: compute 10 us, comm 4 us, compute 10 us -> 24 us
    ops = [{"type": "compute"}] + comm + [{"type": "compute"}]
    assert _timeline(ops, [10e-6, 4e-6, 10e-6], [None, Est(), None], 132) == pytest.approx(24e-6)
    # asynchronous, waited at the end: runs beside the last compute, which it slows by 33/132 of the SMs;
    # equal to overlapped_s(10 us, 4 us, 33, 132) after the first 10 us
    ops[1] = {"type": "comm", "blocking": False, "wait": None}
    got = _timeline(ops, [10e-6, 4e-6, 10e-6], [None, Est(), None], 132)
    assert got == pytest.approx(10e-6 + overlapped_s(10e-6, 4e-6, 33, 132))
    assert _slowed(0.0, 10e-6, 4e-6, 0.25) == pytest.approx(overlapped_s(10e-6, 4e-6, 33, 132))
    # prefetched: issued at op 0, the 4 us collective runs beside the first compute, waited before op 2;
    # the first compute is not slowed (it was timed before the collective was reached), so 10 + 10 us
    ops[1] = {"type": "comm", "blocking": False, "wait": 2, "issue": 0}
    assert _timeline(ops, [10e-6, 4e-6, 10e-6], [None, Est(), None], 132) == pytest.approx(20e-6)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("parallel, zero_stage", [("ddp", 0), ("fsdp", 3)])
def test_captured_kernels_agree_with_parametric_model(parallel, zero_stage):
    """A captured eager GPT and flowsim.simulate's eager model of the same job (the two paths check each
    other): GEMMs and attention equal, the whole step within 5 %."""
    import flowsim

    Lm, Hm, A, Vm, S, B = 4, 2048, 16, 32000, 2048, 8
    setup, step = gpt_example(parallel, 64, shape=GPTShape(layers=Lm, hidden=Hm, heads=A, vocab=Vm, seq=S,
                                                            micro_batch=B))
    w = capture(step, setup=setup, world_size=64)
    r = simulate_workload(w, "dgx-h100")
    model = dict(name="gpt-example", num_layers=Lm, hidden_size=Hm, num_attention_heads=A, ffn_hidden_size=4 * Hm,
                 vocab_size=Vm, seq_length=S, activation="gelu", normalization="layernorm",
                 position_embedding="none", untie_embeddings_and_output_weights=True, add_bias_linear=True)
    res = flowsim.simulate({"model": model, "cluster": "dgx-h100"}, num_gpus=64, tp=1, pp=1, dp=64, mbs=B,
                           gbs=64 * B, seq=S, kernel_fusion="eager", zero_stage=zero_stage)
    tl = res.timeline
    per = tl.op_time_s * tl.ops["count"].to_numpy()
    kinds = tl.ops["kind"].to_numpy()

    def model_sum(kind_set):
        tot = 0.0
        for block, n in (("layer", Lm), ("embedding", 1), ("head", 1)):
            sl = tl.spans[block]
            tot += n * float(per[sl][np.isin(kinds[sl], kind_set)].sum())
        return tot

    comp = [o for o in w.ops if o["type"] == "compute"]
    t_comp = r.op_time_s[0][[o["type"] == "compute" for o in w.ops]]
    cap = {k: float(sum(t for o, t in zip(comp, t_comp) if o["kind"] in k)) for k in (("gemm",), ("attn_fwd", "attn_bwd"))}
    assert cap[("gemm",)] == pytest.approx(model_sum(["gemm"]), rel=0.01)
    assert cap[("attn_fwd", "attn_bwd")] == pytest.approx(model_sum(["attn_fwd", "attn_bwd"]), rel=0.01)
    # whole step (docs/CAPTURE.md): DDP 61.4 ms captured vs 61.6 ms parametric (-0.3 %), FSDP2 59.4 vs
    # 57.3 ms (+3.6 %). What remains: a contiguous copy of the attention output that the CPU attention
    # kernel's layout forces (+0.65 ms; CUDA's flash kernel writes it in the layout the next GEMM reads),
    # bf16 AdamW without fp32 master weights and a bf16 gradient reduction (the parametric model assumes
    # Megatron-LM's fp32 master weights and fp32 gradient reduction), FSDP2's copy-in before all-gathers.
    assert r.step_time_s == pytest.approx(res.step_time_s, rel=0.05)


def test_coalesced_and_object_collectives():
    """torch.distributed._coalescing_manager (Megatron-core's DDP buckets) issues coalesced c10d ops, which torch
    registers without a Meta kernel: they get one during a capture, and lose it after. Object collectives
    (all_gather_object in Megatron's optimizer set-up) see this rank's objects on every rank."""
    dist = torch.distributed

    def step():
        xs, outs = [torch.ones(4, 8), torch.ones(16)], [torch.empty(16, 8), torch.empty(64)]
        for collective in (lambda o, x: dist.all_reduce(x, async_op=True),
                           lambda o, x: dist.all_gather_into_tensor(o, x, async_op=True),
                           lambda o, x: dist.reduce_scatter_tensor(x, o, async_op=True)):
            with dist._coalescing_manager(async_ops=True) as cm:
                for o, x in zip(outs, xs):
                    collective(o, x)
            cm.wait()
        gathered, objects = [None] * 4, ["mine"]
        dist.all_gather_object(gathered, {"rank": dist.get_rank()})
        dist.broadcast_object_list(objects, src=0)
        assert gathered == [{"rank": 2}] * 4 and objects == ["mine"]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's deprecation
        w = capture(step, world_size=4, rank=2, warmup_steps=0)
    # fp32: all-reduce the two tensors (32 + 16 elements), gather into / scatter from the two outputs (128 + 64)
    assert [(c["name"], c["op"], c["size_bytes"]) for c in w.comms()] == [
        ("c10d.allreduce_coalesced_.default", "allreduce", 4 * (32 + 16)),
        ("c10d.allgather_into_tensor_coalesced_.default", "allgather", 4 * (128 + 64)),
        ("c10d.reduce_scatter_tensor_coalesced_.default", "reducescatter", 4 * (128 + 64))]
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_coalesced_", "Meta")


def test_step_that_raises():
    def step():
        raise RuntimeError("boom")

    with pytest.raises(ConfigError, match="step: raised RuntimeError: boom"):
        capture(step, world_size=8, warmup_steps=0)


def test_world_size_the_layout_cannot_use():
    with pytest.raises(ConfigError, match="world_size"):
        gpt_example("tp-dp", 100, tp=8, shape=GPTShape(heads=8))
    with pytest.raises(ConfigError, match="world_size"):
        capture(lambda: None, world_size=0)
    with pytest.raises(ConfigError, match="rank"):
        capture(lambda: None, world_size=4, rank=4)

    def mesh_step():
        from torch.distributed.device_mesh import init_device_mesh

        init_device_mesh("cpu", (16, 8))  # 128 ranks on a 64-rank job

    with pytest.raises(ConfigError, match="step: raised"):
        capture(mesh_step, world_size=64, warmup_steps=0)


def test_unknown_op_warns_and_is_a_memory_row():
    def step():
        x = torch.randn(1, 4, 32)
        w = torch.randn(8, 4, 3)
        torch.nn.functional.conv1d(x, w)

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        w = capture(step, world_size=8, warmup_steps=0)
    assert w.unknown_ops == ["aten.convolution.default"]
    assert any(issubclass(r.category, FlowsimWarning) and "aten.convolution.default" in str(r.message) for r in rec)
    row = next(o for o in w.ops if o["name"] == "aten.convolution.default")
    # x 1*4*32 + w 8*4*3 + out 1*8*30 fp32 elements, 4 B each: (128 + 96 + 240) * 4 = 1856
    assert (row["kind"], row["bytes"]) == ("memory", 1856)


def test_non_progression_group_is_explained(ddp):
    import copy

    w = copy.deepcopy(ddp)
    w.groups["g0"] = [0, 1, 3] + list(range(4, 65))[:61]
    with pytest.raises(ConfigError, match="arithmetic progression"):
        simulate_workload(w, "dgx-h100")


def test_cli_capture_then_estimate(tmp_path):
    from click.testing import CliRunner

    from flowsim.cli import main

    out = tmp_path / "w.json"
    r = CliRunner().invoke(main, ["capture", "--example", "gpt-ddp", "--world-size", "64", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "1 collectives (4.01 MiB)" in r.output  # one 25 MiB bucket holds all 4208640 B
    r = CliRunner().invoke(main, ["estimate", "--workload", str(out), "--cluster", "dgx-h100", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["collectives"][0]["size_bytes"] == 4208640
    out.write_text("{}")
    r = CliRunner().invoke(main, ["estimate", "--workload", str(out), "--cluster", "dgx-h100"])
    assert r.exit_code == 2 and "workload.format: is required" in r.output


def test_without_torch_capture_is_a_config_error(monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ConfigError, match="torch: is needed to capture"):
        capture(lambda: None, world_size=8)


def test_estimate_workload_rejects_model_flags(tmp_path):
    from click.testing import CliRunner

    from flowsim.cli import main

    path = tmp_path / "w.json"
    path.write_text("{}")
    res = CliRunner().invoke(main, ["estimate", "--workload", str(path), "--cluster", "dgx-h100", "--tp", "8"])
    assert res.exit_code == 2
    assert res.output.strip() == ("Error: --workload: takes only --cluster, --gpu and --json (the model and layout "
                                  "come from the captured file) (got tp)")
