"""The CLI prints each warning once, as one line, without Python's source-line echo."""
from click.testing import CliRunner

from flowsim.cli import main


def test_a_fallback_shared_by_many_rows_is_warned_once(shared_data):
    runs = shared_data / "curated" / "training_runs_public.csv"
    result = CliRunner().invoke(main, ["validate", str(runs), "--calibration", "none", "--only-ids", "1,2,3"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "nearest newer release" in line]
    assert len(lines) == 1, result.output  # three rows share the one release fallback
    assert lines[0].startswith("warning: software_release megatron-lm-2021-04:")
    assert "FlowsimWarning" not in result.output and "t_ops = " not in result.output
