"""PyTorch context parallelism (``cp_comm_type: torch``, torchtitan): the ring attention's fp32 merge and gradient
accumulation kernels and its collectives, as torch's ``_context_parallel/_attention.py`` runs them."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.fusion import torch_cp_bytes
from flowsim.model.workload import build_workload

BASE = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, cp=8, gbs=1, seq=65536, recompute="full")


def _layer(**kw):
    return build_workload(build_config(**{**BASE, **kw})).layer


def test_merge_and_accumulation_bytes_follow_the_ring_code():
    # busiest rank, per element of the output / query (q) and of each of K and V (kv):
    # forward 12 + 38 (cp - 1) and 4 cp; backward 10 + 10 cp and 7 + 25 cp
    for cp in (2, 4, 8):
        assert torch_cp_bytes(cp, 1.0, 0.0) == (12 + 38 * (cp - 1), 10 + 10 * cp)
        assert torch_cp_bytes(cp, 0.0, 1.0) == (2 * 4 * cp, 2 * (7 + 25 * cp))
    layer = _layer(cp_comm_type="torch")
    rows = layer.compute[layer.compute["name"].str.startswith("cp_merge")]
    s_local, heads, groups, d = 65536 // 8, 32, 8, 128
    merge = torch_cp_bytes(8, s_local * heads * d, s_local * groups * d)
    # forward, its rerun under full recompute, backward
    assert sorted(zip(rows["phase"], rows["bytes"])) == sorted(
        [("fwd", pytest.approx(merge.fwd)), ("recompute", pytest.approx(merge.fwd)), ("bwd", pytest.approx(merge.bwd))])


def test_collectives_gather_kv_and_pass_fp32_gradients_around_the_ring():
    layer = _layer(cp_comm_type="torch")
    kv = 2 * (65536 // 8) * 8 * 128 * 2  # this rank's K and V, bf16
    cp = [(c.op, c.phase, c.size_bytes, c.count, c.overlap) for c in layer.comms if c.group == "cp"]
    assert sorted(cp) == sorted([("allgather", "fwd", 8 * kv, 1, "attention"),
                                 ("allgather", "bwd", 8 * kv, 1, "attention"),
                                 ("allgather", "recompute", 8 * kv, 1, "attention"),
                                 ("sendrecv", "bwd", 2 * kv, 8, "attention")])
    # Transformer Engine's ring keeps no merge rows of its own here, and without CP there is nothing to merge
    assert not _layer(cp_comm_type="p2p").compute["name"].str.startswith("cp_merge").any()
    assert not build_workload(build_config(**{**BASE, "cp": 1, "gpus": 1, "cp_comm_type": "torch"})
                              ).layer.compute["name"].str.startswith("cp_merge").any()


def test_torchtitan_profile_runs_torch_cp_and_it_costs_time():
    assert build_config(**BASE, framework="torchtitan").training.cp_comm_type == "torch"
    assert build_config(**BASE, framework="torchtitan", cp_comm_type="p2p").training.cp_comm_type == "p2p"
    assert build_config(**BASE, framework="llm-foundry").training.cp_comm_type == "p2p"
    torch_cp = flowsim.simulate(BASE, cp_comm_type="torch")
    te = flowsim.simulate(BASE, cp_comm_type="p2p")
    assert torch_cp.step_time_s > te.step_time_s
    with pytest.raises(ConfigError) as e:
        build_config(**BASE, cp_comm_type="ring")
    assert str(e.value) == "cp_comm_type: must be one of p2p, all_gather, torch (got ring)"
