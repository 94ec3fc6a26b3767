"""The caches of collective estimates and block times key a communicator on what NCCL's model reads of its layout
(flowsim.step.pricer.LayoutKey): a group inside one scale-up domain is priced without the NIC fields, so configs
that differ only in NIC rate or node count share the estimates and block times of their intra-domain groups; a
group across domains keeps them. A config priced from the shared caches gives the numbers of a simulation with
every cache cleared."""
import dataclasses

import make_fast_path_data
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import flowsim
from flowsim.config.cluster import ClusterConfig, job_domain_size
from flowsim.gpu_specs import get_gpu
from flowsim.model import memo
from flowsim.nccl_models import OPS, predict
from flowsim.network.comm_layout import group_layout
from flowsim.step import pricer, simulate as step_simulate

# (GPU, GPUs per host, NVLink domain): every scale-up fabric kind and vendor of gpu_specs
_FABRICS = (("h100-sxm", 8, 8), ("a100-sxm4-80gb", 8, 8), ("b200", 8, 8), ("gb200", 4, 72), ("h800", 8, 8),
            ("v100-sxm2-32gb", 8, 8), ("mi300x", 8, 8), ("l40s", 8, 8), ("a100-pcie-80gb", 8, 8))


def _cold():
    memo.clear_all()
    pricer._predict.cache_clear()
    pricer._layout_key.cache_clear()


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.sampled_from(_FABRICS), st.sampled_from((2, 3, 4, 8, 16, 24, 72)), st.sampled_from((1, 2, 4)),
       st.sampled_from(OPS), st.sampled_from((1e3, 3e5, 6e7, 4e9)),
       st.sampled_from(((100.0, 8), (400.0, 4), (800.0, 1))))
def test_nccl_reads_no_nic_field_of_a_one_domain_layout(fabric, n, stride, op, size, nic):
    gpu_key, gpn, domain = fabric
    gpu = get_gpu(gpu_key)
    cluster = ClusterConfig(gpu=gpu_key, num_gpus=144, gpus_per_node=gpn, nvlink_domain=domain, nics_per_node=gpn)
    # inside one domain; off NVSwitch, on one host (a group spread unevenly over hosts is refused there)
    assume((n - 1) * stride < job_domain_size(cluster) and (gpu.scaleup_kind == "nvswitch" or n * stride <= gpn))
    base = group_layout(cluster, gpu, n, stride)
    other = dataclasses.replace(base, nic_Bps=nic[0] * 1e9 / 8, nics_per_node=nic[1])
    assert base.n_nodes == 1 and pricer.LayoutKey(base) == pricer.LayoutKey(other)
    assert predict(op, size, base) == predict(op, size, other)


def test_a_layout_across_domains_keeps_its_nic_fields():
    gpu = get_gpu("h100-sxm")
    a, b = (ClusterConfig(gpu="h100-sxm", num_gpus=32, nic_gbps=g) for g in (400.0, 200.0))
    assert pricer.LayoutKey(group_layout(a, gpu, 8, 1)) == pricer.LayoutKey(group_layout(b, gpu, 8, 1))
    assert pricer.LayoutKey(group_layout(a, gpu, 16, 1)) != pricer.LayoutKey(group_layout(b, gpu, 16, 1))
    assert predict("allreduce", 1e9, group_layout(a, gpu, 16, 1)).time_s \
        < predict("allreduce", 1e9, group_layout(b, gpu, 16, 1)).time_s


_JOB = dict(model="mixtral-8x7b", cluster="dgx-h100", tp=2, cp=2, ep=2, sp=True, pp=2, gbs=64, seq=4096)


def _cfg(**kw):
    return flowsim.build_config({**_JOB, "dp": 4, "gpus": 32, **kw})


@pytest.mark.parametrize("other", [dict(nic_gbps=100.0), dict(nic_gbps=800.0, nics_per_node=4),
                                   dict(dp=8, gpus=64, gbs=128)])
def test_intra_domain_blocks_are_priced_once_across_nic_rate_and_node_count(other):
    base, sibling = _cfg(), _cfg(**other)
    _cold()
    flowsim.simulate(base)
    n_blocks = len(step_simulate._BLOCK_TIMES)
    warm = make_fast_path_data.result_numbers(flowsim.simulate(sibling))
    assert len(step_simulate._BLOCK_TIMES) == n_blocks  # every block of the sibling was a hit
    _cold()
    assert make_fast_path_data.result_numbers(flowsim.simulate(sibling)) == warm


def test_a_tensor_parallel_group_across_hosts_sees_the_nic_rate():
    job = dict(model="llama3-70b", cluster="dgx-h100", tp=16, sp=True, dp=2, gpus=32, gbs=32)
    fast, slow = (flowsim.build_config(job, nic_gbps=g) for g in (400.0, 100.0))
    _cold()
    tp_fast = flowsim.simulate(fast).stages[0].tp_comm_s
    n_blocks = len(step_simulate._BLOCK_TIMES)
    tp_slow = flowsim.simulate(slow).stages[0].tp_comm_s
    assert len(step_simulate._BLOCK_TIMES) > n_blocks and tp_slow > tp_fast
