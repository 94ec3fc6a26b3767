"""The CLI prints each warning once, as one line, without Python's source-line echo (run as the user runs it:
pytest records warnings raised in-process, so the command runs in its own interpreter)."""
import subprocess
import sys


def test_a_fallback_shared_by_many_rows_is_warned_once(shared_data):
    runs = shared_data / "curated" / "training_runs_public.csv"
    code = "from flowsim.cli import main; main()"
    res = subprocess.run([sys.executable, "-c", code, "validate", str(runs), "--calibration", "none", "--only-ids",
                          "1,2,3", "--json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if "nearest newer release" in line]
    assert len(lines) == 1, res.stderr  # three rows share the one release fallback
    assert lines[0].startswith("warning: software_release megatron-lm-2021-04:")
    assert "FlowsimWarning" not in res.stderr
    assert '"summary"' in res.stdout  # stdout holds only the JSON
