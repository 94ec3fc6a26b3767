"""The step core's loops give the same results compiled by numba and run by the interpreter (flowsim._jit), and a
process that interprets them (the CLI's `estimate`) never imports numba."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import make_fast_path_data
import pytest

import flowsim

ROOT = Path(flowsim.__file__).resolve().parent
EVERY = 8  # every 8th of the 200 frozen configs: 25 configs, a few seconds in the interpreter
INTERPRETED = """
import json, sys
sys.path.insert(0, {tests!r})
import make_fast_path_data, flowsim
from flowsim._jit import interpreted
frozen = json.load(__import__("gzip").open(make_fast_path_data.DATA, "rt"))
out = [make_fast_path_data.result_numbers(flowsim.simulate(flowsim.build_config(**kw)))
       for kw in frozen["configs"][::{every}]]
print(json.dumps({{"interpreted": interpreted(), "numba": "numba" in sys.modules, "results": out}}))
"""


def _run(code: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, **env))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_interpreted_loops_give_the_frozen_results():
    got = _run(INTERPRETED.format(tests=str(Path(__file__).parent), every=EVERY), FLOWSIM_JIT="0")
    assert got["interpreted"] and not got["numba"]
    frozen = make_fast_path_data.json.load(make_fast_path_data.gzip.open(make_fast_path_data.DATA, "rt"))
    for kw, expected, result in zip(frozen["configs"][::EVERY], frozen["results"][::EVERY], got["results"]):
        bad = [k for k, v in expected.items() if result[k] != pytest.approx(v, rel=1e-9, abs=1e-15)]
        assert not bad, f"{kw}: " + ", ".join(f"{k} {result[k]!r} != {expected[k]!r}" for k in bad[:5])


ESTIMATE = """
import sys
from click.testing import CliRunner
from flowsim.cli import main
res = CliRunner().invoke(main, sys.argv[1:])
print(res.exit_code, "numba" in sys.modules, res.output.splitlines()[0] if res.output else "")
"""


def test_estimate_interprets_the_step_loops_without_numba():
    argv = ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-h100", "--gpus", "1024", "--tp", "8", "--pp", "8",
            "--gbs", "1536", "--sp", "--distributed-optimizer"]
    env = {k: v for k, v in os.environ.items() if k != "FLOWSIM_JIT"}
    out = subprocess.run([sys.executable, "-c", ESTIMATE, *argv], capture_output=True, text=True, timeout=600,
                         env=env)
    code, numba_loaded = out.stdout.split()[:2]
    assert (code, numba_loaded) == ("0", "False"), out.stdout + out.stderr[-2000:]


def _numba_imports(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any((isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "numba")
               or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "numba" for a in n.names))
               for n in ast.walk(tree))


def test_step_core_loops_are_decorated_through_flowsim_jit():
    """The step core decorates its loops with flowsim._jit.njit, so one process compiles or interprets them all;
    importing numba there would compile them in the CLI's estimate again."""
    offenders = [p.name for p in (ROOT / "step").glob("*.py") if _numba_imports(p)]
    assert not offenders, f"import njit from flowsim._jit, not numba: {offenders}"


def test_a_bad_flowsim_jit_value_is_a_one_line_error():
    code = "import sys; from click.testing import CliRunner; from flowsim.cli import main; " \
           "r = CliRunner().invoke(main, ['estimate', '--model', 'llama3-8b', '--cluster', 'dgx-h100', '--gpus', " \
           "'8', '--gbs', '64']); print(r.exit_code); print(r.output.strip())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, FLOWSIM_JIT="yes"))
    code_line, message = out.stdout.strip().splitlines()[:2]
    assert (code_line, message) == ("2", "Error: FLOWSIM_JIT: must be 0 (interpret the step core's loops) or 1 "
                                         "(compile them), or unset (got yes)"), out.stdout + out.stderr
