"""Benchmark: ``flowsim validate`` on a large runs CSV, single process against ``--jobs N``.

The CSV is the shared public runs file repeated until it holds ``--rows`` rows; copy k sets
``nic_gbps_per_gpu`` to ``100 + k`` Gb/s so that every copy is a distinct config (identical configs are
simulated once, which would hide the parallel speed-up), unless ``--repeat-configs``: then copies differ only
in ``id`` (what a file that repeats known runs costs: reading, mapping and reporting every row). The runs
go ``--rounds`` times through the ``--jobs`` list, interleaved, so that both modes see the same machine load;
prints the wall and CPU time (the command's and its workers') of each run and each mode's best time over the first
mode's best. With ``--ref REV`` every run is followed by the same run of git revision ``REV``'s code
(:func:`bench_estimate._ref_tree`, first on ``PYTHONPATH``; the commands run in the temporary folder, since
``python -c`` imports from its working directory first), and each mode's best is printed for both with their ratio.
Figures go to docs/RELIABILITY.md.

    python benchmarks/bench_validate.py --rows 2000 --jobs 1,2 --rounds 2
    python benchmarks/bench_validate.py --rows 5000 --jobs 1,2 --rounds 2 --ref HEAD~1
    python benchmarks/bench_validate.py --rows 100000 --csv /tmp/runs_100k.csv   # only write the file
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "curated" / "training_runs_public.csv"


def build_csv(rows: int, out: Path, distinct: bool = True) -> int:
    """Write ``rows`` rows to ``out`` (distinct configs, or copies of the public rows); returns the rows
    written."""
    reader = csv.DictReader(io.StringIO(SHARED.read_text(encoding="utf-8")))
    base = list(reader)
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=reader.fieldnames)
        w.writeheader()
        for i in range(rows):
            k, row = divmod(i, len(base))
            nic = {"nic_gbps_per_gpu": 100 + k} if distinct else {}
            w.writerow({**base[row], "id": i + 1, **nic})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--jobs", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--rounds", type=int, default=1, help="times through the --jobs list, interleaved")
    ap.add_argument("--repeat-configs", action="store_true", help="copies differ only in id")
    ap.add_argument("--csv", type=Path, help="only write the CSV here and exit")
    ap.add_argument("--ref", metavar="REV", help="also run git revision REV's code after each run, interleaved")
    args = ap.parse_args()
    if args.csv:
        build_csv(args.rows, args.csv, not args.repeat_configs)
        return
    jobs_list = [int(j) for j in args.jobs.split(",")]
    trees = {"here": None}
    if args.ref:
        from bench_estimate import _ref_tree

        trees[args.ref] = str(_ref_tree(args.ref))
    best: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.csv"
        build_csv(args.rows, path, not args.repeat_configs)
        for _ in range(args.rounds):
            for jobs in jobs_list:
                for name, tree in trees.items():
                    env = dict(os.environ, **({"PYTHONPATH": tree} if tree else {}))
                    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    start = time.perf_counter()
                    subprocess.run([sys.executable, "-c", "from flowsim.cli import main; main()", "validate",
                                    str(path), "--json", "--jobs", str(jobs), "--progress"], check=True,
                                   stdout=subprocess.DEVNULL, env=env, cwd=tmp)  # not a checkout's root
                    wall = time.perf_counter() - start
                    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its workers, reaped
                    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
                    best[name, jobs] = min(best.get((name, jobs), wall), wall)
                    print(f"{name}  rows {args.rows}  jobs {jobs}  wall {wall:.1f} s  cpu {cpu:.1f} s  "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
    for name in trees:
        first = best[name, jobs_list[0]]
        print(f"best {name}: " + ", ".join(f"jobs {j} {best[name, j]:.1f} s ({best[name, j] / first:.2f})"
                                           for j in jobs_list))
    if args.ref:
        print(f"{args.ref} / here: " + ", ".join(f"jobs {j} {best[args.ref, j] / best['here', j]:.2f}x"
                                                 for j in jobs_list))

if __name__ == "__main__":
    main()
