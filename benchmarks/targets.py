"""Issue 22's speed targets, measured in one run on this machine and written to docs/SPEED.md.

Run: ``python benchmarks/targets.py [--only TEXT] [--out PATH] [--json]`` (about 8 minutes on 2 cores). Each
target is measured by the benchmark that owns it, in a fresh process, with few repeats (the other benchmarks
give the ratios against earlier code and the detail; docs/PERFORMANCE.md has those):

* ``simulate()`` of the README example, in-process, warm: ``bench_estimate``'s timing, min / median of 200 calls;
* ``simulate_many`` of 10,000 random candidates of the gpt3-175b tune space: ``bench_tune.py --batch 10000``;
* the ``flowsim estimate`` command (README example) and ``flowsim --help``, warm, min / median of 5 walls, and
  the estimate's first run with an empty numba cache (a fresh install);
* the flow engine's step re-runs: ``bench_flow_scaling.py --case NAME --repeat 3`` (one process a case: the
  first call, 3 re-runs, the process's max RSS);
* ``flowsim tune``'s whole gpt3-175b space on 1,024 H100: ``bench_tune.py`` (local pool, one process a CPU),
  the enumeration and the evaluation together, as the command pays them;
* the README's NIC study: ``flowsim sweep examples/study_h100_nics.yaml`` into a fresh store;
* ``flowsim validate`` of 100,000 rows with ``--jobs 2`` (``bench_validate.build_csv``): the public rows repeated,
  and every row a distinct config.

The machine is shared: the load average before and after each measurement is recorded beside it. Commands run
without ``PYTHONDONTWRITEBYTECODE`` (an installed package has its bytecode compiled).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_estimate import ARGS, CLI, _cli_env, _times  # noqa: E402  (the example, defined once)

FLOW_CASES = {  # target seconds of a re-run (bench_flow_scaling's case names)
    "gpt3-175b, 1,024 H100, TP8 PP8 DP16": 0.1,
    "llama3.1-405b, 16,384 H100, TP8 PP16 DP128, seq 8192": 1.0,
    "deepseek-v3, 2,048 H800, PP16 EP64 DP128": 1.0,
    "gpt3-175b, 65,536 H100, TP8 PP8 DP1024": 4.0,
}
FLOW_MAX_RSS_MB = 500  # issue 22: the 65,536-GPU case within 500 MB


def _walls(cmd: list, runs: int, env: dict | None = None, warm: bool = True) -> list:
    """Wall seconds of ``runs`` runs of ``cmd`` (one untimed run first when ``warm``)."""
    env = env or _cli_env({})
    if warm:
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
        out.append(time.perf_counter() - t0)
    return out


def _json_of(cmd: list) -> dict:
    run = subprocess.run(cmd, check=True, capture_output=True, text=True, env=_cli_env({}), cwd=tempfile.gettempdir())
    return json.loads(run.stdout.strip().splitlines()[-1])


def _row(target: str, limit: float, values: list, unit: str = "s", note: str = "") -> dict:
    """One table row: met when the median is within ``limit``."""
    med = statistics.median(values)
    return {"target": target, "limit": limit, "unit": unit, "min": min(values), "median": med,
            "runs": len(values), "met": med <= limit, "note": note}


def _simulate() -> list:
    import flowsim

    cfg = flowsim.build_config(**ARGS)
    flowsim.simulate(cfg)
    ms = [1e3 * s for s in _times(cfg, 200)]
    return [_row("simulate() of the README example, in-process, warm", 1.0, ms, "ms")]


def _batch() -> list:
    out = _json_of([sys.executable, str(HERE / "bench_tune.py"), "--batch", "10000", "--json"])
    return [_row("simulate_many of 10,000 tune candidates (local pool)", 10.0, [out["wall_s"]],
                 note=f"{out['errors']} errors; worker CPU {out['workers_cpu_s']:.1f} s")]


def _cli() -> list:
    with tempfile.TemporaryDirectory(prefix="flowsim-empty-numba-cache-") as empty:
        fresh = _walls(CLI, 1, _cli_env({"NUMBA_CACHE_DIR": empty}), warm=False)
    return [_row("`flowsim estimate` of the README example, warm", 0.5, _walls(CLI, 5)),
            _row("`flowsim --help`", 0.2, _walls(["flowsim", "--help"], 5)),
            _row("`flowsim estimate`, first run on an empty numba cache", 15.0, fresh)]


def _flow() -> list:
    rows = []
    for name, limit in FLOW_CASES.items():
        out = _json_of([sys.executable, str(HERE / "bench_flow_scaling.py"), "--case", name, "--repeat", "3"])
        note = f"first call {out['first_s']:.2f} s; max RSS {out['max_rss_mb']:.0f} MB"
        row = _row(f"flow engine re-run: {name}", limit, out["fast_s"], note=note)
        if "65,536" in name:
            row["met"] = row["met"] and out["max_rss_mb"] <= FLOW_MAX_RSS_MB
            row["target"] += f" (and <= {FLOW_MAX_RSS_MB} MB)"
        rows.append(row)
    return rows


def _tune() -> list:
    out = _json_of([sys.executable, str(HERE / "bench_tune.py"), "--json"])
    return [_row("`tune` gpt3-175b on 1,024 H100, whole space: enumeration + evaluation (local pool)", 30.0,
                 [out["enumeration_s"] + out["wall_s"]],
                 note=f"enumeration {out['enumeration_s']:.1f} s, evaluation {out['wall_s']:.1f} s; "
                      f"{out['configs']:,} configs, {out['simulated']:,} simulated; worker CPU "
                      f"{out['workers_cpu_s']:.1f} s")]


def _nic_study() -> list:
    with tempfile.TemporaryDirectory() as d:
        cmd = ["flowsim", "sweep", "examples/study_h100_nics.yaml", "--db", str(Path(d) / "s.sqlite")]
        return [_row("README NIC study (`flowsim sweep`)", 60.0, _walls(cmd, 1, warm=False))]


def _validate() -> list:
    from bench_validate import build_csv

    rows = []
    for distinct, what in ((False, "the public rows repeated (169 distinct configs)"),
                           (True, "every row a distinct config")):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "runs.csv"
            build_csv(100_000, path, distinct)
            cmd = ["flowsim", "validate", str(path), "--json", "--jobs", "2"]
            rows.append(_row(f"`flowsim validate` of 100,000 rows, --jobs 2: {what}", 120.0,
                             _walls(cmd, 1, warm=False)))
    return rows


PARTS = {"simulate": _simulate, "batch": _batch, "cli": _cli, "flow": _flow, "tune": _tune, "nic": _nic_study,
         "validate": _validate}


def _markdown(rows: list, head: dict) -> str:
    lines = ["# Speed targets (issue 22)", "",
             "Generated by `python benchmarks/targets.py`; do not edit by hand. One run of each target on the",
             "machine below (shared: read the load averages); detail and ratios against earlier code in",
             "[PERFORMANCE.md](PERFORMANCE.md).", "",
             f"- commit: {head['commit']}, {head['utc']} UTC",
             f"- machine: {head['machine']}, {head['cpus']} CPUs; Python {head['python']}, numba {head['numba']}, "
             f"numpy {head['numpy']}", "",
             "| target | limit | min | median | runs | met | load before / after | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fmt = (lambda x: f"{x:.3f}") if r["median"] < 10 else (lambda x: f"{x:.1f}")
        lines.append(f"| {r['target']} | {r['limit']:g} {r['unit']} | {fmt(r['min'])} | {fmt(r['median'])} | "
                     f"{r['runs']} | {'yes' if r['met'] else '**no**'} | {r['load']} | {r['note']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help=f"comma-separated parts of {', '.join(PARTS)} (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "SPEED.md")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of writing --out")
    args = ap.parse_args()
    only = [p for p in args.only.split(",") if p] or list(PARTS)
    unknown = sorted(set(only) - set(PARTS))
    if unknown:
        ap.error(f"--only: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    import numba
    import numpy

    head = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip(),
            "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "numba": numba.__version__, "numpy": numpy.__version__}
    try:
        with open("/proc/cpuinfo") as f:
            head["machine"] = next(x.split(":", 1)[1].strip() for x in f if x.startswith("model name"))
    except (OSError, StopIteration):
        pass
    rows = []
    for part in only:
        before = os.getloadavg()[0]
        got = PARTS[part]()
        load = f"{before:.1f} / {os.getloadavg()[0]:.1f}"
        for r in got:
            r["load"] = load
            print(f"{r['target']}: {r['min']:.3f} / {r['median']:.3f} {r['unit']} "
                  f"({'met' if r['met'] else 'not met'}; load {load})", file=sys.stderr, flush=True)
        rows += got
    if args.json:
        print(json.dumps({"head": head, "rows": rows}))
    else:
        args.out.write_text(_markdown(rows, head), encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
