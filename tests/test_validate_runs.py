"""The validation loop over runs-schema-v1 CSVs: reading, row mapping, skip rules, arithmetic and the CLI.

A stand-in ``simulate`` returns known step times, so the error arithmetic is checked exactly; accuracy of
the real simulator is reported by ``flowsim validate`` and never asserted here.
"""
import csv
import json
import math
import re
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import flowsim
from flowsim.errors import ConfigError
from flowsim.validation.runs import (REQUIRED_COLUMNS, ErrorSummary, read_runs, row_to_config, summarize,
                                     validate_runs)
from flowsim.validation.runs_compare import spearman

RUNS = "curated/training_runs_public.csv"

BASE_ROW = {
    "id": 1, "source": "test", "model": "m1", "num_layers": 4, "hidden_size": 1024, "ffn_hidden_size": 4096,
    "num_attention_heads": 16, "num_query_groups": 16, "kv_channels": 64, "seq_length": 2048,
    "vocab_size": 51200, "gated_mlp": 0, "moe_num_experts": 0, "moe_topk": 0, "moe_ffn_hidden_size": 0,
    "moe_shared_experts": 0, "ep": 1, "global_batch_size": 64, "micro_batch_size": 1,
    "gpu": "h100-sxm", "num_gpus": 8, "gpus_per_node": 8, "nic_gbps_per_gpu": 400, "tp": 1, "pp": 1, "vpp": 1,
    "dp": 8, "cp": 1, "sp": 0, "zero_stage": 1, "distributed_optimizer": 1, "recompute": "none",
    "precision": "bf16", "measured_step_time_s": 1.0,
}


class FakeSimulate:
    """Stand-in for flowsim.simulate: step time looked up by model name; records every config."""

    def __init__(self, step_by_model=None, reject=(), crash=()):
        self.step_by_model = step_by_model or {}
        self.reject, self.crash = set(reject), set(crash)
        self.configs = []

    def __call__(self, cfg):
        self.configs.append(cfg)
        if cfg.model.name in self.reject:
            raise ConfigError("pipeline_schedule", "not supported by the stand-in", cfg.model.name)
        if cfg.model.name in self.crash:
            raise ZeroDivisionError("a bug in the stand-in")
        # Default: a step time that grows with the work per GPU, so Spearman is defined.
        step = self.step_by_model.get(cfg.model.name,
                                      cfg.model.num_layers * cfg.training.global_batch_size / cfg.cluster.num_gpus)
        return SimpleNamespace(step_time_s=step, fits_memory=True)


def write_runs(path, rows, columns=REQUIRED_COLUMNS):
    """Write ``rows`` (dicts over BASE_ROW) as a runs CSV with ``columns`` in that order."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        for r in rows:
            full = {**BASE_ROW, **r}
            w.writerow(["" if full.get(c) is None else full.get(c, "") for c in columns])
    return path


def shared_ids(shared_data):
    with open(shared_data / RUNS, newline="") as fh:
        return [int(r["id"]) for r in csv.DictReader(fh)]


# ---------------------------------------------------------------- arithmetic

def test_summarize_known_answers():
    # errors: +10, -10, +25, 0 %  ->  |e| sorted = 0, 10, 10, 25
    s = summarize([1.1, 1.8, 5.0, 5.0], [1.0, 2.0, 4.0, 5.0])
    assert s.n == 4
    assert s.median_abs_error_pct == pytest.approx((10 + 10) / 2)
    assert s.mape_pct == pytest.approx((10 + 10 + 25 + 0) / 4)
    # numpy's linear percentile: position 0.9 * (4 - 1) = 2.7 between 10 and 25
    assert s.p90_abs_error_pct == pytest.approx(10 + 0.7 * (25 - 10))
    # ranks: predicted (1, 2, 3.5, 3.5), measured (1, 2, 3, 4); Pearson of the ranks
    # deviations (-1.5, -0.5, 1, 1) and (-1.5, -0.5, 0.5, 1.5): cov 4.5, var 4.5 and 5
    assert s.spearman == pytest.approx(4.5 / math.sqrt(4.5 * 5))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.floats(0.1, 100.0)), min_size=2, max_size=40))
def test_spearman_is_scipys(pairs):
    from scipy import stats

    a, b = (np.array(x, dtype=float) for x in zip(*pairs))  # small integers in a: many ties
    if np.ptp(a) > 0 and np.ptp(b) > 0:
        assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)


def test_summarize_empty_and_single():
    empty = summarize([], [])
    assert empty.n == 0 and math.isnan(empty.median_abs_error_pct) and math.isnan(empty.spearman)
    one = summarize([2.0], [1.0])
    assert one == ErrorSummary(1, 100.0, 100.0, 100.0, one.spearman) and math.isnan(one.spearman)


def test_validate_runs_arithmetic_with_fake(tmp_path):
    measured = [1.0, 2.0, 4.0, 5.0]
    predicted = [1.1, 1.8, 5.0, 5.0]
    rows = [{"id": i + 1, "model": f"m{i + 1}", "measured_step_time_s": m,
             "source": "a" if i < 2 else "b"} for i, m in enumerate(measured)]
    fake = FakeSimulate({f"m{i + 1}": p for i, p in enumerate(predicted)})
    report = validate_runs(write_runs(tmp_path / "runs.csv", rows), simulate=fake)

    assert [r.id for r in report.rows] == [1, 2, 3, 4]
    assert [r.error_pct for r in report.rows] == pytest.approx([10.0, -10.0, 25.0, 0.0])
    assert report.summary == summarize(predicted, measured)
    assert report.summary.median_abs_error_pct == pytest.approx(10.0)
    assert report.by_source["a"].n == 2 and report.by_source["a"].median_abs_error_pct == pytest.approx(10.0)
    assert report.by_source["b"].median_abs_error_pct == pytest.approx((25.0 + 0.0) / 2)
    assert report.skipped == ()
    assert report.to_frame().loc[3, "error_pct"] == pytest.approx(25.0)


def test_to_dict_keys(tmp_path):
    rows = [{"id": 1}, {"id": 2, "model": "m2", "measured_step_time_s": 3.0}, {"id": 3, "moe_num_experts": 8}]
    d = validate_runs(write_runs(tmp_path / "runs.csv", rows), simulate=FakeSimulate()).to_dict()
    assert set(d) == {"rows", "summary", "skipped"}
    assert set(d["summary"]) == {"n", "median_abs_error_pct", "mape_pct", "p90_abs_error_pct", "spearman"}
    assert {"id", "predicted_step_time_s", "measured_step_time_s", "error_pct", "assumptions"} <= set(d["rows"][0])
    assert d["skipped"] == [{"id": 3, "reason": "moe_router_topk: must be a positive integer (got 0)"}]
    json.dumps(d)


# ---------------------------------------------------------------- the shared CSV

def test_every_shared_row_runs_or_is_skipped_with_a_reason(shared_data):
    report = validate_runs(shared_data / RUNS, simulate=FakeSimulate())
    ids = shared_ids(shared_data)
    done = [r.id for r in report.rows] + [s.id for s in report.skipped]
    assert sorted(done) == sorted(ids)
    assert all(s.reason for s in report.skipped)
    reasons = {s.id: s.reason for s in report.skipped}
    assert reasons[20] == "tp: empty in the runs CSV; needed to simulate the row"
    assert 63 not in reasons  # MoE rows run (DeepSeek-V3 with MLA and 3 dense layers from its notes)
    assert reasons[205] == "no measured step time"
    assert report.summary.n == len(report.rows) > 0


def v1_copy(shared_data, path):
    """The shared runs CSV without its schema v2 columns (what a runs-schema-v1 file holds)."""
    with open(shared_data / RUNS, newline="") as fh:
        rows = list(csv.reader(fh))
    keep = rows[0].index("notes") + 1
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(r[:keep] for r in rows)
    return path


def test_shared_rows_record_their_assumptions(shared_data, tmp_path):
    # the rules for settings the v1 schema has no column for (tests/test_runs_v2.py: the v2 columns)
    rows = {r.id: r for r in validate_runs(v1_copy(shared_data, tmp_path / "v1.csv"), simulate=FakeSimulate()).rows}
    assert rows[1].assumptions == ("micro_batch_size: empty, assumed 1",
                                   "attention: unfused (the source, 2021, predates FlashAttention)")
    assert "tp_comm_overlap: on (stated in the source notes)" in rows[211].assumptions
    assert rows[72].assumptions[-1] == "pipeline split: embedding and loss count as layers (Megatron-LM recipe)"
    assert rows[209].assumptions[-1] == "pipeline split: balanced (layers do not divide into pp*vpp stages)"
    assert rows[5].assumptions[0] == ("vpp: empty, with pp=2 the source ran an interleaved schedule of unknown "
                                      "degree; simulated as 1F1B (vpp=1)")
    assert "recompute: empty, assumed none" in rows[28].assumptions
    assert rows[175].assumptions == ("nic_gbps_per_gpu: empty, assumed 400 (cluster preset dgx-h100)",)
    assert rows[183].assumptions == ("nic_gbps_per_gpu: empty, unused (single-node job)",)
    assert rows[137].assumptions == ("kernels: eager PyTorch (stated in the source notes)",
                                     "recompute: torchtitan op-level selective policy (not stated; the setting of "
                                     "torchtitan's llama3 8B recipe)")
    assert "kernels: eager PyTorch (torchtitan without torch.compile, its default)" in rows[169].assumptions
    # selective recompute outside Megatron is the source's own policy
    assert rows[169].assumptions[-1] == ("recompute: every 2nd block fully recomputed (n not stated; "
                                         "torchtitan's default option 2)")
    assert "recompute: torchtitan op-level selective policy (stated in the notes)" in rows[161].assumptions
    assert not any("policy" in a or "block fully" in a for a in rows[72].assumptions)  # Megatron: its own
    # torchtitan with pp: one micro-batch per stage by default, FSDP kept gathered, gradients reduced at the end
    assert rows[149].assumptions[:2] == (
        "micro_batch_size: empty, assumed 4 (torchtitan's default: 8 micro-batches, one per stage)",
        "fsdp with pp: torchtitan keeps parameters gathered after forward and reduce-scatters gradients after "
        "the last backward (zero_stage 2, no overlap)")
    runs, _ = read_runs(shared_data / RUNS)
    t = flowsim.build_config(row_to_config(runs[runs["id"] == 149].iloc[0])[0]).training
    assert (t.micro_batch_size, t.zero_stage, t.overlap_grad_reduce) == (4, 2, False)
    assert not any(a.startswith("kernels:") for a in rows[138].assumptions)  # torch.compile


def test_gb200_row_maps_to_nvl72(shared_data):
    runs, _ = read_runs(shared_data / RUNS)
    row = runs[runs["id"] == 57].iloc[0]
    cfg = flowsim.build_config(row_to_config(row)[0])
    c = cfg.cluster
    assert (c.gpu, c.num_gpus, c.gpus_per_node, c.nvlink_domain, c.nics_per_node, c.nic_gbps, c.cpu) == \
        ("gb200", 8, 4, 72, 4, 400.0, "arm")


# ---------------------------------------------------------------- row mapping

def test_row_to_config_model_styles():
    gpt, _ = row_to_config(BASE_ROW)
    assert {k: gpt["model"][k] for k in ("activation", "normalization", "position_embedding", "add_bias_linear",
                                         "untie_embeddings_and_output_weights")} == \
        {"activation": "gelu", "normalization": "layernorm", "position_embedding": "learned",
         "add_bias_linear": True, "untie_embeddings_and_output_weights": False}
    llama, _ = row_to_config({**BASE_ROW, "gated_mlp": 1, "num_query_groups": 4})
    assert {k: llama["model"][k] for k in ("activation", "normalization", "position_embedding",
                                           "add_bias_linear", "untie_embeddings_and_output_weights",
                                           "num_query_groups")} == \
        {"activation": "swiglu", "normalization": "rmsnorm", "position_embedding": "rope",
         "add_bias_linear": False, "untie_embeddings_and_output_weights": True, "num_query_groups": 4}


def test_row_to_config_training_and_defaults():
    nan = float("nan")
    mapping, assumptions = row_to_config({**BASE_ROW, "tp": 2, "pp": 2, "dp": 2, "vpp": nan, "sp": nan,
                                          "micro_batch_size": nan, "recompute": "", "zero_stage": 0})
    t = mapping["training"]
    assert (t["virtual_pipeline_model_parallel_size"], t["sequence_parallel"], t["micro_batch_size"],
            t["recompute_granularity"], t["use_distributed_optimizer"], t["zero_stage"]) == \
        (1, True, 1, "none", True, 1)
    assert [a.split(":")[0] for a in assumptions] == ["vpp", "sp", "micro_batch_size", "recompute"]
    cfg = flowsim.build_config(mapping)
    assert (cfg.training.tp, cfg.training.pp, cfg.training.dp, cfg.num_microbatches) == (2, 2, 2, 32)


def test_row_to_config_empty_nic():
    nan = float("nan")
    mapping, assumptions = row_to_config({**BASE_ROW, "num_gpus": 16, "dp": 16, "nic_gbps_per_gpu": nan,
                                          "gpu": "a100-sxm4-80gb"})
    assert mapping["cluster"]["nic_gbps"] == 200
    assert assumptions == ("nic_gbps_per_gpu: empty, assumed 200 (cluster preset dgx-a100)",)
    with pytest.raises(ConfigError, match=r"^nic_gbps_per_gpu: empty in the runs CSV and no built-in cluster "
                                          r"preset uses this GPU to assume it from \(got l40s\)$"):
        row_to_config({**BASE_ROW, "num_gpus": 16, "dp": 16, "nic_gbps_per_gpu": nan, "gpu": "l40s"})


# ---------------------------------------------------------------- malformed input

def test_malformed_rows_are_reported_and_skipped(tmp_path):
    path = write_runs(tmp_path / "runs.csv", [{"id": 1}, {"id": 2, "tp": "two"}, {"id": 3, "gpu": "tpu-v9"},
                                              {"id": 5, "model": "m5", "measured_step_time_s": 2.0}])
    with open(path, "a", newline="") as fh:
        fh.write("4,too,few,fields\n")
        fh.write("x" + ",".join([""] * len(REQUIRED_COLUMNS)) + "\n")
    report = validate_runs(path, simulate=FakeSimulate())
    assert [r.id for r in report.rows] == [1, 5]
    assert [(s.id, s.reason) for s in report.skipped] == [
        (2, "line 3: tp: must be a finite number (got 'two')"),
        (4, f"line 6: has 4 fields, the header has {len(REQUIRED_COLUMNS)}"),
        (None, "line 7: id: must be an integer (got 'x')"),
        (3, "no GPU spec for 'tpu-v9'"),
    ]


def test_rows_that_build_config_or_simulate_reject_are_skipped(tmp_path):
    rows = [{"id": 1, "num_attention_heads": 12, "num_query_groups": 12, "tp": 8, "dp": 1},
            {"id": 2, "model": "m2"}, {"id": 3, "model": "m3", "measured_step_time_s": ""},
            {"id": 4, "model": "m4", "measured_step_time_s": 0}, {"id": 5, "model": "m5"}]
    report = validate_runs(write_runs(tmp_path / "runs.csv", rows), simulate=FakeSimulate(reject={"m2"}))
    assert [r.id for r in report.rows] == [5]
    assert [(s.id, s.reason) for s in report.skipped] == [
        (1, "num_attention_heads: must be divisible by tensor_model_parallel_size (got 12 and 8)"),
        (2, "pipeline_schedule: not supported by the stand-in (got m2)"),
        (3, "no measured step time"),
        (4, "measured_step_time_s: must be > 0 (got 0)"),
    ]


def test_rows_with_the_same_cells_or_config_are_simulated_once(tmp_path):
    rows = [{"id": 1, "model": "m1", "measured_step_time_s": 1.0},
            {"id": 2, "model": "m1", "measured_step_time_s": 2.0},  # same cells but id and measurement
            {"id": 3, "model": "m1", "source": "other", "measured_step_time_s": 4.0},  # same config
            {"id": 4, "model": "m2"}]
    fake = FakeSimulate({"m1": 2.0, "m2": 3.0})
    report = validate_runs(write_runs(tmp_path / "runs.csv", rows), simulate=fake)
    assert [c.model.name for c in fake.configs] == ["m1", "m2"]
    assert [(r.id, r.predicted_step_time_s, r.error_pct) for r in report.rows] == [
        (1, 2.0, 100.0), (2, 2.0, 0.0), (3, 2.0, -50.0), (4, 3.0, 200.0)]


class WarningSimulate(FakeSimulate):
    """FakeSimulate that warns once per model, as the kernel model does for a release without measurements."""

    def __call__(self, cfg):
        warnings.warn(f"stand-in warning for {cfg.model.name}", UserWarning)
        return super().__call__(cfg)


def test_jobs_pass_the_workers_warnings_on(tmp_path):
    rows = [{"id": i, "model": f"m{i % 3}", "num_layers": 4 + i} for i in range(1, 30)]
    path = write_runs(tmp_path / "runs.csv", rows)
    seen = {}
    for jobs in (1, 2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            validate_runs(path, simulate=WarningSimulate(), jobs=jobs)
        seen[jobs] = {str(w.message) for w in caught}
    assert seen[2] == seen[1] == {f"stand-in warning for m{i}" for i in range(3)}


def test_jobs_give_the_in_process_report_and_name_unexpected_errors(tmp_path):
    rows = [{"id": i, "model": f"m{i % 5}", "num_layers": 4 + i, "measured_step_time_s": 1.0 + i}
            for i in range(1, 40)] + [{"id": 40, "model": "m1", "tp": 3, "dp": 1, "num_gpus": 3}]
    path = write_runs(tmp_path / "runs.csv", rows)
    fake = FakeSimulate(reject={"m2"}, crash={"m3"})
    one, two = (validate_runs(path, simulate=fake, jobs=jobs) for jobs in (1, 2))
    assert one == two and len(one.rows) == 23 and len(one.skipped) == 17  # m2, m3 and id 40 skipped
    reasons = {s.id: s.reason for s in one.skipped}
    assert reasons[3] == "ZeroDivisionError: a bug in the stand-in"
    assert reasons[2] == "pipeline_schedule: not supported by the stand-in (got m2)"
    assert reasons[40].startswith("num_attention_heads: must be divisible by tensor_model_parallel_size")


def test_missing_column_and_unreadable_file(tmp_path):
    columns = [c for c in REQUIRED_COLUMNS if c != "tp"]
    path = write_runs(tmp_path / "runs.csv", [{"id": 1}], columns=columns)
    with pytest.raises(ConfigError, match=rf"^tp: required column of runs schema v1 is missing "
                                          rf"\(got {re.escape(str(path))}\)$"):
        read_runs(path)
    with pytest.raises(ConfigError, match=r"^runs: cannot read file: No such file or directory"):
        read_runs(tmp_path / "absent.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ConfigError, match=r"^runs: file is empty"):
        read_runs(tmp_path / "empty.csv")


def test_other_csv_in_the_same_schema(tmp_path):
    # Columns in another order, an extra column, quoted text with a comma, other models and GPUs.
    columns = ["notes", *reversed(REQUIRED_COLUMNS)]
    rows = [{"id": 101, "model": "tiny, llama-style", "gated_mlp": 1, "num_query_groups": 4, "gpu": "a100-sxm4-80gb",
             "nic_gbps_per_gpu": 200, "notes": "made up"},
            {"id": 102, "model": "two nodes", "gpu": "b200", "num_gpus": 16, "dp": 8, "tp": 2, "sp": 1,
             "recompute": "selective", "precision": "fp8"}]
    fake = FakeSimulate({"tiny, llama-style": 1.5, "two nodes": 0.5})
    report = validate_runs(write_runs(tmp_path / "runs.csv", rows, columns=columns), simulate=fake)
    assert [(r.id, r.model, r.layout, r.error_pct) for r in report.rows] == [
        (101, "tiny, llama-style", "1/1/8/1", pytest.approx(50.0)),
        (102, "two nodes", "2/1/8/1", pytest.approx(-50.0))]
    assert fake.configs[1].training.recompute_granularity == "selective"
    assert fake.configs[1].training.precision == "fp8"


def test_only_ids(tmp_path):
    path = write_runs(tmp_path / "runs.csv", [{"id": 1}, {"id": 2}, {"id": 3, "moe_num_experts": 4}])
    report = validate_runs(path, simulate=FakeSimulate(), only_ids=[2, 3])
    assert [r.id for r in report.rows] == [2] and [s.id for s in report.skipped] == [3]
    with pytest.raises(ConfigError, match=r"^only_ids: not in the runs file \(got 7, 9\)$"):
        validate_runs(path, simulate=FakeSimulate(), only_ids=[1, 9, 7])


# ---------------------------------------------------------------- CLI

@pytest.fixture
def cli(monkeypatch):
    """Invoke ``flowsim`` with the stand-in simulator as flowsim.step.simulate."""
    from flowsim.cli import main

    monkeypatch.setattr("flowsim.step.simulate.simulate", FakeSimulate())
    runner = CliRunner()
    return lambda *args: runner.invoke(main, list(args))


def test_cli_table(cli, shared_data):
    res = cli("validate", str(shared_data / RUNS))
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split()[:6] == ["id", "model", "gpu", "GPUs", "tp/pp/dp/cp", "predicted"]
    assert any(line.startswith("median |error| ") and "MAPE" in line and "Spearman" in line for line in lines)
    assert "per source:" in lines
    assert "  id 205: no measured step time" in lines


def test_cli_json(cli, shared_data):
    res = cli("validate", str(shared_data / RUNS), "--json", "--only-ids", "1,205")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert set(d) == {"schema_version", "flowsim_version", "rows", "summary", "skipped"}
    assert [r["id"] for r in d["rows"]] == [1]
    assert {"id", "predicted_step_time_s", "measured_step_time_s", "error_pct"} <= set(d["rows"][0])
    assert d["summary"]["n"] == 1 and d["summary"]["spearman"] is None
    assert d["skipped"] == [{"id": 205, "reason": "no measured step time"}]


def test_cli_bad_input_exits_2(cli, tmp_path):
    res = cli("validate", str(tmp_path / "absent.csv"))
    assert res.exit_code == 2
    assert res.output.startswith("Error: runs: cannot read file: No such file or directory")
    assert len(res.output.strip().splitlines()) == 1
    columns = [c for c in REQUIRED_COLUMNS if c != "measured_step_time_s"]
    path = write_runs(tmp_path / "runs.csv", [{"id": 1}], columns=columns)
    res = cli("validate", str(path))
    assert res.exit_code == 2
    assert res.output == f"Error: measured_step_time_s: required column of runs schema v1 is missing (got {path})\n"
    res = cli("validate", str(path), "--only-ids", "1,x")
    assert res.exit_code == 2
    assert res.output == "Error: --only-ids: must be comma-separated integer row ids (got 1,x)\n"


# ---------------------------------------------------------------- the real simulator (no accuracy asserted)

def test_real_simulate_on_shared_rows(shared_data):
    # One GPT-style A100 row, one Llama-style H100 row and one GB200 NVL72 row.
    report = validate_runs(shared_data / RUNS, only_ids=[1, 32, 57])
    assert [r.id for r in report.rows] == [1, 32, 57]
    assert all(math.isfinite(r.predicted_step_time_s) and r.predicted_step_time_s > 0 for r in report.rows)


def test_cli_report_option_writes_the_accuracy_report(cli, shared_data, tmp_path):
    pytest.importorskip("matplotlib")
    res = cli("validate", str(shared_data / RUNS), "--only-ids", "1", "--report", str(tmp_path / "rep"))
    assert res.exit_code == 0, res.output
    text = (tmp_path / "rep" / "ACCURACY.md").read_text()
    assert text.startswith("# flowsim accuracy") and "SimAI-Analytical compatibility: 7,545,619 us" in text
    assert (tmp_path / "rep" / "img" / "step_time_scatter.png").stat().st_size > 0
