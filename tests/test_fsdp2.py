"""ZeRO-3 / FSDP costs beyond the per-layer collectives: FSDP2's copy-out of each gathered layer
(``fsdp_version``) and the last layer's reduce-scatter after the backward."""
import pytest

import flowsim
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.fusion import ACT_BYTES
from flowsim.model.workload import build_workload, layer_params

BASE = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=8, zero_stage=3)
TORCH_FSDP = dict(BASE, kernel_fusion="eager")  # PyTorch's FSDP: the weights outside the layers form its root unit


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
    from flowsim.step.data_parallel import dp_exposed, root_params
    from flowsim.step.pricer import CollectivePricer

    cfg = build_config(**BASE)
    wl = build_workload(cfg)
    comms = CollectivePricer(cfg.cluster, get_gpu(cfg.cluster.gpu), group_spans(cfg.training))
    # Megatron-style fused ZeRO-3: no root unit, the weights outside the layers ride with the layers' collectives
    assert root_params(cfg, wl, 0) == 0.0
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
    # PyTorch FSDP: the last layer's and the root unit's reduce-scatters after the backward
    torch_cfg = build_config(**TORCH_FSDP)
    torch_wl = build_workload(torch_cfg)
    h, v = 4096, 128256
    root = 2 * v * h + h  # Llama 3: untied embedding and LM head, and the final RMSNorm
    assert root_params(torch_cfg, torch_wl, 0) == pytest.approx(root)
    assert torch_wl.stage_params[0] == pytest.approx(32 * layer_params(torch_cfg) + root)
    both = (comms.time("dp", "reducescatter", layer_params(torch_cfg) * 4, 1)
            + comms.time("dp", "reducescatter", root * 4, 1))
    assert dp_exposed(torch_cfg, torch_wl, comms, None, 0) == (pytest.approx(both), 0.0, 0.0)


def test_the_root_unit_is_gathered_before_the_embedding_and_nothing_hides_it():
    """The per-layer gathers carry the layers' weights only; the root unit's (embedding, final norm, LM head)
    gather joins the first layer's, unhidden, and the step grows by it and by the root's reduce-scatter."""
    from flowsim.config.layout import group_spans
    from flowsim.gpu_specs import get_gpu
    from flowsim.model.workload import padded_vocab
    from flowsim.step.data_parallel import fsdp_exposed, root_params
    from flowsim.step.pricer import CollectivePricer

    cfg = build_config(**TORCH_FSDP)
    wl = build_workload(cfg)
    comms = CollectivePricer(cfg.cluster, get_gpu(cfg.cluster.gpu), group_spans(cfg.training))
    ag = comms.time("dp", "allgather", layer_params(cfg) * 2, 2)
    root_ag = comms.time("dp", "allgather", root_params(cfg, wl, 0) * 2, 1)
    # layers long enough to hide their collectives: only the unhidden gathers are left
    assert fsdp_exposed(cfg, wl, comms, 1.0, 2.0)[2] == pytest.approx(ag + root_ag)
    # a tied embedding is one root weight (GPT-style presets tie them)
    tied = build_config(**{**TORCH_FSDP, "model": "gpt3-175b", "gpus": 64, "tp": 8, "gbs": 8})
    h = tied.model.hidden_size
    # the TP-sharded word embedding (also the head), learned positions and the final LayerNorm's weight and bias
    assert root_params(tied, build_workload(tied), 0) == pytest.approx(
        padded_vocab(tied) * h / 8 + tied.seq_length * h + 2 * h)


def test_fsdp_version_comes_from_the_framework_and_is_checked():
    assert build_config(**BASE, framework="torchtitan").training.fsdp_version == 2
    assert build_config(**BASE, framework="pytorch-fsdp").training.fsdp_version == 1
    assert build_config(**BASE, framework="torchtitan", fsdp_version=1).training.fsdp_version == 1
    with pytest.raises(ConfigError) as e:
        build_config(**BASE, fsdp_version=3)
    assert str(e.value).startswith("fsdp_version:")
