"""Traffic of different kinds that overlaps in time shares links (issue 6, item 1)."""
import importlib

import numpy as np
import pytest

import flowsim
from flowsim.network.collective_flows import run_concurrent
from flowsim.config import ClusterConfig, build_config
from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu
from flowsim.nccl_models.execution import NET_BW_EFFICIENCY
from flowsim.step.flows import layer_traffic, window_traffic
from flowsim.model.workload import build_workload

H100 = get_gpu("h100-sxm")
S = 1e9  # bytes
NIC_Bps = 400e9 / 8 * NET_BW_EFFICIENCY  # what one 400 Gb/s NIC delivers to the flows, bytes/s
# two 8-GPU nodes; with one NIC per node every GPU leaves through it, with eight each GPU has its own rail
ONE_NIC = ClusterConfig(gpu="h100-sxm", num_gpus=16, nics_per_node=1)
EIGHT_NICS = ClusterConfig(gpu="h100-sxm", num_gpus=16)
PP = ("sendrecv", S, [[0, 8], [1, 9], [2, 10], [3, 11]])       # S each way on 4 pairs: 4 flows per direction
EP = ("alltoall", 4 * S, [[4, 12], [5, 13], [6, 14], [7, 15]])  # 2S each way on 4 other pairs: 4 flows


def _times(cluster, *collectives):
    return [r.time_s for r in run_concurrent(cluster, H100, list(collectives))]


def test_pp_and_ep_on_one_nic_share_it_max_min_fairly():
    # Alone, 4 flows share the NIC (C/4 each, below every flow's kernel-link cap): PP drains in 4S/C, EP in
    # 8S/C. Together the 8 flows get C/8 each: PP's S drains at 8S/C; by then each EP flow has moved S, and
    # its remaining S drains at C/4 (the survivor speeds up) by 12S/C. Latencies are the same alone and
    # together, so each side is longer by exactly 4S/C: the other's bytes through the shared NIC.
    pp_alone, = _times(ONE_NIC, PP)
    ep_alone, = _times(ONE_NIC, EP)
    pp, ep = _times(ONE_NIC, PP, EP)
    assert pp - pp_alone == pytest.approx(4 * S / NIC_Bps, rel=1e-6)
    assert ep - ep_alone == pytest.approx(4 * S / NIC_Bps, rel=1e-6)
    assert pp == pytest.approx(2 * pp_alone, rel=0.01)  # 8S/C against 4S/C, plus 35 us of latency


def test_dp_reduction_behind_a_saturated_nic_absorbs_the_pp_bytes():
    # A 2-rank ring all-reduce of 2S across the two nodes fills the NIC alone (S each way); the PP send of S
    # on another pair must cross the same saturated NIC: work conservation puts the reduction's end S / C
    # later (to 0.1 %: the ring's per-step latencies leave the NIC idle for a few microseconds).
    dp = ("allreduce", 2 * S, [[4, 12]])
    pp = ("sendrecv", S, [[0, 8]])
    dp_alone, = _times(ONE_NIC, dp)
    pp_alone, = _times(ONE_NIC, pp)
    dp_shared, pp_shared = _times(ONE_NIC, dp, pp)
    assert dp_shared - dp_alone == pytest.approx(S / NIC_Bps, rel=2e-3)
    assert pp_shared > pp_alone


def test_kinds_on_disjoint_rails_keep_their_times():
    # eight NICs: the PP pairs use rails 0-3, the EP pairs rails 4-7; nothing is shared
    assert _times(EIGHT_NICS, PP, EP) == pytest.approx(_times(EIGHT_NICS, PP) + _times(EIGHT_NICS, EP), rel=1e-12)
    # and a collective connected to the focus by no link is left out of the simulation
    assert run_concurrent(EIGHT_NICS, H100, [PP, EP], focus=[0])[1] is None
    assert run_concurrent(ONE_NIC, H100, [PP, EP], focus=[0])[1] is not None


# a parameter all-gather of 2S on four 2-rank groups across the nodes: each rank receives the other's S, one
# flow per direction per group (the 4 pairs other than PP's)
AG = ("allgather", 2 * S, [[4, 12], [5, 13], [6, 14], [7, 15]])


def test_param_gather_and_pp_send_on_one_nic_share_it_max_min_fairly():
    # Alone, each side's 4 flows per direction share the NIC at C/4 (below every flow's kernel-link cap): S
    # each in 4S/C. Together the 8 flows get C/8 each and all carry S, so all end at 8S/C: each side is longer
    # by the other's 4S through the shared NIC. (To 1e-3: the ring's step latency and the send's do not
    # overlap alone and together alike, 0.04 % of 4S/C.)
    ag_alone, = _times(ONE_NIC, AG)
    pp_alone, = _times(ONE_NIC, PP)
    ag, pp = _times(ONE_NIC, AG, PP)
    assert ag_alone == pytest.approx(4 * S / NIC_Bps, rel=1e-3)
    assert ag - ag_alone == pytest.approx(4 * S / NIC_Bps, rel=1e-3)
    assert pp - pp_alone == pytest.approx(4 * S / NIC_Bps, rel=1e-3)


def test_param_gather_and_pp_send_on_disjoint_rails_keep_their_times():
    # eight NICs: the gather's pairs use rails 4-7, the sends rails 0-3
    assert _times(EIGHT_NICS, AG, PP) == pytest.approx(_times(EIGHT_NICS, AG) + _times(EIGHT_NICS, PP), rel=1e-12)


def test_after_runs_a_stream_in_turn():
    first, second = run_concurrent(ONE_NIC, H100, [PP, EP], after=[None, 0])
    assert (first.time_s, second.time_s) == pytest.approx(tuple(_times(ONE_NIC, PP) + _times(ONE_NIC, EP)),
                                                          rel=1e-9)
    with pytest.raises(ConfigError, match="after"):
        run_concurrent(ONE_NIC, H100, [PP, EP], after=[1, None])


MIXTRAL = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=32, gpus_per_node=4, nics_per_node=1, pp=2, ep=8,
               gbs=32, seq=4096, distributed_optimizer=True, moe_imbalance_factor=1.0)  # perfectly even routing


def test_window_traffic_counts_the_sends_and_all_to_alls_of_the_window():
    cfg = build_config(**MIXTRAL)
    wl = build_workload(cfg)
    tl = flowsim.simulate(cfg).timeline.pipeline
    m = cfg.num_microbatches
    assert (m, cfg.training.dp) == (2, 16)
    # whole step: every stage's 16 MoE layers exchange 4 all-to-alls of 4096 tokens x top-2 x 4096 hidden x
    # 2 bytes (2 forward, 2 backward) per micro-batch; the boundary carries m sends each way
    a2a = 4096 * 2 * 4096 * 2
    everything = window_traffic(cfg, H100, wl, tl, 0.0, np.inf)
    assert everything == (("ep", 0, "alltoall", m * 16 * 4 * a2a), ("ep", 1, "alltoall", m * 16 * 4 * a2a),
                          ("pp", 0, "sendrecv", m * wl.p2p_bytes))
    # the second half of the last stage's last backward: half its 2 backward all-to-alls per layer, its one
    # send to stage 0 at the end; stage 0 waits for that send, idle
    s, e = tl.last_bwd_start_s[1, 0], tl.last_bwd_end_s[1, 0]
    assert window_traffic(cfg, H100, wl, tl, (s + e) / 2, e + 1e-9) == (
        ("ep", 1, "alltoall", pytest.approx(16 * 2 * a2a / 2)), ("pp", 0, "sendrecv", wl.p2p_bytes))


def test_step_with_cross_kind_sharing_is_never_shorter(monkeypatch):
    # With one NIC per 4-GPU node, each stage's gradient reduce-scatter (16 ranks on 4 nodes) runs beside the
    # expert all-to-alls of its last backward (8 ranks on 2 nodes) and the pipeline sends through the same
    # NICs. Sharing only adds time: every extra is >= 0 and the exposed part of a bucket stream grows with
    # its bucket times, so the step can only lengthen; here it does, since the NICs are saturated.
    cfg = build_config(**MIXTRAL, comm_engine="flow")
    shared = flowsim.simulate(cfg)
    simulate_module = importlib.import_module("flowsim.step.data_parallel")
    monkeypatch.setattr(simulate_module, "cross_kind_extra_s", lambda cfg, gpu, wl, tl, reduction, t0, t1:
                        (np.zeros(len(reduction)), 0.0))
    separate = flowsim.simulate(cfg)
    assert shared.step_time_s > separate.step_time_s
    assert all(a >= b for a, b in zip(shared.timeline.dp_exposed_s, separate.timeline.dp_exposed_s))
    assert shared.stages[0].compute_s == separate.stages[0].compute_s


def test_layer_traffic_averages_a_stage_s_sends_and_all_to_alls_over_its_layer_passes():
    cfg = build_config(**MIXTRAL, zero_stage=3)
    wl = build_workload(cfg)
    # 2 micro-batches through stage 0's 16 MoE layers: per layer pass, one MoE layer's 2 all-to-alls of
    # 4096 tokens x top-2 x 4096 hidden x 2 bytes per phase, and 2 sends (one per chunk pass) over 32 layer
    # passes each way
    a2a = 2 * 4096 * 2 * 4096 * 2
    sends = ("pp", 0, "sendrecv", 2 * wl.p2p_bytes / 32)
    assert layer_traffic(cfg, wl, 0) == {"fwd": (("ep", 0, "alltoall", a2a), sends),
                                         "bwd": (("ep", 0, "alltoall", a2a), sends)}


def _no_extra(cfg, gpu, wl, where, parts, *rest):
    """Stands for cross_kind_extra_s / layer_cross_kind_extra_s with every kind priced alone."""
    return np.zeros(len(parts)), 0.0


def test_step_with_param_gather_sharing_is_never_shorter(monkeypatch):
    # (c1) The distributed optimizer's gather beside the next step's first forward passes: with one NIC per
    # 4-GPU node it shares the NICs with their all-to-alls and sends. Extras are >= 0, its first bucket is
    # exposed and the rest slows the forward by its SM share, so the step can only lengthen; here it does.
    cfg = build_config(**MIXTRAL, comm_engine="flow")
    shared = flowsim.simulate(cfg)
    simulate_module = importlib.import_module("flowsim.step.data_parallel")
    reduction_only = simulate_module.cross_kind_extra_s
    monkeypatch.setattr(simulate_module, "cross_kind_extra_s", lambda cfg, gpu, wl, tl, parts, t0, t1: (
        _no_extra(cfg, gpu, wl, tl, parts) if parts[0][2] == "allgather"
        else reduction_only(cfg, gpu, wl, tl, parts, t0, t1)))
    separate = flowsim.simulate(cfg)
    assert shared.step_time_s > separate.step_time_s
    assert all(a > b for a, b in zip(shared.timeline.dp_exposed_s, separate.timeline.dp_exposed_s))


def test_fsdp_step_with_layer_sharing_is_never_shorter(monkeypatch):
    # (c2) ZeRO-3: each layer's all-gather (and in backward its reduce-scatter) shares the NICs with the
    # layer's all-to-alls and the stage's sends. Extras are >= 0 and overlapped_s grows with the
    # communication time, so each layer pass, and the step, can only lengthen; here, with the all-to-alls
    # saturating the one NIC per node, it does.
    cfg = build_config(**MIXTRAL, zero_stage=3, comm_engine="flow")
    shared = flowsim.simulate(cfg)
    simulate_module = importlib.import_module("flowsim.step.data_parallel")
    monkeypatch.setattr(simulate_module, "layer_cross_kind_extra_s", _no_extra)
    separate = flowsim.simulate(cfg)
    assert shared.step_time_s > separate.step_time_s
    assert shared.stages[0].dp_comm_s > separate.stages[0].dp_comm_s
    assert shared.stages[0].compute_s == separate.stages[0].compute_s


def test_context_parallel_transfers_join_the_windows():
    # Llama 3 8B, CP 4 across 4 two-GPU nodes of one NIC each: ring attention passes each rank's K and V
    # chunk (2 x s/cp x g x d x 2 bytes) cp - 1 times per layer forward and twice as much backward
    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=16, gpus_per_node=2, nics_per_node=1, cp=4,
                       seq=8192, gbs=4, distributed_optimizer=True, comm_engine="flow")
    wl = build_workload(cfg)
    kv = 2 * 8192 // 4 * 8 * 128 * 2
    per_fwd = 3 * kv
    assert layer_traffic(cfg, wl, 0) == {"fwd": (("cp", 0, "sendrecv", per_fwd),),
                                         "bwd": (("cp", 0, "sendrecv", 2 * per_fwd),)}
    tl = flowsim.simulate(cfg).timeline.pipeline
    m = cfg.num_microbatches
    whole_step = m * 32 * 3 * per_fwd  # 32 layers: forward 1x, backward 2x the forward bytes
    assert window_traffic(cfg, H100, wl, tl, 0.0, np.inf) == (("cp", 0, "sendrecv", pytest.approx(whole_step)),)


def test_context_parallel_transfers_slow_the_gradient_reduction(monkeypatch):
    # the same job: the stage's DP reduce-scatter runs beside the last backward's ring-attention transfers on
    # the one NIC of each node, so it takes longer than with the CP bytes left out of the window
    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=16, gpus_per_node=2, nics_per_node=1, cp=4,
                       seq=8192, gbs=4, distributed_optimizer=True, comm_engine="flow")
    shared = flowsim.simulate(cfg)
    step_flows = importlib.import_module("flowsim.step.flows")
    monkeypatch.setattr(step_flows, "_cp_bytes", lambda wl: {})
    step_flows._together_s.cache_clear()
    alone = flowsim.simulate(cfg)
    assert shared.timeline.dp_exposed_s[0] > alone.timeline.dp_exposed_s[0]
    assert shared.step_time_s > alone.step_time_s
