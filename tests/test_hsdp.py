"""Hybrid sharding (data_parallel_shard_size): shard groups, replica all-reduce, memory, config rules."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.step.flows import stage_groups
from flowsim.units import DTYPE_BYTES

GRAD_REDUCE_BYTES = DTYPE_BYTES["fp32"]  # the default grad_reduce_dtype

BASE = dict(model="llama3-70b", cluster="dgx-h100", gpus=256, tp=1, gbs=256, mbs=1, zero_stage=3, recompute="full")


def _coll(result, group, op):
    return next(c for c in result.collectives if c.group == group and c.op == op)


def test_shard_groups_partition_the_data_parallel_group():
    cfg = build_config(**dict(BASE, gpus=64, tp=2, dp_shard=8))  # dp = 32
    dps, dpr = stage_groups(cfg, "dps"), stage_groups(cfg, "dpr")
    assert len(dps) == 2 * 4 and all(len(g) == 8 for g in dps)
    assert len(dpr) == 2 * 8 and all(len(g) == 4 for g in dpr)
    assert dps[0] == [0, 2, 4, 6, 8, 10, 12, 14]         # consecutive DP ranks of TP rank 0
    assert dpr[0] == [0, 16, 32, 48]                      # the same shard position in every replica
    for groups in (dps, dpr):
        assert sorted(r for g in groups for r in g) == list(range(64))


def test_fsdp_collectives_and_memory_with_hybrid_sharding():
    full = flowsim.simulate(BASE)
    hsdp = flowsim.simulate(dict(BASE, dp_shard=8))
    ag, rs = _coll(hsdp, "dps", "allgather"), _coll(hsdp, "dps", "reducescatter")
    ar = _coll(hsdp, "dpr", "allreduce")
    assert (ag.n_ranks, rs.n_ranks, ar.n_ranks) == (8, 8, 32)
    assert ag.size_bytes == _coll(full, "dp", "allgather").size_bytes  # plain FSDP reports group dp
    assert ar.size_bytes == pytest.approx(rs.size_bytes / 8)  # the reduced shard
    assert not any(c.group == "dpr" for c in full.collectives)
    # sharded gradients and optimizer state are 256 / 8 = 32 times larger per GPU (the weights also hold
    # two gathered layers, which do not shrink with the shard group)
    for key in ("gradients", "optimizer"):
        assert hsdp.memory_detail[key] == pytest.approx(32 * full.memory_detail[key])
    # a shard group as large as the data-parallel group is plain FSDP
    assert flowsim.simulate(dict(BASE, dp_shard=256)).step_time_s == full.step_time_s


def test_distributed_optimizer_instances():
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=64, tp=1, gbs=64, mbs=1, distributed_optimizer=True)
    r = flowsim.simulate(dict(base, dp_shard=8))
    rs, ar = _coll(r, "dps", "reducescatter"), _coll(r, "dpr", "allreduce")
    assert (rs.n_ranks, ar.n_ranks) == (8, 8)
    assert ar.count_per_step == rs.count_per_step  # one replica all-reduce per bucket
    assert ar.size_bytes == pytest.approx(rs.size_bytes / 8)
    n_params = r.memory_detail["weights"] / 2  # bf16 weights, not sharded by ZeRO-1
    assert rs.size_bytes * rs.count_per_step == pytest.approx(n_params * GRAD_REDUCE_BYTES, rel=1e-6)


def test_hybrid_sharding_rules():
    with pytest.raises(ConfigError) as e:
        build_config(**dict(BASE, dp_shard=48))
    assert str(e.value) == ("data_parallel_shard_size: must divide data_parallel_size * context_parallel_size "
                            "(got 48 and 256*1)")
    with pytest.raises(ConfigError) as e:
        build_config(**dict(BASE, zero_stage=0, dp_shard=8))
    assert str(e.value).startswith("data_parallel_shard_size: hybrid sharding needs zero_stage >= 1")
    with pytest.raises(ConfigError) as e:
        build_config(**dict(BASE, dp_shard=-1))
    assert str(e.value).startswith("data_parallel_shard_size:")
