"""Speed of one step estimate: gpt3-175b on 1,024 H100 (TP8 PP8 DP16, GBS 1536), the README example.

Run: ``python benchmarks/bench_estimate.py [--ref REV] [--llm-analysis] [--repeat N]``. Prints, after compilation:

* ``simulate(cfg)`` in-process, min / median of ``N`` calls (default 200): a repeated config, whose workload,
  priced op table and stage memory are reused (:func:`flowsim.model.workload.build_workload`,
  ``flowsim.step.simulate``);
* the same with those caches cleared before each call: what a config seen for the first time pays (a tune
  candidate, a validate row);
* ``build_config`` + ``simulate``;
* with ``--ref REV``: ``simulate(cfg)`` of the working tree against the code of git revision ``REV``
  (``git archive`` into ``$TMPDIR/flowsim-bench-<rev>``, run in a worker process), interleaved in batches of
  10 calls, min / median of each and the ratio of the medians; the worker's first call compiles that tree's
  numba kernels into the per-user cache once (a minute);
* with ``--llm-analysis``: ``simulate(cfg)`` against llm-analysis 0.2.2's ``train()`` for the same job
  (``pip install llm-analysis``; its ``facebook_opt-175b`` preset has GPT-3 175B's shape: 96 layers, hidden
  12,288, 96 heads; ``h100-sxm-80gb``, TP8 PP8 DP16, micro-batch 1, GBS 1536, sequence 2,048), interleaved in
  batches of 10 calls in this process, min / median of each and the ratio of the medians; and the two command
  lines' wall times, alternating (llm-analysis's ``python -m llm_analysis.analysis train``);
* the wall time of the whole ``flowsim estimate`` command, min / median of 5: as it runs (the step core's loops
  interpreted, :mod:`flowsim._jit`), with ``FLOWSIM_JIT=1`` (compiled, numba cache warm), and once with an empty
  numba cache (a fresh install). ``PYTHONDONTWRITEBYTECODE`` is dropped from the commands' environment: an
  installed package has its bytecode compiled, so a warm run should not recompile every module from source.

Figures, the machine and its load go into docs/PERFORMANCE.md.
"""
from __future__ import annotations

import configparser
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import flowsim
from flowsim.step.simulate import simulate

ARGS = dict(model="gpt3-175b", cluster="dgx-h100", gpus=1024, tp=8, pp=8, dp=16, gbs=1536, sp=True)
CLI = ["flowsim", "estimate", "--model", "gpt3-175b", "--cluster", "dgx-h100", "--gpus", "1024", "--tp", "8",
       "--pp", "8", "--dp", "16", "--gbs", "1536", "--sp"]
BATCH = 10  # calls per interleaved batch
ROOT = Path(__file__).resolve().parents[1]


def _times(cfg, n: int, cold: bool = False) -> list:
    """Seconds of ``n`` ``simulate(cfg)`` calls (``cold``: every analytic cache cleared first,
    :func:`flowsim.model.memo.clear_all`)."""
    if cold:
        from flowsim.model import memo  # not at module level: a --ref tree may predate clear_all
    out = []
    for _ in range(n):
        if cold:
            memo.clear_all()
        t0 = time.perf_counter()
        simulate(cfg)
        out.append(time.perf_counter() - t0)
    return out


def _worker() -> None:
    """Reference worker: reads a call count per line, answers the seconds of each call as a JSON list."""
    cfg = flowsim.build_config(**ARGS)
    simulate(cfg)
    print(json.dumps({"flowsim": str(Path(flowsim.__file__).parent)}), flush=True)
    for line in sys.stdin:
        print(json.dumps(_times(cfg, int(line))), flush=True)


def _ref_tree(rev: str) -> Path:
    """The code of ``rev`` importable as ``flowsim`` (setup.cfg's package_dir mapped by symlinks)."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"flowsim-bench-{sha}"
    if not tree.exists():
        tmp = Path(tempfile.mkdtemp(dir=tree.parent))
        archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        cfg = configparser.ConfigParser()
        cfg.read(tmp / "setup.cfg")
        for line in cfg["options"]["package_dir"].strip().splitlines():
            name, path = (x.strip() for x in line.split("="))
            link = tmp / name.replace(".", "/")
            if link != tmp / path:
                link.symlink_to(os.path.relpath(tmp / path, link.parent))  # relative: the folder is renamed
        tmp.rename(tree)
    return tree


def _against(rev: str, cfg, rounds: int) -> str:
    """``simulate(cfg)`` here and at ``rev``, interleaved batch by batch: min / median ms of each, median ratio."""
    env = {**os.environ, "PYTHONPATH": str(_ref_tree(rev))}
    proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=tempfile.gettempdir())
    where = json.loads(proc.stdout.readline())["flowsim"]
    here, ref = [], []
    for _ in range(rounds):
        here += _times(cfg, BATCH)
        proc.stdin.write(f"{BATCH}\n")
        proc.stdin.flush()
        ref += json.loads(proc.stdout.readline())
    proc.stdin.close()
    proc.wait()
    h, r = (f"{1e3 * min(x):.2f} / {1e3 * statistics.median(x):.2f} ms" for x in (here, ref))
    return (f"simulate(cfg) {h}, at {rev} ({where}) {r}: {statistics.median(ref) / statistics.median(here):.2f}x "
            f"({len(here)} calls each, batches of {BATCH})")


LLM_ANALYSIS = dict(model_name="facebook_opt-175b", gpu_name="h100-sxm-80gb", dtype_name="w16a16e16",
                    log_level="ERROR", batch_size_per_gpu=1, global_batch_size=1536, seq_len=2048, tp_size=8,
                    pp_size=8, dp_size=16, total_num_gpus=1024)
LLM_ANALYSIS_CLI = [sys.executable, "-m", "llm_analysis.analysis", "train",
                    *(f"--{k}={v}" for k, v in LLM_ANALYSIS.items())]


def _against_llm_analysis(cfg, rounds: int) -> list:
    """``simulate(cfg)`` and llm-analysis's ``train()`` of the same job, interleaved batch by batch in this
    process; then both command lines' walls, alternating. Lines of text."""
    try:
        from llm_analysis.analysis import train
    except ImportError:
        sys.exit("error: --llm-analysis needs llm-analysis (pip install llm-analysis)")
    train(**LLM_ANALYSIS)  # loads its presets once
    here, ref = [], []
    for _ in range(rounds):
        here += _times(cfg, BATCH)
        for _ in range(BATCH):
            t0 = time.perf_counter()
            train(**LLM_ANALYSIS)
            ref.append(time.perf_counter() - t0)
    env = _cli_env({})
    subprocess.run(LLM_ANALYSIS_CLI, check=True, capture_output=True, env=env, cwd=tempfile.gettempdir())
    ours, theirs = [], []
    for _ in range(5):
        ours += _cli_walls({}, runs=1, warm=not ours)
        t0 = time.perf_counter()
        subprocess.run(LLM_ANALYSIS_CLI, check=True, capture_output=True, env=env, cwd=tempfile.gettempdir())
        theirs.append(time.perf_counter() - t0)
    return [f"simulate(cfg) {_ms(here)}, llm-analysis train() {_ms(ref)}: flowsim "
            f"{statistics.median(here) / statistics.median(ref):.1f}x its time ({len(here)} calls each)",
            f"command lines, min / median of 5, alternating: flowsim estimate {min(ours):.2f} / "
            f"{statistics.median(ours):.2f} s, llm-analysis train {min(theirs):.2f} / {statistics.median(theirs):.2f} s"
            f" (flowsim {statistics.median(ours) / statistics.median(theirs):.2f}x its time)"]


def _ms(x: list) -> str:
    return f"{1e3 * min(x):.2f} / {1e3 * statistics.median(x):.2f} ms"


def main(argv: list) -> None:
    repeats = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 200
    cfg = flowsim.build_config(**ARGS)
    simulate(cfg)  # compile / warm caches
    warm = _times(cfg, repeats)
    cold = _times(cfg, max(1, repeats // 4), cold=True)
    with_build = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        simulate(flowsim.build_config(**ARGS))
        with_build.append(time.perf_counter() - t0)
    against = _against(argv[argv.index("--ref") + 1], cfg, max(1, repeats // BATCH)) if "--ref" in argv else None
    llm_analysis = _against_llm_analysis(cfg, max(1, repeats // BATCH)) if "--llm-analysis" in argv else []
    walls = _cli_walls({})  # the step core's loops interpreted (flowsim._jit), as `flowsim estimate` runs them
    compiled = _cli_walls({"FLOWSIM_JIT": "1"})  # the same command with them compiled, numba cache warm
    with tempfile.TemporaryDirectory(prefix="flowsim-empty-numba-cache-") as empty:
        fresh = _cli_walls({"NUMBA_CACHE_DIR": empty}, runs=1, warm=False)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}, load average {os.getloadavg()}")
    print(f"simulate(cfg), repeated config, min / median of {repeats}: {_ms(warm)}")
    print(f"simulate(cfg), caches cleared (a new config), min / median of {len(cold)}: {_ms(cold)}")
    print(f"build_config + simulate, min / median of {repeats}: {_ms(with_build)}")
    if against:
        print(f"against the reference: {against}")
    for line in llm_analysis:
        print(f"against llm-analysis: {line}")
    print(f"flowsim estimate command, min / median of 5: {min(walls):.2f} / {statistics.median(walls):.2f} s "
          f"(FLOWSIM_JIT=1, compiled loops, warm numba cache: {min(compiled):.2f} / {statistics.median(compiled):.2f} s;"
          f" first run with an empty numba cache {fresh[0]:.2f} s)")


def _cli_env(env: dict) -> dict:
    """This process's environment with ``env`` added and ``PYTHONDONTWRITEBYTECODE`` dropped (see the module
    docstring)."""
    return {k: v for k, v in dict(os.environ, **env).items() if k != "PYTHONDONTWRITEBYTECODE"}


def _cli_walls(env: dict, runs: int = 5, warm: bool = True) -> list:
    """Wall seconds of ``runs`` runs of the README's ``flowsim estimate`` with ``env`` added (one untimed run
    first when ``warm``: the numba on-disk cache and the OS file cache)."""
    env = _cli_env(env)
    if warm:
        subprocess.run(CLI, check=True, capture_output=True, env=env)
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(CLI, check=True, capture_output=True, env=env)
        walls.append(time.perf_counter() - t0)
    return walls


if __name__ == "__main__":
    if "--worker" in sys.argv:
        _worker()
    else:
        main(sys.argv[1:])
