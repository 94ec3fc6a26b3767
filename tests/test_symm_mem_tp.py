"""PyTorch's async TP (``tp_overlap_impl: symm_mem``, torchtitan): the fused symmetric-memory ops' staging copies and
reduction kernels, their pieces and the collectives Inductor's micro-pipeline pass does not fuse
(flowsim.model.ops.symm_mem_tp)."""
import numpy as np
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.ops import TP_OVERLAP_SMS, tp_overlap_pieces, tp_pairing
from flowsim.model.workload import build_workload
from flowsim.step.blocks import block_times
from flowsim.units import DTYPE_BYTES

BASE = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, sp=True, gbs=2, mbs=2, tp_comm_overlap=True)


def _layer(**kw):
    cfg = build_config(**{**BASE, **kw})
    return cfg, build_workload(cfg).layer


def _rows(layer, name, phase):
    ops = layer.compute
    return ops[(ops["name"] == name) & (ops["phase"] == phase)]


def test_fused_ops_kernels_known_bytes():
    cfg, layer = _layer(tp_overlap_impl="symm_mem")
    tokens, h, tp = cfg.microbatch_tokens, cfg.model.hidden_size, 8
    act = tokens * h * DTYPE_BYTES["bf16"]  # the gathered [tokens, h] activation, bytes
    # matmul + reduce-scatter: torch.sum over the tp partials reads [tokens, h] and writes this rank's 1/tp of it
    for name in ("attn_out", "fc2"):
        row = _rows(layer, f"{name}.symm_mem_reduce", "fwd")
        assert len(row) == 1 and row["bytes"].iloc[0] == pytest.approx(act * (1 + 1 / tp))
        assert row["kind"].iloc[0] == "memory"
    # all-gather + matmul: the local shard copied into the symmetric buffer (read + write tokens/tp x h)
    for name, phase in (("qkv", "fwd"), ("fc1", "fwd"), ("attn_out.dgrad", "bwd"), ("fc2.dgrad", "bwd")):
        row = _rows(layer, f"{name}.symm_mem_stage", phase)
        assert len(row) == 1 and row["bytes"].iloc[0] == pytest.approx(2 * act / tp)
    # the column-parallel input gradients' reduce-scatters are not fused (several projections' gradients summed)
    assert not layer.compute["name"].str.endswith("wgrad.symm_mem_reduce").any()
    rs_bwd = [c for c in layer.comms if c.op == "reducescatter" and c.phase == "bwd"]
    assert rs_bwd and all(c.overlap == "none" for c in rs_bwd)
    fused = {c.overlap for c in layer.comms if c.overlap.startswith("symm_mem:")}
    assert fused == {"symm_mem:qkv", "symm_mem:attn_out", "symm_mem:fc1", "symm_mem:fc2",
                     "symm_mem:attn_out.dgrad", "symm_mem:fc2.dgrad"}


def test_pieces_one_per_peer_and_no_sms():
    # both kinds split in tp pieces (the reduce-scatter too, where Transformer Engine pipelines 4), copies on the
    # copy engines
    assert tp_overlap_pieces("symm_mem", 8) == 8 and TP_OVERLAP_SMS["symm_mem"] == 0
    assert tp_pairing("reducescatter", "symm_mem:attn_out") == ("symm_mem", ["attn_out"])
    assert tp_pairing("reducescatter", "gemm:attn_out") == ("pipeline", ["attn_out"])
    assert tp_pairing("allgather", "dgrad") is None and tp_pairing("allgather", "none") is None
    cfg, layer = _layer(tp_overlap_impl="symm_mem")
    _, te = _layer()
    tokens = cfg.microbatch_tokens
    for name, phase in (("attn_out", "fwd"), ("fc2", "fwd"), ("qkv", "fwd"), ("attn_out.dgrad", "bwd")):
        rows = _rows(layer, name, phase)
        assert rows["count"].sum() == 8 and (rows["m"] == tokens // 8).all()
    assert _rows(te, "attn_out", "fwd")["count"].sum() == 4
    # Transformer Engine's blocks are unchanged: no async-TP kernels, the input gradients' reduce-scatters in bulk
    assert not te.compute["name"].str.contains("symm_mem").any()
    assert all(c.overlap.startswith("gemm:") for c in te.comms if c.op == "reducescatter")


def test_only_with_tp_comm_overlap_and_sequence_parallelism():
    for kw in (dict(tp_comm_overlap=False), dict(sp=False)):
        _, layer = _layer(tp_overlap_impl="symm_mem", **kw)
        assert not layer.compute["name"].str.contains("symm_mem").any()
        assert not any(c.overlap.startswith("symm_mem") for c in layer.comms)


def test_async_tp_step_pays_its_kernels():
    # the fused ops' kernels add compute; the forward collectives still hide behind their GEMMs
    sym = flowsim.simulate({**BASE, "tp_overlap_impl": "symm_mem"}).to_dict()
    vanilla = flowsim.simulate({**BASE, "tp_comm_overlap": False}).to_dict()
    assert sym["step_time_s"] < vanilla["step_time_s"]
    assert sym["breakdown"]["compute_s"] > vanilla["breakdown"]["compute_s"]
    assert sym["breakdown"]["tp_comm_s"] < vanilla["breakdown"]["tp_comm_s"]


def test_profile_and_bad_value():
    assert build_config(**BASE, framework="torchtitan").training.tp_overlap_impl == "symm_mem"
    assert build_config(**BASE, framework="torchtitan", tp_overlap_impl="userbuffers").training.tp_overlap_impl \
        == "userbuffers"
    assert build_config(**BASE, framework="megatron-core").training.tp_overlap_impl == "userbuffers"
    with pytest.raises(ConfigError) as e:
        build_config(**BASE, tp_overlap_impl="nccl")
    assert str(e.value) == "tp_overlap_impl: must be one of userbuffers, symm_mem (got nccl)"


class _Pricer:
    """Every collective at 100 GB/s, one CTA (the block pricer's interface: gpu.sm_count, groups, time, ctas)."""

    class gpu:  # noqa: N801 - an attribute namespace
        sm_count = 132

    groups = {"tp": (8, 1, 0)}

    @staticmethod
    def time(group, op, size_bytes, calls):
        return size_bytes / 100e9

    @staticmethod
    def ctas(group, op, size_bytes):
        return 1


def test_forward_tp_time_known_answer():
    # every op 0.1 ms: each fused GEMM is 8 pieces (0.8 ms); its collective (1.34 ms) runs beside the 7 pieces after
    # the first on the copy engines (no SM lost): exposed g/8 + max(7g/8, c) - g per collective, 4 per forward
    cfg, layer = _layer(tp_overlap_impl="symm_mem")
    t_ops = np.full(len(layer.columns["name"]), 1e-4)
    out = block_times(layer, t_ops, _Pricer, True, 1)
    c = cfg.microbatch_tokens * cfg.model.hidden_size * DTYPE_BYTES["bf16"] / 100e9
    g = 8 * 1e-4
    assert out["tp_fwd"] == pytest.approx(4 * (g / 8 + max(7 * g / 8, c) - g))
    # backward: the two unfused reduce-scatters are exposed whole, beside the gathers' exposure
    rs = [x for x in layer.comms if x.op == "reducescatter" and x.phase == "bwd"]
    assert out["tp_bwd"] >= sum(x.size_bytes / 100e9 for x in rs)
    # the fused ops' kernels are compute of their phase: 2 reductions and 2 staging copies in forward
    names = layer.columns["name"]
    extra = [n for n, ph in zip(names, layer.columns["phase"]) if "symm_mem" in n and ph == "fwd"]
    assert sorted(extra) == ["attn_out.symm_mem_reduce", "fc1.symm_mem_stage", "fc2.symm_mem_reduce",
                             "qkv.symm_mem_stage"]
