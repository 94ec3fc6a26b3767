"""MoE routing imbalance, the flex (DeepEP / HybridEP) dispatcher's two stages, expert placement by release."""
import math

import pytest
from hypothesis import given, settings, strategies as st

import flowsim
from flowsim.config import build_config
from flowsim.config.layout import group_spans
from flowsim.model.moe import expected_max_normal, flex_stage_bytes, imbalance_factor, routing_imbalance
from flowsim.model.workload import build_workload


def test_expected_max_normal_known_values():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 10**7), e_pow=st.integers(1, 8), k=st.integers(1, 16), ep_pow=st.integers(0, 8),
       more=st.integers(2, 100))
def test_imbalance_is_one_when_uniform_and_grows_with_fewer_tokens(n, e_pow, k, ep_pow, more):
    experts, ep = 2 ** e_pow, 2 ** min(ep_pow, e_pow)
    k = min(k, experts)
    f = routing_imbalance(n, experts, k, ep)
    assert f >= 1.0
    assert routing_imbalance(n, experts, experts, ep) == 1.0  # every token to every expert: perfectly uniform
    assert routing_imbalance(n, experts, k, 1) == 1.0  # one rank holds every expert
    fewer = routing_imbalance(n / more, experts, k, ep)
    assert fewer >= f and (fewer > f or f == 1.0)
    assert routing_imbalance(1e15, experts, k, ep) == pytest.approx(1.0, abs=1e-4)


def test_imbalance_known_answer_and_user_factor():
    # DeepSeek-V3 layer on 64 ranks: 4,096 tokens per rank, top-8 of 256 experts
    n, e, k, ep = 4096 * 64, 256, 8, 64
    mu = n * k / ep
    sigma = math.sqrt(n * k / ep * (1 - 1 / ep) * (e - k) / (e - 1))
    assert routing_imbalance(n, e, k, ep) == pytest.approx(1 + expected_max_normal(ep) * sigma / mu)
    kw = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, ep=8, gbs=8)
    assert imbalance_factor(build_config(**kw), 4096) == routing_imbalance(4096 * 8, 8, 2, 8) > 1.0
    assert imbalance_factor(build_config(**kw, moe_imbalance_factor=1.3), 4096) == 1.3


def _fc1_m(cfg):
    c = build_workload(cfg).moe_layer.compute
    return int(c[(c["name"] == "expert_fc1") & (c["phase"] == "fwd")]["m"].iloc[0])


def test_busiest_rank_sets_expert_work_and_capacity_bounds_it():
    kw = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, ep=8, gbs=8)
    even = _fc1_m(build_config(**kw, moe_imbalance_factor=1.0))
    assert _fc1_m(build_config(**kw, moe_imbalance_factor=1.5)) == int(1.5 * even)
    # capacity factor 1.2 drops what the busiest rank's experts get beyond ceil(1.2 x the mean) from each rank
    cap = math.ceil(4096 * 2 / 8 * 1.2) * 8
    assert _fc1_m(build_config(**kw, moe_imbalance_factor=1.5, moe_expert_capacity_factor=1.2)) == cap
    padded = build_config(**kw, moe_imbalance_factor=1.5, moe_expert_capacity_factor=1.2,
                          moe_pad_expert_input_to_capacity=True)
    assert _fc1_m(padded) == cap
    slow = flowsim.simulate(build_config(**kw, moe_imbalance_factor=1.5)).step_time_s
    assert slow > flowsim.simulate(build_config(**kw, moe_imbalance_factor=1.0)).step_time_s


def _brute_distinct(experts, k, groups):
    """Mean number of groups hit over every k-subset of the experts (groups of experts / groups consecutive)."""
    from itertools import combinations

    size = experts // groups
    hits = [len({x // size for x in c}) for c in combinations(range(experts), k)]
    return sum(hits) / len(hits)


@pytest.mark.parametrize("experts, k, groups", [(4, 2, 2), (8, 3, 4), (16, 4, 4), (12, 5, 3)])
def test_distinct_groups_match_enumeration(experts, k, groups):
    from flowsim.model.moe import _distinct

    assert _distinct(experts, k, groups) == pytest.approx(_brute_distinct(experts, k, groups))


V3 = dict(model="deepseek-v3", cluster="dgx-h100", gpus=64, ep=64, gbs=64, mbs=1, seq=4096, pp=1,
          moe_imbalance_factor=1.0, moe_router_num_groups=0, moe_router_group_topk=0)  # routing not node-limited


def test_deepep_two_stages_have_its_design_bytes():
    # DeepEP over 8 nodes of 8 GPUs: each token crosses the network once per other node holding one of its 8
    # experts (256 experts, 32 per node), then NVLink once per GPU holding one (4 experts per GPU)
    cfg = build_config(**V3, moe_token_dispatcher_type="flex")
    assert group_spans(cfg.training)["epn"] == (8, 1) and group_spans(cfg.training)["epx"] == (8, 8)
    vec = 4096 * 7168 * 2  # one GPU's tokens, 16-bit hidden states
    nodes = 8 * (1 - math.comb(256 - 32, 8) / math.comb(256, 8))
    gpus = 64 * (1 - math.comb(256 - 4, 8) / math.comb(256, 8))
    nvl, rdma, domains = flex_stage_bytes(cfg, 4096)
    assert (nvl, rdma, domains) == (pytest.approx(vec * gpus), pytest.approx(vec * nodes), 8)
    assert 7.0 < gpus < 8.0 and 5.0 < nodes < 6.0  # deduplicated: fewer copies than the 8 of the all-to-all
    comms = [(c.group, c.op, c.size_bytes) for c in build_workload(cfg).moe_layer.comms if c.phase == "fwd"]
    assert comms == [("epx", "alltoall", pytest.approx(vec * nodes)), ("epn", "alltoall", pytest.approx(vec * gpus)),
                     ("epn", "alltoall", pytest.approx(vec * gpus)), ("epx", "alltoall", pytest.approx(vec * nodes))]
    # DeepEP's NVLink stage stops at 8 GPUs on an NVL72 rack too (8 stages of 8); HybridEP spans the rack's 64
    rack = dict(V3, cluster="gb200-nvl72", moe_token_dispatcher_type="flex")
    assert flex_stage_bytes(build_config(**rack), 4096)[2] == 8
    assert flex_stage_bytes(build_config(**rack, moe_flex_dispatcher_backend="hybridep"), 4096)[1:] == (0.0, 1)
    assert flex_stage_bytes(build_config(**rack, moe_flex_nvlink_ranks=16), 4096)[2] == 4
    a2a, flex = flowsim.simulate(build_config(**V3)), flowsim.simulate(cfg)
    assert flex.stages[0].ep_comm_s < a2a.stages[0].ep_comm_s
    assert {x.group for x in flex.collectives} >= {"epn", "epx"}


MIX32 = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=32, tp=4, sp=True, ep=8, gbs=32,
             moe_imbalance_factor=1.0)


def _ep_call(result):
    return next(x for x in result.collectives if x.group == "ep" and x.op == "alltoall")


@pytest.mark.filterwarnings("ignore::flowsim.errors.FlowsimWarning")  # NeMo 24.07's GEMM tables: a newer release's
def test_release_places_expert_groups():
    from flowsim.gpu_specs import get_gpu
    from flowsim.network.comm_layout import group_layout

    # Megatron-core >= 0.10 (tp-ep-dp-pp, ETP 1): the EP group is 8 consecutive GPUs, one NVLink node;
    # <= 0.9 (tp-cp-ep-dp-pp: NeMo 24.07) splits experts by TP and puts EP members 4 apart: 4 nodes
    new = build_config(**MIX32)
    old = build_config(**MIX32, etp=4, framework="nemo", framework_version="nemo-24.07")
    assert group_spans(new.training)["ep"] == (8, 1) and group_spans(old.training)["ep"] == (8, 4)
    gpu = get_gpu("h100-sxm")
    assert group_layout(new.cluster, gpu, 8, 1).n_nodes == 1
    assert group_layout(old.cluster, gpu, 8, 4).n_nodes == 4
    a, b = _ep_call(flowsim.simulate(new)), _ep_call(flowsim.simulate(old))
    assert a.size_bytes == b.size_bytes  # the same tokens move ...
    assert b.time_s > 3 * a.time_s  # ... over the network instead of NVLink
    explicit = build_config(**MIX32, etp=4, expert_rank_order="tp-cp-ep-dp-pp")
    assert group_spans(explicit.training) == group_spans(old.training)


@pytest.mark.parametrize("kw, message", [
    (dict(etp=1, expert_rank_order="tp-cp-ep-dp-pp"), "expert_tensor_parallel_size: must equal tensor_model_par"),
    (dict(etp=4, expert_rank_order="tp-ep-pp"), "expert_rank_order: must be one of tp-ep-dp-pp, tp-cp-ep-dp-pp"),
    (dict(etp=4, gbs=64, gpus=64, tp=4, ep=8, cp=2, expert_rank_order="tp-cp-ep-dp-pp"),
     "context_parallel_size: with expert parallelism in expert rank order tp-cp-ep-dp-pp is not modelled"),
    (dict(moe_token_dispatcher_type="flex", etp=2), "moe_token_dispatcher_type: flex is modelled with expert_tens"),
])
def test_expert_layout_rules(kw, message):
    from flowsim.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        build_config(**{**MIX32, **kw})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_fp8_experts_quantise_their_grouped_gemm_inputs():
    kw = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, ep=8, gbs=8, moe_imbalance_factor=1.0)
    c = build_workload(build_config(**kw, precision="fp8")).moe_layer.compute
    rows = {(n, p): b for n, p, b in zip(c["name"], c["phase"], c["bytes"])}
    routed = 4096 * 2  # (token, expert) pairs the GPU's experts take: 8 ranks x 4096 tokens x top-2 / 8 experts
    assert rows[("expert_fc1.cast_in", "fwd")] == routed * 4096 * 3  # read 2-byte, write 1-byte
    assert rows[("expert_fc2.cast_in", "fwd")] == routed * 14336 * 3
    assert not any(n.startswith("expert_fc") and ".cast" in n
                   for n in build_workload(build_config(**kw)).moe_layer.compute["name"])


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 6), v=st.integers(2, 4), k=st.integers(2, 4))
def test_paired_interleaved_order(p, v, k):
    import numpy as np

    from flowsim.step.schedule import BWD, FWD, simulate_pipeline
    from flowsim.step.schedule import _plan

    m = p * k  # a multiple of p (Megatron), with a steady state on every stage
    plan = _plan("interleaved", p, v, m, True)
    for s in range(p):
        order, pub = plan.order[s], plan.publish[s]
        pairs = [i for i in range(len(order) - 1) if pub[i] == i + 1]
        assert pairs, "the steady state pairs its passes"
        for i in pairs:  # a forward with the backward after it, of another micro-batch or chunk
            assert order[i, 0] == FWD and order[i + 1, 0] == BWD
            assert (order[i, 1], order[i, 2]) != (order[i + 1, 1], order[i + 1, 2])
    f, b = np.full((p, v), 1.0), np.full((p, v), 2.0)
    plain = simulate_pipeline("interleaved", m, f, b, 0.0)
    # no communication to hide: pairing only adds a warm-up forward, never deadlocks
    none = simulate_pipeline("interleaved", m, f, b, 0.0, overlap_comm=(0 * f, 0 * b, 0.0), paired=True)
    assert none.busy_s == pytest.approx(plain.busy_s)
    # all-to-alls that hold no SMs hide behind the other pass's compute: the step gets shorter
    hidden = simulate_pipeline("interleaved", m, f, b, 0.0, overlap_comm=(0.4 * f, 0.4 * b, 0.0), paired=True)
    assert hidden.end_s.max() < none.end_s.max() + 1e-12
    assert hidden.busy_s.sum() < plain.busy_s.sum()


def test_ep_overlap_with_interleaved_pipeline():
    kw = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=32, ep=8, pp=2, vpp=2, gbs=64, nics_per_node=1,
              moe_imbalance_factor=1.0)
    base, over = flowsim.simulate(kw), flowsim.simulate({**kw, "overlap_moe_expert_parallel_comm": True})
    assert over.step_time_s < base.step_time_s
    assert over.memory_bytes_per_gpu > base.memory_bytes_per_gpu  # one more micro-batch in flight


def test_flex_dispatcher_holds_its_sms_beside_compute():
    kw = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=16, ep=8, pp=2, gbs=64, nics_per_node=1,
              pipeline_schedule="dualpipe", moe_token_dispatcher_type="flex", moe_imbalance_factor=1.0)
    assert build_workload(build_config(**kw)).expert_comm_sms == 20  # Megatron-LM's --moe-deepep-num-sms
    few, many = (flowsim.simulate(dict(kw, moe_deepep_num_sms=n)).step_time_s for n in (8, 64))
    assert many > few  # DualPipe's paired passes: compute beside the dispatch runs on the SMs it leaves
    assert build_workload(build_config(**{**kw, "moe_token_dispatcher_type": "alltoall"})).expert_comm_sms == 0


def _brute_limited(experts, k, units, groups, group_topk):
    """Mean units hit over every (group choice, expert choice) of group-limited routing, all equally likely."""
    from itertools import combinations

    size, unit = experts // groups, experts // units
    hits = []
    for chosen in combinations(range(groups), group_topk):
        pool = [g * size + i for g in chosen for i in range(size)]
        hits += [len({x // unit for x in c}) for c in combinations(pool, k)]
    return sum(hits) / len(hits)


@pytest.mark.parametrize("experts, k, units, groups, group_topk", [
    (8, 2, 8, 4, 2), (8, 2, 2, 4, 2), (16, 3, 4, 8, 3), (16, 4, 16, 4, 2), (12, 3, 2, 6, 2), (16, 3, 8, 8, 8)])
def test_group_limited_distinct_units_match_enumeration(experts, k, units, groups, group_topk):
    from flowsim.model.moe import _distinct_limited

    assert _distinct_limited(experts, k, units, groups, group_topk) == pytest.approx(
        _brute_limited(experts, k, units, groups, group_topk))


def test_deepseek_node_limited_routing_lowers_the_network_stage():
    # DeepSeek-V3: 8 node groups, a token's experts inside 4 of them (at most 4 nodes, report sec. 3.2.2)
    limited = build_config(**{**V3, "moe_router_num_groups": 8, "moe_router_group_topk": 4},
                           moe_token_dispatcher_type="flex")
    assert limited.model == build_config(**{k: v for k, v in V3.items() if "group" not in k}).model  # the preset's
    free = build_config(**V3, moe_token_dispatcher_type="flex")
    vec = 4096 * 7168 * 2
    pool = 4 * 32  # the experts of the 4 picked nodes
    assert flex_stage_bytes(limited, 4096)[1] == pytest.approx(vec * 4 * (1 - math.comb(pool - 32, 8)
                                                                          / math.comb(pool, 8)))
    assert flex_stage_bytes(limited, 4096)[1] < flex_stage_bytes(free, 4096)[1]
    with pytest.raises(Exception) as e:
        build_config(**{**V3, "moe_router_num_groups": 8})
    assert str(e.value).startswith("moe_router_group_topk: group-limited routing needs")


def test_flex_network_stage_contends_on_the_flow_engine():
    # 4-GPU nodes with one NIC: an EP group of 8 spans two nodes, and the 4 rails of a node share the NIC on the
    # flow engine, where NCCL's model prices one rail alone
    kw = dict(model="mixtral-8x22b", cluster="dgx-h100", gpus=64, gpus_per_node=4, ep=8, pp=4, gbs=64,
              nics_per_node=1, moe_token_dispatcher_type="flex", moe_imbalance_factor=1.0)
    analytic = flowsim.simulate(kw)
    flow = flowsim.simulate(dict(kw, comm_engine="flow"))
    assert flow.stages[1].ep_comm_s > 1.5 * analytic.stages[1].ep_comm_s


def test_alltoall_sorts_received_chunks_by_expert():
    # EP 4 with 2 local experts: the received tokens are sorted by expert and back (read + write each time)
    kw = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, ep=4, gbs=8, moe_imbalance_factor=1.0)
    c = build_workload(build_config(**kw)).moe_layer.compute
    received = 2 * (4096 * 2 // 8 * 4)  # two local experts, each 4 ranks' share
    sort = c[(c["name"] == "sort_chunks") & (c["phase"] == "fwd")]["bytes"]
    assert list(sort) == [2 * 2 * received * 4096 * 2]
    one_local = build_workload(build_config(**{**kw, "ep": 8})).moe_layer.compute
    assert "sort_chunks" not in set(one_local["name"])


def test_megatron_args_with_the_flex_dispatcher(tmp_path):
    from test_importers import LLAMA3_8B_ARGS, _megatron

    moe = LLAMA3_8B_ARGS + " --num-experts 8 --expert-model-parallel-size 8 --moe-token-dispatcher-type flex"
    t = _megatron(tmp_path, moe + " --moe-enable-deepep --moe-deepep-num-sms 24").config["training"]
    assert (t["moe_token_dispatcher_type"], t["moe_flex_dispatcher_backend"], t["moe_deepep_num_sms"]) == \
        ("flex", "deepep", 24)
    hybrid = _megatron(tmp_path, moe + " --moe-flex-dispatcher-backend hybridep").config["training"]
    assert hybrid["moe_flex_dispatcher_backend"] == "hybridep"


def test_shared_expert_overlap_hides_the_dispatch():
    from flowsim.errors import ConfigError
    from flowsim.step.blocks import block_times
    from flowsim.step.overlap import overlapped_s
    from flowsim.gpu_specs import get_gpu
    from flowsim.step.pricer import CollectivePricer
    from flowsim.kernels import op_times

    kw = dict(V3, gpus=16, ep=16, gbs=16)
    plain, over = build_config(**kw), build_config(**kw, moe_shared_expert_overlap=True)
    gpu = get_gpu("h100-sxm")

    def ep_and_shared(cfg):
        blk = build_workload(cfg).moe_layer
        t = op_times(blk.compute, gpu)
        shared = float((t * blk.compute["count"])[blk.compute["name"].str.startswith("shared_")
                                                  & (blk.compute["phase"] == "fwd")].sum())
        pricer = CollectivePricer(cfg.cluster, gpu, group_spans(cfg.training))
        return block_times(blk, t, pricer, False, 1)["ep_fwd"], shared, pricer

    ep_plain, shared, pricer = ep_and_shared(plain)
    ep_over, _, _ = ep_and_shared(over)
    sms = max(pricer.ctas(c.group, c.op, c.size_bytes) for c in build_workload(over).moe_layer.comms)
    # the all-to-alls run beside the shared experts: exposed is what the pair lasts beyond the shared experts
    assert ep_over == pytest.approx(overlapped_s(shared, ep_plain, sms, gpu.sm_count) - shared)
    assert 0 < ep_over < ep_plain
    assert flowsim.simulate(over).step_time_s < flowsim.simulate(plain).step_time_s
    for extra, message in [(dict(model="mixtral-8x7b", ep=8, moe_router_num_groups=0, moe_router_group_topk=0),
                            "moe_shared_expert_overlap: needs shared experts"),
                           (dict(moe_token_dispatcher_type="allgather"),
                            "moe_shared_expert_overlap: needs moe_token_dispatcher_type alltoall or flex")]:
        with pytest.raises(ConfigError) as e:
            build_config(**{**kw, **extra, "moe_shared_expert_overlap": True})
        assert str(e.value).startswith(message)


@pytest.mark.parametrize("seq", [5, 6, 7])
def test_fewer_routed_tokens_than_experts_keep_hfu_at_least_mfu(seq):
    # found by the long config fuzz (docs/RELIABILITY.md): mixtral with 5-7 tokens per micro-batch routes
    # 10-14 (token, expert) pairs over 8 experts; the busiest expert's whole tokens round up, so the hardware
    # FLOPs never fall below the model FLOPs (they did when they were rounded down)
    r = flowsim.simulate(dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, tp=1, ep=8, gbs=8, seq=seq))
    assert r.hfu >= r.mfu
