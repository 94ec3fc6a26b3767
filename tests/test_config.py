"""Config loading: presets, aliases, files, overrides and the rules with their messages."""
import json

import pytest

from flowsim.config import build_config, list_presets
from flowsim.errors import ConfigError


def test_presets_listed():
    assert {"gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-405b"} <= set(
        list_presets("models"))
    assert {"dgx-a100", "dgx-h100", "dgx-b200"} <= set(list_presets("clusters"))


def test_aliases_and_derived_dp():
    cfg = build_config(model="gpt3-175b", cluster="dgx-h100", gpus=1024, tp=8, pp=8, gbs=1536, sp=True)
    t = cfg.training
    assert (t.tp, t.pp, t.dp, t.cp) == (8, 8, 16, 1)
    assert t.sequence_parallel and cfg.num_microbatches == 1536 // 16
    assert cfg.cluster.nic_gbps == 400 and cfg.cluster.gpu == "h100-sxm"
    assert cfg.seq_length == 2048  # from the model preset


def test_preset_fields_overridable():
    cfg = build_config(model="llama3-8b", cluster="dgx-h100", gpus=16, nic_gbps=200, nics_per_node=4,
                       gpu="h200", seq=4096)
    assert (cfg.cluster.nic_gbps, cfg.cluster.nics_per_node, cfg.cluster.gpu) == (200, 4, "h200")
    assert cfg.seq_length == 4096


def test_nested_file_config(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: {preset: llama2-7b, num_layers: 16}\ncluster: dgx-a100\ntraining: {tp: 2, gbs: 64}\n"
                 "num_gpus: 16\n")
    cfg = build_config(p)
    assert cfg.model.num_layers == 16 and cfg.model.hidden_size == 4096
    assert cfg.training.dp == 8 and cfg.cluster.gpu == "a100-sxm4-80gb"
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"model": "llama2-7b", "cluster": "dgx-a100", "tensor_model_parallel_size": 2,
                             "num_gpus": 16, "global_batch_size": 64}))
    assert build_config(j).training.tp == 2


def _err(**kw):
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=8)
    base.update(kw)
    with pytest.raises(ConfigError) as e:
        build_config(**base)
    return str(e.value)


def test_rule_messages():
    assert _err(foo=1) == "foo: unknown key (see `flowsim estimate --help` for the accepted names)"
    assert _err(model="gpt-5").startswith("model: unknown preset; known: ")
    assert _err(cluster="dgx-z").startswith("cluster: unknown preset; known: ")
    assert _err(tp=3) == "num_gpus: must be divisible by tp*pp*cp (got 8 and 3*1*1)"
    assert _err(tp=2, dp=2) == "num_gpus: must equal tp*pp*dp*cp (got 8 vs 2*1*2*1=4)"
    assert _err(gpus=24, tp=3) == "num_attention_heads: must be divisible by tensor_model_parallel_size (got 32 and 3)"
    assert _err(pp=8, gpus=8, num_layers=36) == (
        "num_layers: num_layers must be divisible by pipeline_model_parallel_size * "
        "virtual_pipeline_model_parallel_size (or set pipeline_layer_split: balanced) (got 36 and 8*1)")
    assert _err(gbs=12, mbs=1) == (
        "global_batch_size: must be divisible by micro_batch_size * data_parallel_size (got 12 and 1*8)")
    assert _err(tp="two") == "tensor_model_parallel_size: must be an integer (got two)"
    assert _err(mbs=-1) == "micro_batch_size: must be a positive integer (got -1)"
    assert _err(mbs=1.5) == "micro_batch_size: must be an integer (got 1.5)"
    assert _err(sp=True) == "sequence_parallel: needs tensor_model_parallel_size > 1 (got tp=1)"
    assert _err(oversubscription=0.5) == "oversubscription: must be a finite number in [1, 100] (1 = non-blocking) (got 0.5)"
    assert _err(ep=2) == ("expert_model_parallel_size: needs a mixture-of-experts model; this model is dense "
                          "(got 2)")
    assert _err(recompute="some").startswith("recompute_granularity: must be one of none, selective, full")
    assert _err(cp=3, gpus=24, seq=8192).startswith("seq_length: must be divisible by 2 * context_parallel_size")


def test_interleaved_needs_microbatch_multiple():
    msg = _err(gpus=16, pp=4, vpp=2, gbs=12)
    assert msg.startswith("global_batch_size: interleaved schedule needs the number of micro-batches")


def test_bad_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="^config: not valid YAML"):
        build_config(p)
    q = tmp_path / "list.yaml"
    q.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="^config: top level must be a mapping"):
        build_config(q)


def test_moe_and_schedule_rules():
    moe = dict(model="mixtral-8x7b", cluster="dgx-h100")
    with pytest.raises(ConfigError) as e:
        build_config(**moe, ep=3, gpus=24)
    assert str(e.value) == "expert_model_parallel_size: must divide num_moe_experts (got 3 and 8)"
    with pytest.raises(ConfigError) as e:
        build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, moe_first_k_dense=2)
    assert str(e.value) == ("num_moe_experts: MoE options need a mixture-of-experts model (num_moe_experts > 0) "
                            "(got 0)")
    with pytest.raises(ConfigError) as e:
        build_config(model="llama3-8b", cluster="dgx-h100", gpus=16, pp=4, vpp=2, gbs=16, schedule="1f1b")
    assert str(e.value).startswith("pipeline_schedule: 1f1b runs one model chunk per stage")
    with pytest.raises(ConfigError) as e:
        build_config(model="llama3-8b", cluster="dgx-h100", gpus=8, schedule="dualpipe")
    assert str(e.value) == "pipeline_schedule: dualpipe needs an even pipeline_model_parallel_size >= 2 (got pp=1)"
    cfg = build_config(**moe, gpus=16, tp=2, ep=8, sp=True, gbs=8)
    assert (cfg.training.ep, cfg.training.dp) == (8, 8) and cfg.model.num_moe_experts == 8
