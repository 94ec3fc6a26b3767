"""Framework profiles (flowsim.config.profiles): sourced defaults per release, explicit keys win, bad names."""
import csv
import json
from importlib import resources

import pytest
from click.testing import CliRunner

import flowsim
from flowsim.cli import main
from flowsim.errors import ConfigError
from flowsim.config.profiles import PROFILE_KEYS, frameworks, nearest_release, profile, release_line, releases
from flowsim.errors import FlowsimWarning

BASE = {"model": "gpt3-175b", "cluster": "dgx-h100", "gpus": 64, "tp": 8, "pp": 8}


def _file_rows():
    text = resources.files("flowsim.config").joinpath("data/framework_profiles.csv").read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


def test_every_default_cites_a_source():
    for row in _file_rows():
        for col in PROFILE_KEYS:
            if row[col].strip():
                # each filled column is named in the row's sources (alone or in a group like "a/b")
                assert col in row["sources"] or "overlap" in col and "overlap" in row["sources"] \
                    or "dropout" in col and "dropout" in row["sources"], (row["framework_version"], col)


def test_frameworks_and_releases():
    assert set(frameworks()) >= {"megatron-lm", "megatron-core", "megatron-deepspeed", "deepspeed", "torchtitan",
                                 "pytorch-fsdp", "llm-foundry"}
    assert releases("nemo") == releases("megatron-core")
    assert profile("megatron-bridge").framework_version == releases("megatron-core")[-1]  # newest by default


def test_profile_fills_what_the_config_does_not_set():
    cfg = flowsim.build_config(BASE, framework="megatron-lm", framework_version="megatron-lm-2021-04")
    t, m = cfg.training, cfg.model
    assert not t.use_flash_attn and not t.overlap_grad_reduce and t.host_overhead == "megatron"
    assert m.attention_dropout == 0.1 and m.hidden_dropout == 0.1
    assert ("use_flash_attn", False) in cfg.framework_defaults


def test_explicit_keys_override_the_profile_and_the_profile_overrides_presets():
    cfg = flowsim.build_config(BASE, framework="torchtitan", use_flash_attn=False, overlap_grad_reduce=False)
    assert not cfg.training.use_flash_attn and not cfg.training.overlap_grad_reduce
    keys = dict(cfg.framework_defaults)
    assert "use_flash_attn" not in keys and "overlap_grad_reduce" not in keys
    # the gpt3-175b preset's hidden_dropout 0.1 describes the model; torchtitan runs without dropout
    assert keys["hidden_dropout"] == 0.0 and cfg.model.hidden_dropout == 0.0
    assert cfg.training.kernel_fusion == "eager" and cfg.training.grad_reduce_dtype == "fp32"


def test_no_framework_keeps_flowsims_defaults():
    cfg = flowsim.build_config(BASE)
    assert cfg.framework_defaults == () and cfg.training.host_overhead == "none"
    assert cfg.training.use_flash_attn and cfg.training.overlap_grad_reduce


def test_empty_cells_apply_nothing():
    p = profile("nemo", "nemo-24.07")  # dropout differs by model recipe in that release
    assert not any(key in ("hidden_dropout", "attention_dropout") for _, key, _ in p.defaults)


@pytest.mark.parametrize("bad, message", [
    ({"framework": "fastllm"}, "framework: unknown framework; known: megatron-lm"),
    ({"framework": "torchtitan", "framework_version": "torchtitan-nightly"},
     "framework_version: unknown release of torchtitan; known: torchtitan, torchtitan-2024-12"),
    ({"framework": "nemo", "framework_version": "25.02"}, "framework_version: unknown release of megatron-core"),
    ({"framework_version": "nemo-24.07"}, "framework_version: needs framework"),
    ({"grad_reduce_dtype": "fp8"}, "grad_reduce_dtype: must be one of fp32, bf16, fp16"),
    ({"cuda_graphs": "always"}, "cuda_graphs: must be one of none, layer, module, full_iteration"),
    ({"attention_dropout": 1.5}, "attention_dropout: must be in [0, 1)"),
])
def test_bad_input_names_the_key_and_the_allowed_values(bad, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        flowsim.build_config(BASE, **bad)


def test_estimate_prints_the_profile_and_its_defaults():
    args = ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp", "8",
            "--set", "framework=nemo", "--set", "framework_version=megatron-bridge-25.11",
            "--set", "overlap_param_gather=false"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("framework "))
    assert line.startswith("framework megatron-core megatron-bridge-25.11: profile defaults applied:")
    assert "grad_reduce_dtype=bf16" in line and "overlap_param_gather" not in line
    js = CliRunner().invoke(main, args + ["--json"])
    assert '"framework_defaults"' in js.output
    flags = CliRunner().invoke(main, args[:-6] + ["--framework", "megatron-lm", "--framework-version",
                                                  "megatron-lm-2021-04"])
    assert "framework megatron-lm megatron-lm-2021-04: profile defaults applied: use_flash_attn=false" in flags.output
    bad = CliRunner().invoke(main, args[:-6] + ["--set", "framework=deepspeed-x"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "framework: unknown framework" in bad.output


def test_pipeline_profiles_name_known_releases_and_cite_their_sources():
    from flowsim.config.profiles import PIPELINE_KEYS

    text = resources.files("flowsim.config").joinpath("data/pipeline_profiles.csv").read_text(encoding="utf-8")
    rows = list(csv.DictReader(text.splitlines()))
    assert {(r["framework"], r["framework_version"]) for r in rows} <= \
        {(r["framework"], r["framework_version"]) for r in _file_rows()}
    for r in rows:
        for col in PIPELINE_KEYS:
            if r[col].strip():
                assert col in r["sources"], (r["framework_version"], col)
        cfg = flowsim.build_config(BASE, framework=r["framework"], framework_version=r["framework_version"])
        assert cfg.training.pipeline_engine == r["pipeline_engine"]  # every value is one the config accepts
    old = flowsim.build_config(BASE, framework="megatron-lm", framework_version="megatron-lm-2021-04").training
    assert old.p2p_sync == "on" and old.syncs_p2p and old.pipeline_engine == "megatron"
    bloom = flowsim.build_config(BASE, framework="megatron-deepspeed").training
    assert not bloom.syncs_p2p and bloom.pipeline_engine == "deepspeed-0.6"
    # Megatron-Bridge batches (and so synchronizes) the pipeline transfers only without virtual pipelining
    bridge = dict(BASE, framework="megatron-bridge", framework_version="megatron-bridge-25.11")
    assert flowsim.build_config(bridge).training.syncs_p2p
    assert not flowsim.build_config(bridge, gbs=64, vpp=2).training.syncs_p2p
    assert flowsim.build_config(BASE, framework="megatron-deepspeed", pipeline_engine="megatron").training \
        .pipeline_engine == "megatron"  # an explicit key wins


@pytest.mark.parametrize("bad, message", [
    ({"pipeline_engine": "pipedream"}, "pipeline_engine: must be one of megatron, deepspeed, deepspeed-0.6"),
    ({"p2p_sync": "sometimes"}, "p2p_sync: must be one of off, on, batched"),
])
def test_bad_pipeline_settings_name_the_key(bad, message):
    with pytest.raises(ConfigError, match=message):
        flowsim.build_config(BASE, **bad)


def test_deepspeed_engine_runs_1f1b_only():
    with pytest.raises(ConfigError, match="pipeline_engine: deepspeed's TrainSchedule runs the 1f1b order"):
        flowsim.simulate(BASE, gbs=64, vpp=2, framework="megatron-deepspeed")


def test_release_lines_and_the_nearest_listed_release():
    assert release_line("nemo-24.03.01") == ("nemo-", (24, 3, 1))
    assert release_line("mlperf-v3.1-nemo") == ("mlperf-v", (3, 1))
    assert release_line("torchtitan") == ("torchtitan", ())
    known = ["nemo-24.03.01", "nemo-24.07", "megatron-bridge-25.09", "megatron-bridge-25.11"]
    assert nearest_release("nemo-24.12", known) == ("nemo-24.07", "older")  # newest not newer
    assert nearest_release("nemo-24.07.01", known) == ("nemo-24.07", "older")
    assert nearest_release("megatron-bridge-25.07", known) == ("megatron-bridge-25.09", "newer")  # none older
    assert nearest_release("megatron-bridge-26.01", known) == ("megatron-bridge-25.11", "older")
    assert nearest_release("nemo", known) is None and nearest_release("hybrid-1.0", known) is None


def test_an_unlisted_release_takes_its_lines_nearest_profile_and_calibration():
    with pytest.warns(FlowsimWarning, match="framework_version nemo-24.12: no profile of this release; using "
                                            "nemo-24.07, the nearest older release of its line"):
        cfg = flowsim.build_config(BASE, framework="nemo", framework_version="nemo-24.12")
    listed = flowsim.build_config(BASE, framework="nemo", framework_version="nemo-24.07")
    assert cfg.training == listed.training  # the release's defaults, kernel stack and calibration family


def test_validate_maps_an_unlisted_release_of_a_row_to_its_nearest_profile(tmp_path, shared_data):
    with open(shared_data / "curated" / "training_runs_public.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    row = next(r for r in rows if r["framework_version"] == "nemo-24.07" and r["measured_step_time_s"])
    out = {}
    for version in ("nemo-24.07", "nemo-24.12"):
        path = tmp_path / f"{version}.csv"
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            writer.writeheader()
            writer.writerow({**row, "framework_version": version})
        res = CliRunner().invoke(main, ["validate", str(path), "--json"])
        assert res.exit_code == 0, res.output
        out[version] = json.loads(res.stdout)["rows"][0]
    assert out["nemo-24.12"]["predicted_step_time_s"] == out["nemo-24.07"]["predicted_step_time_s"]
    assert any("no flowsim profile of nemo-24.12; the nearest release of its line, nemo-24.07" in a
               for a in out["nemo-24.12"]["assumptions"])


def test_a_bare_framework_name_as_release_takes_the_frameworks_newest_profile():
    from flowsim.config.profiles import find_release

    with pytest.warns(FlowsimWarning, match="framework_version megatron-deepspeed names no release; using "
                                            "megatron-deepspeed-bigscience"):
        assert find_release("megatron-deepspeed").framework_version == "megatron-deepspeed-bigscience"
    with pytest.warns(FlowsimWarning, match="names no release"):
        assert find_release("nemo") == profile("megatron-core")  # an alias: the newest release
    assert find_release("torchtitan").framework_version == "torchtitan"  # a listed bare name is itself
    assert find_release("fsdp") is None
