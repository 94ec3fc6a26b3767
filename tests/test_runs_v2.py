"""Runs schema v2 in validate: stated framework settings override the release's profile, empty cells take it."""
import flowsim
from flowsim.validation.runs import REQUIRED_COLUMNS, V2_SETTING_COLUMNS, row_to_config, validate_runs
from test_validate_runs import BASE_ROW, RUNS, FakeSimulate, write_runs

V2 = REQUIRED_COLUMNS + ("framework_version",) + V2_SETTING_COLUMNS


def _cfg(**cells):
    mapping, assumptions = row_to_config({**BASE_ROW, **cells})
    return flowsim.build_config(mapping), assumptions


def test_empty_cells_take_the_release_profile():
    cfg, assumptions = _cfg(framework="megatron-lm", framework_version="megatron-lm-2021-04")
    t = cfg.training
    assert (t.framework, t.framework_version) == ("megatron-lm", "megatron-lm-2021-04")
    assert not t.use_flash_attn and not t.overlap_grad_reduce and t.host_overhead == "megatron"
    assert cfg.model.attention_dropout == 0.1 and cfg.model.hidden_dropout == 0.1
    assert not any(a.startswith("settings from the row") for a in assumptions)


def test_stated_cells_override_the_profile():
    cfg, assumptions = _cfg(framework="megatron-lm", framework_version="megatron-lm-2021-04", attention_impl="flash",
                            hidden_dropout="0.0", overlap_grad_reduce="1", grad_reduce_dtype="fp16")
    t = cfg.training
    assert t.use_flash_attn and t.overlap_grad_reduce and t.grad_reduce_dtype == "fp16"
    assert cfg.model.hidden_dropout == 0.0 and cfg.model.attention_dropout == 0.1  # the latter from the profile
    assert "settings from the row: attention_impl=flash, hidden_dropout=0.0, overlap_grad_reduce=1, " \
           "grad_reduce_dtype=fp16" in assumptions
    keys = dict(cfg.framework_defaults)
    assert "use_flash_attn" not in keys and "hidden_dropout" not in keys and keys["attention_dropout"] == 0.1


def test_torch_compile_selects_compiled_kernels_over_the_torchtitan_heuristic():
    cfg, _ = _cfg(framework="torchtitan", framework_version="torchtitan-2024-12", torch_compile="1")
    assert cfg.training.kernel_fusion == "fused" and cfg.training.host_overhead == "compiled"
    cfg, _ = _cfg(framework="torchtitan", framework_version="torchtitan-2024-12", torch_compile="0")
    assert cfg.training.kernel_fusion == "eager" and cfg.training.host_overhead == "eager"


def test_the_fp8_recipe_named_in_the_notes_overrides_the_profile():
    release = dict(framework="torchtitan", framework_version="torchtitan-2024-12", precision="fp8")
    for notes, recipe in [("GA=8. FP8 current scaling (FP8-CS). DDP", "tensorwise"),
                          ("MXFP8 (32-element block scaling).", "mxfp8"),
                          ("precision detail: fp8 rowwise (Float8 linears via torchao)", "rowwise"),
                          ("FP8 fine-grained (1x128 / 128x128) scaling", "blockwise"),
                          ("FP8 = Transformer Engine delayed scaling.", "delayed")]:
        cfg, assumptions = _cfg(**release, notes=notes)
        assert cfg.training.fp8_recipe == recipe and f"fp8_recipe: {recipe} (from the notes)" in assumptions
    cfg, assumptions = _cfg(**release, notes="FP8 (recipe not stated in the table)")
    assert cfg.training.fp8_recipe == "tensorwise"  # torchtitan's profile: torchao's dynamic tensorwise default
    assert not any(a.startswith("fp8_recipe") for a in assumptions)
    cfg, _ = _cfg(**{**release, "precision": "bf16"}, notes="MXFP8 elsewhere in the source")
    assert cfg.training.fp8_recipe == "tensorwise"  # a bf16 row's notes do not set an FP8 recipe


def test_moe_architecture_facts_from_the_notes():
    moe = dict(moe_num_experts=256, moe_topk=8, moe_ffn_hidden_size=512, ep=8, num_layers=8)
    cfg, assumptions = _cfg(**moe, notes="DeepSeek-V3: MLA attention; QK-norm.")
    m = cfg.model
    assert (m.moe_router_num_groups, m.moe_router_group_topk, m.qk_layernorm) == (8, 4, True)
    assert "qk_layernorm: on (QK-norm in the notes)" in assumptions
    cfg, _ = _cfg(**{**moe, "moe_num_experts": 64}, notes="DeepSeek-V3: a different expert count")
    assert cfg.model.moe_router_num_groups == 0  # not DeepSeek-V3's router: no groups borrowed
    cfg, assumptions = _cfg(**moe, notes="alternating 128-token sliding-window / full attention layers, sinks")
    assert (cfg.model.window_size, cfg.model.window_attn_skip_freq) == (128, 2)
    cfg, _ = _cfg(**moe, notes="")
    assert (cfg.model.window_size, cfg.model.qk_layernorm, cfg.model.moe_router_num_groups) == (0, False, 0)


def test_a_release_without_a_profile_uses_the_row_only():
    cfg, assumptions = _cfg(framework="other", framework_version="hai-llm", overlap_param_gather="0")
    assert cfg.training.framework == "" and not cfg.training.overlap_param_gather
    assert "framework_version: no flowsim profile of hai-llm (settings from the row only)" in assumptions


def test_v1_rows_map_as_before():
    mapping, assumptions = row_to_config(BASE_ROW)
    assert "framework" not in mapping["training"] and not any("settings from" in a for a in assumptions)


def test_bad_cells_skip_their_row_with_a_one_line_reason(tmp_path):
    rows = [{"id": 1, "overlap_grad_reduce": 2}, {"id": 2, "attention_impl": "fast"},
            {"id": 3, "hidden_dropout": "1.5"}, {"id": 4, "framework_version": "megatron-lm-core_r0.8"}]
    report = validate_runs(write_runs(tmp_path / "runs.csv", rows, V2), simulate=FakeSimulate())
    assert [r.id for r in report.rows] == [4]
    assert [(s.id, s.reason) for s in report.skipped] == [
        (1, "overlap_grad_reduce: must be 0 or 1 (got 2)"),
        (2, "attention_impl: must be one of flash, unfused (got fast)"),
        (3, "hidden_dropout: must be a probability in [0, 1) (got 1.5)"),
    ]
    assert any(a.startswith("settings from the megatron-lm-core_r0.8 profile: use_flash_attn=True")
               for a in report.rows[0].assumptions)


def test_shared_rows_list_where_their_settings_came_from(shared_data):
    report = validate_runs(shared_data / RUNS, simulate=FakeSimulate())
    by_id = {r.id: r for r in report.rows}
    bloom = next(r for r in report.rows if r.source == "BLOOM176B_repo")
    assert any(a.startswith("settings from the row: attention_impl=unfused") for a in bloom.assumptions)
    assert any(a.startswith("settings from the megatron-deepspeed-bigscience profile") for a in bloom.assumptions)
    profiled = [r for r in by_id.values() if any("profile:" in a for a in r.assumptions)]
    assert len(profiled) > 140


def test_fp8_weight_all_gather_from_the_notes():
    cfg, assumptions = _cfg(framework="torchtitan", framework_version="torchtitan-2025-06", precision="fp8",
                            notes="precision detail: fp8 (float8 + fp8 all-gather)")
    assert cfg.training.fp8_param_gather and "fp8_param_gather: on (FP8 weight all-gather in the notes)" in assumptions
    cfg, _ = _cfg(framework="torchtitan", framework_version="torchtitan-2025-06", precision="fp8", notes="float8")
    assert not cfg.training.fp8_param_gather
