"""The accuracy report: one command writes the markdown and the plots, with the figures the CLI prints."""
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from flowsim.cli import main
from flowsim.validation.report import NCCL_DATASETS
from flowsim.validation.runs import validate_runs

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module")
def quick_report(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    res = CliRunner().invoke(main, ["report", str(out), "--quick", "--data-dir", str(shared_data)])
    assert res.exit_code == 0, res.output
    return out


def test_report_writes_markdown_and_plots(quick_report):
    md = (quick_report / "ACCURACY.md").read_text()
    assert md.startswith("# flowsim accuracy")
    for name in ("step_time_scatter", "step_time_error_by_gpus", "nccl_busbw", "trace_kernels"):
        png = quick_report / "img" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
        assert f"(img/{name}.png)" in md


def test_report_figures_match_the_commands(quick_report, shared_data):
    md = (quick_report / "ACCURACY.md").read_text()
    s = validate_runs(shared_data / "curated" / "training_runs_public.csv", only_ids=[1, 2, 3]).summary
    assert f"|error| median {s.median_abs_error_pct:.1f} %" in md
    trace = shared_data / "traces" / "tracelens_b200_8rank_vllm_tp8_rank0.json.gz"
    out = CliRunner().invoke(main, ["validate-trace", str(trace), "--outliers", "0"]).output
    gemm_cli = re.search(r"^gemm\s+(\d+)\s+([+-][\d.]+)\s+([\d.]+)", out, re.M).groups()
    gemm_md = re.search(r"^\| gemm \| (\d+) \| ([+-][\d.]+) % \| ([\d.]+) % \|", md, re.M).groups()
    assert gemm_cli == gemm_md


def test_nccl_datasets_are_the_documented_commands():
    """docs/NCCL.md lists one `flowsim validate-nccl` command per comparison; the report runs the same set."""
    commands = re.findall(r"^flowsim validate-nccl \$D/(\S+) (.*)$", (DOCS / "NCCL.md").read_text(), re.M)
    documented = {(f, int(re.search(r"--section (\d+)", opts).group(1)) if "--section" in opts else 0)
                  for f, opts in commands}
    assert documented == {(d.file, d.section) for d in NCCL_DATASETS}
