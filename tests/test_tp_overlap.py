"""Tensor-parallel communication overlap (``tp_comm_overlap``): each sequence-parallel collective pipelined with the
GEMM it feeds or drains (flowsim.step.blocks.tp_overlapped_s)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowsim
from flowsim.config import build_config
from flowsim.model.workload import build_workload
from flowsim.model.ops import TP_PIPELINE_SPLITS, tp_overlap_method, tp_overlap_pieces
from flowsim.step.blocks import tp_overlapped_s
from flowsim.step.overlap import overlapped_s

SM = 132  # H100 SXM


def test_pipelined_overlap_closed_forms():
    # 8 ms GEMM in 8 pieces beside 2 ms of transfers on 16 SMs: the first 1 ms piece runs alone, the other 7 ms
    # beside the transfers on 16 of 132 SMs, losing 2 ms x 16/132
    assert tp_overlapped_s(8e-3, 2e-3, 8, 16, SM) == pytest.approx(1e-3 + 7e-3 + 2e-3 * 16 / SM)
    # transfers longer than the rest of the GEMM: exposed by the difference, after the first piece
    assert tp_overlapped_s(1e-3, 4e-3, 8, 1, SM) == pytest.approx(1e-3 / 8 + 4e-3)
    # one piece: a bulk overlap, the SM-sharing rule itself
    assert tp_overlapped_s(5e-3, 3e-3, 1, 16, SM) == pytest.approx(overlapped_s(5e-3, 3e-3, 16, SM))
    # no transfer: the GEMM alone
    assert tp_overlapped_s(5e-3, 0.0, 8, 16, SM) == pytest.approx(5e-3)


def test_transformer_engine_overlap_methods():
    # initialize_ub's defaults: gathers as a ring exchange in tp pieces, forward reduce-scatters as a pipeline of 4,
    # the input gradients' reduce-scatters in bulk beside the weight-gradient GEMM
    assert tp_overlap_method("allgather", ["qkv"]) == "ring_exchange"
    assert tp_overlap_method("reducescatter", ["attn_out"]) == "pipeline"
    assert tp_overlap_method("reducescatter", ["fc1.wgrad"]) == "bulk"
    assert [tp_overlap_pieces(m, 8) for m in ("ring_exchange", "pipeline", "bulk")] == [8, TP_PIPELINE_SPLITS, 1]


@settings(max_examples=200, deadline=None)
@given(gemm=st.floats(0.0, 1.0), comm=st.floats(0.0, 1.0), pieces=st.integers(2, 64), sms=st.integers(0, 32))
def test_pipelined_overlap_is_bounded(gemm, comm, pieces, sms):
    # never faster than either part alone, never slower than the two one after the other
    wall = tp_overlapped_s(gemm, comm, pieces, sms, SM)
    assert max(gemm, comm) <= wall + 1e-12
    assert wall <= gemm + comm + 1e-12
    # more pieces hide more (the unhidden first piece shrinks), down to the bulk overlap
    assert tp_overlapped_s(gemm, comm, pieces + 1, sms, SM) <= wall + 1e-12
    assert wall >= tp_overlapped_s(gemm, comm, 1, sms, SM) - 1e-12


def test_pipelined_gemms_run_in_pieces():
    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, sp=True, gbs=1, tp_comm_overlap=True)
    ops = build_workload(cfg).layer.compute
    tokens = cfg.microbatch_tokens

    def rows(name, phase):
        return ops[(ops["name"] == name) & (ops["phase"] == phase)]

    # gathered GEMMs in 8 pieces, the forward reduce-scatter's in 4, the bulk-overlapped weight gradients whole
    for name, phase, pieces in (("qkv", "fwd", 8), ("fc1", "fwd", 8), ("attn_out.dgrad", "bwd", 8),
                                ("attn_out", "fwd", 4), ("fc2", "fwd", 4), ("qkv.wgrad", "bwd", 1)):
        r = rows(name, phase)
        assert (len(r), int(r["count"].iloc[0])) == (1, pieces), name
        whole_m = tokens if name != "qkv.wgrad" else 4096
        assert int(r["m"].iloc[0]) == whole_m // pieces, name
    # the same FLOPs in all
    plain = build_workload(build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, sp=True, gbs=1)).layer
    flops = (ops["flops"] * ops["count"]).sum()
    assert flops == pytest.approx((plain.compute["flops"] * plain.compute["count"]).sum())


@pytest.mark.parametrize("model", [dict(model="llama3-8b"),
                                   dict(model="llama3-8b", recompute_granularity="full"),
                                   dict(num_layers=4, hidden_size=1024, num_attention_heads=8, seq_length=1024,
                                        vocab_size=32000, multi_latent_attention=True, q_lora_rank=256,
                                        kv_lora_rank=128, qk_head_dim=64, qk_pos_emb_head_dim=32, v_head_dim=64)])
def test_every_pipelined_collective_names_a_gemm_of_its_phase(model):
    cfg = build_config(**model, cluster="dgx-h100", gpus=8, tp=8, sp=True, gbs=1)
    layer = build_workload(cfg).layer
    paired = [c for c in layer.comms if c.overlap.startswith("gemm")]
    assert len(paired) == 2 * len([c for c in layer.comms if c.op == "reducescatter"])  # every AG/RS pair
    ops = layer.compute
    for c in paired:
        names = c.overlap.split(":", 1)[1].split("+")
        here = set(ops.loc[(ops["phase"] == c.phase) & (ops["kind"] == "gemm"), "name"])
        assert set(names) <= here, (c, names)


def test_async_tp_hides_part_of_the_tp_communication():
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, sp=True, gbs=8, mbs=8)
    vanilla = flowsim.simulate(base).stages[0]
    overlapped = flowsim.simulate(base, tp_comm_overlap=True).stages[0]
    # an 8B layer's attention projections are shorter than their all-gather / reduce-scatter on 8 GPUs: part of
    # the communication stays exposed, unlike an overlap of all of it behind all the layer's GEMMs
    assert 0.0 < overlapped.tp_comm_s < 0.8 * vanilla.tp_comm_s
    # the GEMMs run in pieces: a little slower, never faster
    assert vanilla.compute_s < overlapped.compute_s < 1.05 * vanilla.compute_s
