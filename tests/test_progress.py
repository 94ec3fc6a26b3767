"""Progress bars (tqdm, stderr) and the one-line notice while numba compiles on first use."""
import io
import subprocess
import sys

from flowsim.cli.common import FIRST_COMPILE_NOTE
from flowsim.explore.runner import Progress

PROBE = """
import numba
from flowsim.cli.common import notice_first_compile
notice_first_compile()
notice_first_compile()
f = numba.njit(lambda x: x + 1)
f(1)
f(2.0)
print("done")
"""


def test_progress_bar_counts_on_stderr_like_stream():
    out = io.StringIO()
    bar = Progress(5, "evaluate", stream=out)
    for _ in range(5):
        bar.advance(1)
    bar.close()
    assert "evaluate: 100%" in out.getvalue() and "5/5" in out.getvalue()
    quiet = io.StringIO()
    off = Progress(5, "evaluate", enabled=False, stream=quiet)
    off.advance(5)
    off.close()
    assert quiet.getvalue() == ""


def test_compile_notice_is_one_line_once():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "done", res.stderr
    assert res.stderr.count(FIRST_COMPILE_NOTE) == 1  # two compilations, two registrations: one line
