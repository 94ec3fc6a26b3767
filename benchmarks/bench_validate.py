"""Benchmark: ``flowsim validate`` on a large runs CSV, single process against ``--jobs N``.

The CSV is the shared public runs file repeated until it holds ``--rows`` rows; copy k sets
``nic_gbps_per_gpu`` to ``100 + k`` Gb/s so that every copy is a distinct config (identical configs are
simulated once, which would hide the parallel speed-up). Prints the wall time of each run; figures go to
docs/RELIABILITY.md.

    python benchmarks/bench_validate.py --rows 2000 --jobs 1,2
"""
from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "curated" / "training_runs_public.csv"


def build_csv(rows: int, out: Path) -> int:
    """Write ``rows`` rows (distinct configs) to ``out``; returns the rows written."""
    reader = csv.DictReader(io.StringIO(SHARED.read_text(encoding="utf-8")))
    base = list(reader)
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=reader.fieldnames)
        w.writeheader()
        for i in range(rows):
            k, row = divmod(i, len(base))
            w.writerow({**base[row], "id": i + 1, "nic_gbps_per_gpu": 100 + k})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--jobs", default="1,2", help="comma-separated worker counts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.csv"
        build_csv(args.rows, path)
        for jobs in (int(j) for j in args.jobs.split(",")):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "from flowsim.cli import main; main()", "validate", str(path),
                            "--json", "--jobs", str(jobs), "--progress"], check=True, stdout=subprocess.DEVNULL)
            print(f"rows {args.rows}  jobs {jobs}  wall {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
