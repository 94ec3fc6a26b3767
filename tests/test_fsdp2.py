"""ZeRO-3 / FSDP costs beyond the per-layer collectives: FSDP2's copy-out of each gathered layer
(``fsdp_version``) and the last layer's reduce-scatter after the backward."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.fusion import ACT_BYTES
from flowsim.model.workload import build_workload, layer_params

BASE = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=8, zero_stage=3)


def _copy_rows(**kw):
    cfg = build_config(**{**BASE, **kw})
    ops = build_workload(cfg).layer.compute
    return cfg, ops[ops["name"].str.startswith("fsdp_copy_out")]


def test_fsdp2_copies_each_gathered_layer_out_in_forward_and_backward():
    cfg, rows = _copy_rows(fsdp_version=2)
    # read and write every 16-bit weight of the layer once per gather: forward and backward
    assert list(rows["phase"]) == ["fwd", "bwd"]
    assert rows["bytes"].tolist() == pytest.approx([2 * ACT_BYTES * layer_params(cfg)] * 2)
    # flat-buffer FSDP (FSDP1, DeepSpeed ZeRO-3) gathers into the weights' own storage; no sharding, no gather
    assert _copy_rows(fsdp_version=1)[1].empty
    assert _copy_rows(fsdp_version=2, zero_stage=2)[1].empty
    assert _copy_rows(fsdp_version=2, gpus=1, gbs=1)[1].empty


def test_fsdp2_copy_out_lengthens_the_step():
    one, two = (flowsim.simulate(BASE, fsdp_version=v) for v in (1, 2))
    assert two.step_time_s > one.step_time_s
    assert two.stages[0].compute_s > one.stages[0].compute_s


def test_the_last_reduce_scatter_of_zero3_is_exposed():
    from flowsim.config.layout import group_spans
    from flowsim.gpu_specs import get_gpu
    from flowsim.step.data_parallel import dp_exposed
    from flowsim.step.pricer import CollectivePricer

    cfg = build_config(**BASE)
    wl = build_workload(cfg)
    comms = CollectivePricer(cfg.cluster, get_gpu(cfg.cluster.gpu), group_spans(cfg.training))
    per_layer = wl.stage_params[0] / 32
    rs = comms.time("dp", "reducescatter", per_layer * 4, cfg.num_microbatches)  # fp32 gradients
    # one layer's reduce-scatter after the last backward (no hybrid-sharding replicas to all-reduce across)
    assert dp_exposed(cfg, wl, comms, None, 0) == (pytest.approx(rs), 0.0, 0.0)
    # with gradient accumulation, after every micro-batch's backward
    acc = build_config(**{**BASE, "gbs": 32})
    assert acc.num_microbatches == 4
    rs4 = comms.time("dp", "reducescatter", per_layer * 4, 4)
    assert dp_exposed(acc, build_workload(acc), comms, None, 0)[0] == pytest.approx(4 * rs4)
    single = build_config(**{**BASE, "gpus": 1, "gbs": 1})
    assert dp_exposed(single, build_workload(single), comms, None, 0) == (0.0, 0.0, 0.0)


def test_fsdp_version_comes_from_the_framework_and_is_checked():
    assert build_config(**BASE, framework="torchtitan").training.fsdp_version == 2
    assert build_config(**BASE, framework="pytorch-fsdp").training.fsdp_version == 1
    assert build_config(**BASE, framework="torchtitan", fsdp_version=1).training.fsdp_version == 1
    with pytest.raises(ConfigError) as e:
        build_config(**BASE, fsdp_version=3)
    assert str(e.value).startswith("fsdp_version:")
