"""Compute slowed by communication that shares its SMs (flowsim.step.overlap.overlapped_s, overlap_comm_sms)."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.step.overlap import overlapped_s


def test_overlapped_s_closed_forms():
    # 10 ms of compute beside 4 ms of communication on 33 of 132 SMs: compute runs at r = 0.75 while the
    # communication lasts, so it loses 4 ms x 0.25 = 1 ms
    assert overlapped_s(10e-3, 4e-3, 33, 132) == pytest.approx(11e-3)
    # communication longer than the slowed compute (20 ms >= 10 / 0.75 ms): the pair takes the communication
    assert overlapped_s(10e-3, 20e-3, 33, 132) == pytest.approx(20e-3)
    # no SMs held: free overlap; all SMs held: the two run one after the other
    assert overlapped_s(10e-3, 4e-3, 0, 132) == pytest.approx(10e-3)
    assert overlapped_s(10e-3, 4e-3, 132, 132) == pytest.approx(14e-3)


def test_overlap_comm_sms_sets_the_share():
    # data-parallel buckets reduced beside the backward pass: the more SMs they hold, the slower the step
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=64, tp=1, gbs=64, mbs=1)
    steps = [flowsim.simulate(base, overlap_comm_sms=n).step_time_s for n in (1, 16, 132)]
    assert steps[0] < steps[1] < steps[2]
    default = flowsim.simulate(base)
    assert steps[0] < default.step_time_s < steps[2]
    with pytest.raises(ConfigError) as e:
        build_config(**base, overlap_comm_sms=-1)
    assert str(e.value).startswith("overlap_comm_sms:")


def test_gradient_buckets_follow_the_framework_defaults():
    from flowsim.step.data_parallel import grad_bucket_bytes
    from flowsim.model.workload import build_workload

    def bucket(**kw):
        cfg = build_config(model="llama3-8b", cluster="dgx-h100", **kw)
        return grad_bucket_bytes(cfg, build_workload(cfg), 0)

    # Megatron-core DDP: max(40M, 1M x dp x cp) parameters of 4-byte gradients
    assert bucket(gpus=8, gbs=8, distributed_optimizer=True) == 40e6 * 4
    assert bucket(gpus=128, gbs=128, cp=2) == 1e6 * (64 * 2) * 4  # dp 64 x cp 2
    # PyTorch DDP with eager modules: bucket_cap_mb = 25 MiB
    assert bucket(gpus=8, gbs=8, kernel_fusion="eager") == 25 * 2**20
    # FSDP SHARD_GRAD_OP: one transformer block's gradients
    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=8, zero_stage=2)
    wl = build_workload(cfg)
    assert grad_bucket_bytes(cfg, wl, 0) == pytest.approx(wl.stage_params[0] / 32 * 4)
    assert bucket(gpus=8, gbs=8, bucket_size_bytes=1e6) == 1e6


def test_grad_reduce_dtype_sets_the_reduction_bytes():
    # the distributed optimizer reduce-scatters every gradient once per step: 4 bytes each in fp32, 2 in bf16
    # (Megatron-core grad_reduce_in_fp32 off); the bucket count stays (buckets are counted in parameters)
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=16, gbs=16, distributed_optimizer=True)

    def reduced(dtype):
        r = flowsim.simulate(base, grad_reduce_dtype=dtype)
        calls = [c for c in r.collectives if c.group == "dp" and c.op == "reducescatter"]
        return sum(c.size_bytes * c.count_per_step for c in calls), sum(c.count_per_step for c in calls)

    (fp32, n32), (bf16, n16) = reduced("fp32"), reduced("bf16")
    assert bf16 == pytest.approx(fp32 / 2) and n16 == n32
