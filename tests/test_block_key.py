"""Blocks, op tables and priced op times are shared by block key (flowsim.model.workload.block_key): the configs
that share a key build the same blocks, and a config simulated after others that share its blocks gives the
numbers of a simulation with every cache cleared (the uncached path)."""
import dataclasses

import make_fast_path_data
import numpy as np
import pytest
from fuzz_inputs import layouts
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import flowsim
from flowsim.errors import ConfigError
from flowsim.explore.space import LayoutSpace, enumerate_layouts
from flowsim.model import memo, workload
from flowsim.step import simulate as step_simulate

def _clear():
    memo.clear_all()


def _same_blocks(a, b) -> bool:
    if (a is None) != (b is None):
        return False
    if a is None:
        return True
    return (a.comms == b.comms and a.columns.keys() == b.columns.keys()
            and all(np.array_equal(a.columns[k], b.columns[k]) for k in a.columns))


def _assert_same_blocks(blocks_a, blocks_b):
    assert all(_same_blocks(x, y) for x, y in zip(blocks_a, blocks_b, strict=True))


# what the key leaves out, as config keys: pipeline depth and schedule, ZeRO stage, FSDP sharding, batch
@st.composite
def _siblings(draw):
    kw = draw(layouts())
    if draw(st.booleans()):
        kw["fsdp_version"] = 2
    other = dict(kw, pp=draw(st.sampled_from((1, 2, 4))), dp=draw(st.sampled_from((kw["dp"], 2 * kw["dp"]))),
                 zero_stage=draw(st.sampled_from((0, 1, 2, 3))), distributed_optimizer=draw(st.booleans()),
                 schedule=draw(st.sampled_from(("auto", "1f1b", "gpipe", "zb-h1", "dualpipe"))),
                 overlap_grad_reduce=draw(st.booleans()), overlap_param_gather=draw(st.booleans()),
                 bucket_size_bytes=draw(st.sampled_from((40e6, 1e9))))
    other["gpus"] = kw["tp"] * other["pp"] * kw["cp"] * other["dp"]
    other["gbs"] = kw["gbs"] * (other["dp"] // kw["dp"]) * draw(st.sampled_from((1, 2)))
    return kw, other


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(_siblings())
def test_configs_with_one_block_key_build_the_same_blocks(pair):
    try:
        a, b = (flowsim.build_config(**kw) for kw in pair)
    except ConfigError:
        assume(False)
    assume(workload.block_key(a) == workload.block_key(b))
    _assert_same_blocks(workload.build_blocks(a), workload.build_blocks(b))


def test_fsdp2_copy_out_is_in_the_key():
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=16, fsdp_version=2)
    z3, z1 = (flowsim.build_config(base, zero_stage=z) for z in (3, 1))
    assert workload.block_key(z3) != workload.block_key(z1)
    assert "fsdp_copy_out" in set(workload.build_blocks(z3)[0].columns["name"])


@pytest.fixture(scope="module")
def space():
    job = {"model": "mixtral-8x7b", "cluster": "dgx-h100", "gpus": 16, "gbs": 32, "seq": 2048, "ep": 2, "sp": True}
    dims = dict(tp=(2, 4), pp=(1, 2, 4), vpp=(1, 2), cp=(1,), ep=(2,), sp=(True,), mbs=(1, 2),
                recompute=("none", "full"), zero=(0, 1, 3))
    return list(enumerate_layouts(job, LayoutSpace.default(flowsim.build_config(job, tp=2), **dims)).configs)


def test_a_tune_space_shares_its_blocks_and_keeps_its_numbers(space):
    keys = {workload.block_key(c) for c in space}
    assert len(keys) * 4 <= len(space)  # the space does share blocks
    _clear()
    warm = [make_fast_path_data.result_numbers(flowsim.simulate(c)) for c in space]  # caches shared, in order
    for cfg, numbers in zip(space, warm):
        wl = workload.build_workload(cfg)
        _assert_same_blocks((wl.layer, wl.moe_layer, wl.embedding, wl.head), workload.build_blocks(cfg))
        fresh = dataclasses.replace(wl, block_key=("uncached",))  # a workload of its own: op table rebuilt
        assert all(np.array_equal(x, y) for x, y in zip(wl.op_table[2].values(), fresh._op_table()[2].values()))
    for cfg, numbers in list(zip(space, warm))[::5]:
        _clear()
        assert make_fast_path_data.result_numbers(flowsim.simulate(cfg)) == numbers, cfg.training


@pytest.mark.parametrize("kw", [dict(model="deepseek-v3", cluster="hgx-h800", gpus=256, pp=4, vpp=2, ep=8, gbs=256,
                                     pipeline_layer_split="balanced", account_for_embedding_in_pipeline_split=True),
                                dict(model="deepseek-v3", cluster="hgx-h800", gpus=256, pp=16, ep=8, gbs=512,
                                     schedule="dualpipe", pipeline_layer_split="balanced"),
                                dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=64, pp=8, tp=2, sp=True, gbs=64,
                                     moe_layer_freq=2)])
def test_moe_layer_counts_equal_a_layer_by_layer_count(kw):
    cfg = flowsim.build_config(**kw)
    layers, moe = workload.chunk_layer_counts(cfg, with_moe=True)
    t, m = cfg.training, cfg.model
    p, v = t.pp, t.vpp
    expected, start = np.zeros((p, v), dtype=np.int64), 0
    for idx in range(p * v):  # the model's layers in virtual-stage order
        s, c = idx % p, idx // p
        n = layers[s, c] - (m.mtp_num_layers if idx == p * v - 1 else 0)
        expected[s, c] = sum(m.moe_layer(i) for i in range(start, start + n))
        start += n
    expected[p - 1, v - 1] += m.mtp_num_layers * m.mtp_moe()
    assert start == m.num_layers and np.array_equal(moe[:, :v], expected)
    assert 0 < moe.sum() < layers.sum()


def test_op_tables_priced_together_equal_each_priced_alone(space):
    from flowsim.gpu_specs import get_gpu

    _clear()
    n = step_simulate.price_op_tables(space)
    assert n == len({workload.block_key(c) for c in space}) and len(step_simulate._OP_TIMES) == n
    together = {k: step_simulate._OP_TIMES.get(k, None) for k in step_simulate._OP_TIMES._store}
    assert step_simulate.price_op_tables(space) == 0  # all kept
    for key, batch in together.items():
        cfg = next(c for c in space if workload.block_key(c) == key[0])
        _clear()
        alone = step_simulate._op_seconds(cfg, workload.build_workload(cfg), get_gpu(cfg.cluster.gpu))
        assert np.array_equal(batch.t_ops, alone.t_ops) and batch.parts == alone.parts
        assert batch.warnings == alone.warnings == () and not batch.t_ops.flags.writeable


def test_a_group_that_warns_is_priced_by_simulate():
    from flowsim.errors import FlowsimWarning

    cfg = flowsim.build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=8, gbs=8, precision="fp8",
                               software_release="megatron-bridge-25.11")
    broken = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, gpu="no-such-gpu"))
    _clear()
    assert step_simulate.price_op_tables([cfg, broken]) == 0
    with pytest.warns(FlowsimWarning, match="no h100-sxm fp8 GEMM"):
        flowsim.simulate(cfg)


def test_priming_stops_at_the_cache_size(space, monkeypatch):
    _clear()
    monkeypatch.setattr(step_simulate._OP_TIMES, "size", 3)
    assert step_simulate.price_op_tables(space) == 3 and len(step_simulate._OP_TIMES) == 3
