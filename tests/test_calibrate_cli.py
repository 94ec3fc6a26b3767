"""`flowsim calibrate` and `flowsim validate --calibration / --calibrate-on` through click's CliRunner."""
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.kernels.calibration import load_profile


@pytest.fixture(scope="module")
def small_runs(shared_data, tmp_path_factory):
    """Four H100 runs of each of two sources on 2024 Megatron-core releases (one parameter, two sources)."""
    runs = pd.read_csv(shared_data / "curated" / "training_runs_public.csv", keep_default_na=False, dtype=str)
    picked = pd.concat([runs[runs.source == s].head(4) for s in ("NeMo_24.07_perf_summary", "MegatronLM_README_H100")])
    path = tmp_path_factory.mktemp("runs") / "runs.csv"
    picked.to_csv(path, index=False)
    return path, runs


def test_calibrate_writes_a_profile_and_reports_errors(small_runs, tmp_path):
    path, _ = small_runs
    out = tmp_path / "profile.yaml"
    res = CliRunner().invoke(main, ["calibrate", str(path), "-o", str(out), "--grid", "3", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert {"parameters", "refused", "dropped", "errors"} <= set(report)
    assert report["errors"]["runs"] == 8
    kept = {p["family"] for p in report["parameters"]} | {k.split(":")[2] for k in report["dropped"]}
    assert kept == {"megatron-core-2024"}
    prof = load_profile(str(out))
    assert dict(prof.errors)["uncalibrated_median_pct"] == pytest.approx(report["errors"]["uncalibrated_median_pct"],
                                                                         abs=1e-3)


def test_calibrate_with_too_few_rows_is_one_line_exit_2(small_runs, tmp_path):
    path, runs = small_runs
    few = tmp_path / "few.csv"
    runs[runs.source == "NeMo_24.07_perf_summary"].head(2).to_csv(few, index=False)
    res = CliRunner().invoke(main, ["calibrate", str(few), "-o", str(tmp_path / "p.yaml"), "--grid", "3"])
    assert res.exit_code == 2
    assert res.output.startswith("Error: runs: too few rows to fit") and res.output.count("\n") == 1


def test_validate_with_a_profile_and_the_transfer_check(small_runs):
    path, _ = small_runs
    res = CliRunner().invoke(main, ["validate", str(path), "--calibration", "default", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["summary"]["n"] == 8
    res = CliRunner().invoke(main, ["validate", str(path), "--calibrate-on", "0,3"])
    assert res.exit_code == 0, res.output
    assert "k=3: |error| % (n)" in res.output and "NeMo_24.07_perf_summary" in res.output
    res = CliRunner().invoke(main, ["validate", str(path), "--calibrate-on", "-1"])
    assert res.exit_code == 2 and "--calibrate-on: must be comma-separated run counts >= 0" in res.output


def test_validate_with_a_bad_profile_is_one_line_exit_2(small_runs, tmp_path):
    path, _ = small_runs
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: flowsim-calibration-profile/1\nparameters:\n- name: gemm_fraction\n")
    res = CliRunner().invoke(main, ["validate", str(path), "--calibration", str(bad)])
    assert res.exit_code == 0  # every row is skipped with the reason, as for any config error of a row
    assert "calibration.parameters[0].arch: required field is missing" in res.output


@pytest.mark.parametrize("verb", [["estimate", "--tp", "8"], ["tune", "--gbs", "8", "--top", "1", "--tp", "8",
                                                                "--no-progress"]])
def test_estimate_and_tune_take_a_profile(verb, tmp_path):
    args = [*verb, "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"]
    res = CliRunner().invoke(main, [*args, "--calibration", str(tmp_path / "none.yaml")])
    assert res.exit_code == 2 and res.output.startswith("Error: calibration: cannot read profile file")
    if verb[0] == "estimate":
        res = CliRunner().invoke(main, [*args, "--calibration", "default", "--precision", "nvfp4", "--gpu", "b200",
                                        "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["config"]["training"]["calibration"] == "default"
