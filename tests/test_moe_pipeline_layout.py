"""Megatron-core's ``pipeline_model_parallel_layout``: an explicit, possibly uneven split of the embedding,
transformer layers, MTP layers and loss over the virtual pipeline stages (as Megatron-Bridge's DeepSeek-V3 recipes
use: a first stage with the embedding and a last stage with few layers beside the loss)."""
import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.config import build_config
from flowsim.config.layout import parse_pipeline_layout
from flowsim.errors import ConfigError
from flowsim.model.workload import chunk_layer_counts
from flowsim.step.simulate import simulate

SMALL = dict(num_layers=6, hidden_size=1024, num_attention_heads=8, seq_length=1024, vocab_size=32000,
             gpu="h100-sxm", num_gpus=8, global_batch_size=16, micro_batch_size=1)
MOE = dict(SMALL, num_moe_experts=8, moe_router_topk=2, ffn_hidden_size=2048, ep=2)


def test_layout_string_known_answers():
    assert parse_pipeline_layout("Et*3|(tt|)*2L") == ("Ettt", "tt", "tt", "L")
    assert parse_pipeline_layout("E, t*2 | t m L") == ("Ett", "tmL")  # commas and spaces are cosmetic
    assert parse_pipeline_layout("E|((t|)*2)*2L") == ("E", "t", "t", "t", "t", "L")  # nested repeats
    assert parse_pipeline_layout("Ett|t*0|tL") == ("Ett", "", "tL")  # an empty stage


def test_layout_places_virtual_stages_in_megatron_order():
    # virtual stage k = chunk * pp + stage: "Ett|t|tt|tL" on pp 2, vpp 2 gives stage 0 chunks (2, 2), stage 1 (1, 1)
    cfg = build_config(SMALL, pp=2, vpp=2, pipeline_model_parallel_layout="Ett|t|tt|tL")
    assert chunk_layer_counts(cfg).tolist() == [[2, 2], [1, 1]]


def test_the_even_layout_is_the_even_split():
    even = build_config(SMALL, pp=2)
    laid = build_config(SMALL, pp=2, pipeline_model_parallel_layout="Et*3|t*3L")
    assert (chunk_layer_counts(laid) == chunk_layer_counts(even)).all()
    assert simulate(laid).step_time_s == pytest.approx(simulate(even).step_time_s, rel=1e-12)


def test_layout_counting_embedding_and_loss_is_megatrons_uneven_split():
    flags = build_config(SMALL, num_layers=6, pp=4, account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True)
    laid = build_config(SMALL, num_layers=6, pp=4, pipeline_model_parallel_layout="Et|tt|tt|tL")
    assert chunk_layer_counts(laid).ravel().tolist() == chunk_layer_counts(flags).ravel().tolist() == [1, 2, 2, 1]
    assert simulate(laid).step_time_s == pytest.approx(simulate(flags).step_time_s, rel=1e-12)


def test_moving_layers_moves_memory_and_mtp_joins_the_last_stage():
    light_first = simulate(build_config(MOE, pp=2, pipeline_model_parallel_layout="Et|t*5L"))
    heavy_first = simulate(build_config(MOE, pp=2, pipeline_model_parallel_layout="Et*5|tL"))
    assert light_first.stages[0].memory_bytes < heavy_first.stages[0].memory_bytes
    assert light_first.stages[1].memory_bytes > heavy_first.stages[1].memory_bytes
    assert light_first.stages[1].compute_s > heavy_first.stages[1].compute_s
    mtp = build_config(MOE, pp=2, mtp_num_layers=1, pipeline_model_parallel_layout="Et*3|t*3mL")
    counts, moe = chunk_layer_counts(mtp, with_moe=True)
    assert counts.ravel().tolist() == moe.ravel().tolist() == [3, 4]  # the MTP layer is a MoE layer here


@pytest.mark.parametrize("extra, rule", [
    (dict(pipeline_model_parallel_layout="Et*3|t*3|L"), "stages"),
    (dict(pipeline_model_parallel_layout="Et*3|t*2L"), "num_layers transformer layers"),
    (dict(pipeline_model_parallel_layout="tEt*2|t*3L"), "one embedding"),
    (dict(pipeline_model_parallel_layout="Et*3L|t*3"), "one loss"),
    (dict(pipeline_model_parallel_layout="Et*3|t*3mL"), "mtp_num_layers"),
    (dict(pipeline_model_parallel_layout="Et*3m|t*3L", mtp_num_layers=1), "all in the last stage"),
    (dict(pipeline_model_parallel_layout="Et*3|x*3L"), "may hold only"),
    (dict(pipeline_model_parallel_layout="Et*3|t*3L", account_for_loss_in_pipeline_split=True), "replaces"),
    (dict(pipeline_model_parallel_layout="Et*3|t*3L", pipeline_layer_split="balanced"), "replaces"),
])
def test_layout_rules_name_the_field(extra, rule):
    with pytest.raises(ConfigError, match="pipeline_model_parallel_layout") as err:
        build_config(SMALL, pp=2, **extra)
    assert rule in str(err.value)


def test_layout_from_megatron_arguments_and_the_cli():
    from flowsim.config.importers import from_megatron_args

    args = ("--num-layers 6 --hidden-size 1024 --num-attention-heads 8 --bf16 --seq-length 1024 --vocab-size 32000 "
            "--pipeline-model-parallel-size 2").split() + ["--pipeline-model-parallel-layout", "Et|t*5L"]
    assert from_megatron_args(args).config["training"]["pipeline_model_parallel_layout"] == "Et|t*5L"
    base = ["estimate", "--model", "llama2-7b", "--cluster", "dgx-h100", "--gpus", "8", "--pp", "2"]
    ok = CliRunner().invoke(main, base + ["--set", "pipeline_model_parallel_layout=Et*8|t*24L", "--json"])
    assert ok.exit_code == 0, ok.output
    text = CliRunner().invoke(main, base + ["--set", "pipeline_model_parallel_layout=Et*8|t*24L"])
    assert "pipeline layout Et*8|t*24L (E embedding, t layer" in text.output
    bad = CliRunner().invoke(main, base + ["--set", "pipeline_model_parallel_layout=Et*8|t*23L"])
    assert bad.exit_code == 2 and bad.output.startswith("Error: pipeline_model_parallel_layout: must hold "
                                                        "num_layers") and bad.output.count("\n") == 1, bad.output


BRIDGE = """
model:
  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
  num_layers: 6
  hidden_size: 1024
  ffn_hidden_size: 4096
  num_attention_heads: 8
  seq_length: 1024
  vocab_size: 32000
  pipeline_model_parallel_size: 2
  pipeline_model_parallel_layout: LAYOUT
  bf16: true
train:
  global_batch_size: 16
  micro_batch_size: 1
"""


@pytest.mark.parametrize("layout, text", [
    ('"Et|t*5L"', "Et|t*5L"),
    ("[[embedding, decoder], [decoder, decoder, decoder, decoder, decoder, loss]]", "Et|tttttL"),
])
def test_layout_from_a_bridge_recipe(tmp_path, layout, text):
    from flowsim.config.importers import from_nemo

    path = tmp_path / "recipe.yaml"
    path.write_text(BRIDGE.replace("LAYOUT", layout))
    imported = from_nemo(path)
    assert imported.config["training"]["pipeline_model_parallel_layout"] == text
    cfg = build_config(imported.config, gpu="h100-sxm", num_gpus=8)
    assert chunk_layer_counts(cfg).ravel().tolist() == [1, 5]
    path.write_text(BRIDGE.replace("LAYOUT", "[[embedding, decoder], [decoder, mamba, loss]]"))
    with pytest.raises(ConfigError, match="pipeline_model_parallel_layout: layer names must be"):
        from_nemo(path)
