"""The loss's kernels per cross-entropy implementation (flowsim.model.loss): known bytes and kernel counts."""
import pytest

import flowsim
from flowsim.config.training import CROSS_ENTROPY_IMPLS
from flowsim.errors import ConfigError
from flowsim.model.fusion import CROSS_ENTROPY_KERNELS, cross_entropy_bytes
from flowsim.model.workload import build_head, padded_vocab

JOB = dict(model="llama2-7b", cluster="dgx-h100", gpus=8, tp=2, gbs=16, mbs=1)


def _ce(cfg):
    head = build_head(cfg).compute
    return head[head.name.str.startswith("cross_entropy")]


def test_every_implementation_is_priced():
    assert set(CROSS_ENTROPY_KERNELS) == set(CROSS_ENTROPY_IMPLS)
    # Megatron-LM's separate ops: upcast 6, max 4, subtract 8, exp 8, sum 4, divide 8; backward multiply 8, downcast 6
    assert cross_entropy_bytes("megatron") == (38.0, 14.0)
    assert cross_entropy_bytes("fp32_upcast") == (14.0, 22.0)
    assert cross_entropy_bytes("fused") == (6.0, 6.0)


@pytest.mark.parametrize("impl, n_fwd, n_bwd", [("fused", 1, 1), ("megatron", 6, 2), ("fp32_upcast", 2, 3)])
def test_head_rows_are_the_implementations_kernels(impl, n_fwd, n_bwd):
    cfg = flowsim.build_config(JOB, cross_entropy_impl=impl)
    ce = _ce(cfg)
    logits = cfg.microbatch_tokens * padded_vocab(cfg) // cfg.training.tp
    assert (ce.phase == "fwd").sum() == n_fwd and (ce.phase == "bwd").sum() == n_bwd
    fwd, bwd = cross_entropy_bytes(impl)
    assert ce[ce.phase == "fwd"].bytes.sum() == pytest.approx(fwd * logits)
    assert ce[ce.phase == "bwd"].bytes.sum() == pytest.approx(bwd * logits)


def test_the_kernel_set_decides_without_an_implementation():
    fused = _ce(flowsim.build_config(JOB))
    eager = _ce(flowsim.build_config(JOB, kernel_fusion="eager"))
    assert len(fused) == 2 and len(eager) == 5


def test_megatron_profiles_run_megatrons_loss_and_it_costs_time():
    cfg = flowsim.build_config(JOB, framework="megatron-lm", framework_version="megatron-lm-core_r0.8")
    assert cfg.training.cross_entropy_impl == "megatron"
    slow = flowsim.simulate(JOB, cross_entropy_impl="megatron").step_time_s
    assert slow > flowsim.simulate(JOB, cross_entropy_impl="fused").step_time_s


def test_bad_implementation_names_the_key():
    with pytest.raises(ConfigError, match="cross_entropy_impl: must be one of fused, megatron, fp32_upcast"):
        flowsim.build_config(JOB, cross_entropy_impl="fast")
