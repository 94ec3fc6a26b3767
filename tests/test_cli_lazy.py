"""The CLI loads a verb's module only when that verb runs: `flowsim --help` and unknown commands answer without
numba, pandas or the engine."""
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from flowsim.cli import COMMANDS, main

PROBE = """
import sys
from click.testing import CliRunner
from flowsim.cli import main
res = CliRunner().invoke(main, sys.argv[1:])
print(res.exit_code, sorted(m for m in ("numba", "pandas", "scipy", "flowsim.step.simulate") if m in sys.modules))
"""


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["nosuch"], 2), (["validate", "--help"], 0),
                                        (["report", "--help"], 0), (["capture", "--help"], 0)])
def test_help_and_usage_errors_load_no_engine(argv, code):
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[0] == f"{code} []", out.stdout + out.stderr


def test_every_table_entry_is_a_command_of_that_name():
    for name, (target, short) in COMMANDS.items():
        cmd = main.get_command(click.Context(main), name)
        assert isinstance(cmd, click.Command) and cmd.name == name, target
        assert short and len(short) <= 100
    listing = CliRunner().invoke(main, ["--help"]).output
    assert all(name in listing for name in COMMANDS)


README_ESTIMATE = ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-h100", "--gpus", "1024", "--tp", "8",
                   "--pp", "8", "--gbs", "1536", "--sp", "--distributed-optimizer"]


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_the_readme_estimate_imports_no_pandas(extra):
    # the kernel tables are read with the csv module and the op tables stay numpy columns: pandas is for views
    # (Result.to_frame, --breakdown, the kernel tools, validate/report/calibrate)
    out = subprocess.run([sys.executable, "-c", PROBE, *README_ESTIMATE, *extra], capture_output=True, text=True,
                         timeout=300)
    code, modules = out.stdout.split("\n")[-2].split(" ", 1)
    assert code == "0" and "pandas" not in modules, out.stdout[-2000:] + out.stderr
