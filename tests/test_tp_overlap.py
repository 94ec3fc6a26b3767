"""Tensor-parallel communication overlap (``tp_comm_overlap``): each sequence-parallel collective pipelined with the
GEMM it feeds or drains (flowsim.step.blocks.tp_overlapped_s)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowsim
from flowsim.config import build_config
from flowsim.model.workload import build_workload
from flowsim.step.blocks import TP_OVERLAP_SMS, tp_overlapped_s
from flowsim.step.overlap import overlapped_s

SM = 132  # H100 SXM


def test_pipelined_overlap_closed_forms():
    # 8 ms GEMM in 8 pieces beside 2 ms of transfers: the first 1 ms piece runs alone, the other 7 ms beside the
    # transfers on 16 of 132 SMs, losing 2 ms x 16/132
    assert tp_overlapped_s(8e-3, 2e-3, 8, SM) == pytest.approx(1e-3 + 7e-3 + 2e-3 * TP_OVERLAP_SMS / SM)
    # transfers longer than the rest of the GEMM: exposed by the difference, after the first piece
    assert tp_overlapped_s(1e-3, 4e-3, 8, SM) == pytest.approx(1e-3 / 8 + 4e-3)
    # one piece: the GEMM and the transfers one after the other (nothing to pipeline with)
    assert tp_overlapped_s(5e-3, 3e-3, 1, SM) == pytest.approx(8e-3)
    # no transfer: the GEMM alone
    assert tp_overlapped_s(5e-3, 0.0, 8, SM) == pytest.approx(5e-3)


@settings(max_examples=200, deadline=None)
@given(gemm=st.floats(0.0, 1.0), comm=st.floats(0.0, 1.0), chunks=st.integers(2, 64))
def test_pipelined_overlap_is_bounded(gemm, comm, chunks):
    # never faster than either part alone, never slower than the two one after the other
    wall = tp_overlapped_s(gemm, comm, chunks, SM)
    assert max(gemm, comm) <= wall + 1e-12
    assert wall <= gemm + comm + 1e-12
    # more pieces hide more (the unhidden first piece shrinks), down to the SM-sharing rule's bulk overlap
    assert tp_overlapped_s(gemm, comm, chunks + 1, SM) <= wall + 1e-12
    assert wall >= overlapped_s(gemm, comm, TP_OVERLAP_SMS, SM) - 1e-12


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
    assert overlapped.compute_s == pytest.approx(vanilla.compute_s)
