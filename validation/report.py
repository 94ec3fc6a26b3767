"""The accuracy report: every shipped data set through flowsim, written as docs/ACCURACY.md with PNG plots.

Data sets (all under ``../shared/data``):

* ``curated/training_runs_public.csv``: whole training steps, :func:`flowsim.validation.runs.validate_runs`
  (what ``flowsim validate`` prints);
* ``nccl-tests/*.txt``: every log and section of :data:`NCCL_DATASETS`, compared on the cluster
  docs/NCCL.md uses for it (what ``flowsim validate-nccl`` prints);
* ``traces/*.json.gz``: the four profiler traces, :func:`flowsim.validation.trace_validation.validate_trace`
  (what ``flowsim validate-trace`` prints);
* ``simai/workload_analytical.txt``: the SimAI-Analytical compatibility check and flowsim's own prediction
  (what ``flowsim simai run`` prints);
* ``simai/aicb_A100_example.csv``: collectives AICB measured on one 8 x A100 node (what
  ``flowsim simai aicb-log`` prints).

One command writes it: ``flowsim report docs`` (or ``python -m flowsim.validation.report docs``).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from flowsim.network.comm_layout import preset_layout
from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import load_preset
from flowsim.units import US
from flowsim.validation.aicb_log import compare_aicb_log
from flowsim.validation.nccl_tests import compare_nccl_tests, read_nccl_tests
from flowsim.validation.runs import validate_runs
from flowsim.validation.simai_analytical import SimaiSystem, simulate_analytical
from flowsim.validation.simai_flowsim import breakdown_rows, simulate_flowsim
from flowsim.validation.simai_workload import read_workload
from flowsim.validation.trace_validation import validate_trace

RUNS_CSV = "curated/training_runs_public.csv"
TRACES = ("flowsim_h200_4rank_sglang_tp4.json.gz", "hta_a100_2rank_ddp_nccl.json.gz",
          "tracelens_b200_8rank_vllm_tp8_rank0.json.gz", "tracelens_mi300x_8rank_ddp_resnet_rank0.json.gz")
SIMAI_WORKLOAD = "simai/workload_analytical.txt"
SIMAI_SYSTEM = SimaiSystem(num_gpus=9216, nvlink_GBps=360, nic_GBps=48.5, nics_per_server=8, gpus_per_server=8)
"""SimAI's example flags ``-g 9216 -nv 360 -nic 48.5 -n_p_s 8 -g_p_s 8`` (SimAI README, PR #294)."""
AICB_LOG = "simai/aicb_A100_example.csv"
AICB_CLUSTER, AICB_GPUS, AICB_TP = "dgx-a100", 8, 2
"""The machine of the AICB log: one 8 x A100 node, TP 2, DP 4 (simai-notes section 8; the file's name and
its group sizes)."""
SIMAI_CLUSTER = "dgx-h100"
"""Cluster of flowsim's own prediction of the SimAI example (8 GPUs and 8 x 400G NICs per server, as -g_p_s
and -n_p_s describe)."""


@dataclass(frozen=True)
class NcclDataset:
    """One ``flowsim validate-nccl`` command of docs/NCCL.md ("Reproduce").

    Attributes
    ----------
    file : str
        Log file name in ``nccl-tests/``.
    section : int
        Section of the log.
    cluster : str
        Cluster preset.
    options : tuple of (str, object)
        The other options: ``nodes``, ``gpu``, ``cpu``, ``nic_gbps``, ``algo``, ``op``.
    """

    file: str
    section: int
    cluster: str
    options: tuple = ()

    def option(self, name: str, default=None):
        """Value of one option, or ``default``."""
        return dict(self.options).get(name, default)

    def label(self) -> str:
        """``file [section]`` with the non-default options, for tables."""
        extra = " ".join(f"{k}={v}" for k, v in self.options)
        return f"{self.file} [{self.section}] {self.cluster} {extra}".strip()


_AMD = (("cpu", "amd"),)
NCCL_DATASETS = (
    NcclDataset("a100_8gpu_allreduce_azure_nda100v4.txt", 0, "dgx-a100"),
    NcclDataset("a100_8gpu_allreduce_sxm4_80gb_g8.txt", 0, "dgx-a100"),
    NcclDataset("gb200_4gpu_allreduce_ring_azure_ndgb200v6.txt", 0, "gb200-nvl72", (("algo", "ring"),)),
    NcclDataset("gb200_72gpu_1rack_allreduce_mnnvl_coreweave.txt", 0, "gb200-nvl72", (("nodes", 18),)),
    NcclDataset("gb200_144gpu_2rack_allreduce_coreweave.txt", 0, "gb200-nvl72", (("nodes", 36),)),
    NcclDataset("gb200_1440gpu_20rack_allreduce_coreweave.txt", 0, "gb200-nvl72", (("nodes", 360),)),
    NcclDataset("h100_64gpu_8node_allreduce_sharp_collnetchain_coreweave.txt", 0, "dgx-h100", (("nodes", 8),)),
    NcclDataset("h100_16gpu_2node_alltoall_xxrjun.txt", 0, "dgx-h100", (("nodes", 2),)),
    NcclDataset("h100_16gpu_2node_alltoall_xxrjun.txt", 1, "dgx-h100", (("nodes", 2),)),
    NcclDataset("h100_16gpu_2node_gcp_a3mega_allreduce.txt", 0, "dgx-h100", (("nodes", 2), ("nic_gbps", 200))),
    NcclDataset("h100_8gpu_allgather_ring_together.txt", 0, "dgx-h100", (("algo", "ring"),)),
    NcclDataset("h100_8gpu_allreduce_nvls_together.txt", 0, "dgx-h100", (("algo", "nvls"),)),
    NcclDataset("h100_8gpu_allreduce_ring_together.txt", 0, "dgx-h100", (("algo", "ring"),)),
    NcclDataset("h100_8gpu_and_2node_degraded_ncclTests_issue290.txt", 0, "dgx-h100", (("op", "allreduce"),)),
    NcclDataset("h100_8gpu_reducescatter_ring_together.txt", 0, "dgx-h100", (("algo", "ring"),)),
    NcclDataset("h200_8gpu_allreduce_nvls_azure_ndh200v5.txt", 0, "dgx-h200"),
    NcclDataset("mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt", 0, "dgx-h100", (("gpu", "mi300x"), *_AMD)),
    NcclDataset("mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt", 1, "dgx-h100",
                (("gpu", "mi300x"), *_AMD, ("nodes", 2))),
    *(NcclDataset("mi300x_mi325x_rccl_allreduce_1to8nodes_hisohara.txt", s, "dgx-h100",
                  (("gpu", "mi325x"), *_AMD, ("algo", "ring"), *((("nodes", n),) if n > 1 else ())))
      for s, n in ((2, 1), (3, 2), (4, 4), (5, 8))),
    NcclDataset("mi355x_8gpu_rccl_allreduce_alltoall_oci.txt", 0, "dgx-h100", (("gpu", "mi355x"), *_AMD)),
    NcclDataset("mi355x_8gpu_rccl_allreduce_alltoall_oci.txt", 1, "dgx-h100", (("gpu", "mi355x"), *_AMD)),
)
"""The nccl-tests comparisons of docs/NCCL.md "Reproduce", one per command (AMD runs use the DGX H100 preset
only for its 8 x 400G NICs, as there)."""


@dataclass(frozen=True)
class AccuracyReport:
    """Everything the report shows.

    Attributes
    ----------
    runs : ValidationReport or None
        Step-time comparison of the runs CSV.
    nccl : tuple of (NcclDataset, NcclComparison)
        nccl-tests comparisons.
    traces : tuple of TraceValidation
        Profiler-trace comparisons.
    simai : tuple of (SimaiAnalyticalResult, SimaiFlowsimResult) or None
        SimAI example: SimAI-Analytical's model and flowsim's prediction.
    aicb : AicbComparison or None
        The AICB measured-collectives log.
    runs_uncalibrated : ValidationReport or None
        The same runs with ``--calibration none`` (``runs`` uses the default, the shipped profile).
    """

    runs: object
    nccl: tuple
    traces: tuple
    simai: tuple | None
    aicb: object = None
    runs_uncalibrated: object = None

    def to_dict(self) -> dict:
        """Summaries of every part (what the markdown tables show)."""
        return {"runs": self.runs.to_dict()["summary"] if self.runs else None,
                "nccl": [{"dataset": d.label(), **c.summary.to_dict()} for d, c in self.nccl],
                "traces": [t.to_dict() for t in self.traces],
                "simai": {"simai_analytical": self.simai[0].to_dict(), "flowsim": self.simai[1].to_dict()}
                if self.simai else None, "aicb": self.aicb.to_dict() if self.aicb else None}


def compare_dataset(data_dir: Path, d: NcclDataset):
    """Run one nccl-tests comparison exactly as ``flowsim validate-nccl`` does.

    Parameters
    ----------
    data_dir : Path
        The shared data folder.
    d : NcclDataset
        The comparison.

    Returns
    -------
    NcclComparison
    """
    layout = preset_layout(d.cluster, d.option("nodes", 1), None, None, d.option("nic_gbps"), d.option("gpu"),
                          d.option("cpu"))
    log = read_nccl_tests(data_dir / "nccl-tests" / d.file, op=d.option("op"), n_ranks=layout.n_ranks)
    if log.nccl_version:  # the release the log states, as validate-nccl models it
        layout = replace(layout, nccl_version=log.nccl_version)
    return compare_nccl_tests(log, layout, algo=d.option("algo"), sections=[d.section])


def run_report(data_dir: str | Path, *, run_ids=None, nccl=NCCL_DATASETS, traces=TRACES,
               simai: bool = True, progress: bool = False) -> AccuracyReport:
    """Run the data sets (all by default; the keywords select a subset).

    Parameters
    ----------
    data_dir : str or Path
        The shared data folder (``../shared/data`` from the checkout).
    run_ids : iterable of int, optional
        Only these rows of the runs CSV; an empty tuple skips the runs.
    nccl : iterable of NcclDataset, optional
        nccl-tests comparisons (default :data:`NCCL_DATASETS`).
    traces : iterable of str, optional
        Trace file names in ``traces/`` (default :data:`TRACES`).
    simai : bool, optional
        Include the SimAI example and the AICB log (default True).
    progress : bool, optional
        A progress bar on stderr, one step per data set (default off).

    Returns
    -------
    AccuracyReport
    """
    from flowsim.explore.runner import Progress

    data_dir, nccl, traces = Path(data_dir), tuple(nccl), tuple(traces)
    with_runs = run_ids is None or bool(tuple(run_ids))
    bar = Progress(2 * with_runs + len(nccl) + len(traces) + 2 * bool(simai), "report", progress, unit="data set")
    runs = runs_uncalibrated = None
    if with_runs:
        runs = validate_runs(data_dir / RUNS_CSV, only_ids=run_ids)
        bar.advance(1)
        runs_uncalibrated = validate_runs(data_dir / RUNS_CSV, only_ids=run_ids, calibration="none")
        bar.advance(1)
    comparisons = []
    for d in nccl:
        comparisons.append((d, compare_dataset(data_dir, d)))
        bar.advance(1)
    trace_results = []
    for name in traces:
        trace_results.append(validate_trace(data_dir / "traces" / name))
        bar.advance(1)
    comparisons, trace_results = tuple(comparisons), tuple(trace_results)
    simai_results = aicb = None
    if simai:
        fields = {**load_preset("clusters", AICB_CLUSTER), "num_gpus": AICB_GPUS}
        aicb = compare_aicb_log(data_dir / AICB_LOG, ClusterConfig(**fields), tp=AICB_TP)
        workload = read_workload(data_dir / SIMAI_WORKLOAD)
        fields = {**load_preset("clusters", SIMAI_CLUSTER), "num_gpus": SIMAI_SYSTEM.num_gpus}
        bar.advance(1)
        simai_results = (simulate_analytical(workload, SIMAI_SYSTEM),
                         simulate_flowsim(workload, ClusterConfig(**fields)))
        bar.advance(1)
    bar.close()
    return AccuracyReport(runs=runs, nccl=comparisons, traces=trace_results, simai=simai_results, aicb=aicb,
                          runs_uncalibrated=runs_uncalibrated)


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f} %"


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _calibration_note(report) -> str:
    """What the shipped calibration profile contributes: the uncalibrated figure and its cross-validated error."""
    from flowsim.kernels.calibration import load_profile

    if report.runs_uncalibrated is None:
        return ""
    errors = dict(load_profile("default").errors)
    return (f" with the shipped calibration profile (in-sample; its leave-one-source-out median is "
            f"{errors['loso_median_pct']:.1f} %, docs/CALIBRATION.md), "
            f"{report.runs_uncalibrated.summary.median_abs_error_pct:.1f} % without it (`--calibration none`)")


def _runs_section(runs) -> list[str]:
    s = runs.summary
    out = ["## 1. Training step time (runs CSV)", "",
           f"`flowsim validate ../shared/data/{RUNS_CSV}`: {s.n} runs compared, {len(runs.skipped)} skipped. "
           f"|error| median {s.median_abs_error_pct:.1f} %, mean {s.mape_pct:.1f} %, p90 {s.p90_abs_error_pct:.1f} %, "
           f"Spearman {s.spearman:.3f}.", "",
           "![predicted vs measured step time](img/step_time_scatter.png)",
           "![error by GPU count](img/step_time_error_by_gpus.png)", "", "Per source:", ""]
    out.append(_table(["source", "runs", "median abs error", "MAPE", "p90 abs error", "Spearman"],
                      [[k, v.n, f"{v.median_abs_error_pct:.1f} %", f"{v.mape_pct:.1f} %",
                        f"{v.p90_abs_error_pct:.1f} %", f"{v.spearman:.3f}"] for k, v in runs.by_source.items()]))
    worst = sorted(runs.rows, key=lambda r: -abs(r.error_pct))[:10]
    out += ["", "Largest errors:", "",
            _table(["id", "source", "model", "GPU", "GPUs", "tp/pp/dp/cp", "measured (s)", "predicted (s)", "error"],
                   [[r.id, r.source, r.model, r.gpu, r.num_gpus, r.layout, f"{r.measured_step_time_s:.3f}",
                     f"{r.predicted_step_time_s:.3f}", f"{r.error_pct:+.1f} %"] for r in worst]), ""]
    return out


def _nccl_section(nccl) -> list[str]:
    rows = [[d.file, d.section, d.cluster + "".join(f", {k} {v}" for k, v in d.options), c.summary.n_large,
             _pct(c.summary.median_abs_error_large), _pct(c.summary.max_abs_error_large), c.summary.n_small,
             _pct(c.summary.median_abs_error_small)] for d, c in nccl]
    return ["## 2. Collectives (nccl-tests logs)", "",
            "`flowsim validate-nccl LOG --cluster ...` per row (commands in docs/NCCL.md). busbw error = predicted / "
            "measured busbw - 1.", "",
            _table(["log", "section", "cluster and options", "rows >= 1 MiB", "median abs err", "max abs err",
                    "rows < 1 MiB", "median abs err"], rows), "",
            "![busbw measured vs predicted](img/nccl_busbw.png)", ""]


def _traces_section(traces) -> list[str]:
    out = ["## 3. Kernels and collectives in profiler traces", "",
           "`flowsim validate-trace TRACE` per trace. error = predicted / measured - 1 (median signed, p90 of "
           "|error|). "
           "Collective instances that waited for peers (slower than 1.25 x the fastest instance moving at least as "
           "many bytes on the same group) or ran mostly beside compute are counted apart (docs/VALIDATION.md).", ""]
    for t in traces:
        out += [f"**{t.trace}** (GPU {t.gpu}; kernel time {t.total_kernel_s / US:.0f} us, not priced "
                f"{100 * t.unpriced_kernel_s / max(t.total_kernel_s, 1e-30):.0f} %)", "",
                _table(["ops", "counted", "median error", "p90 abs error", "waiting", "overlapped"],
                       [[r["group"], r["count"], f"{100 * r['median_error']:+.1f} %", _pct(r["p90_abs_error"]),
                         r["excluded_waiting"], r["excluded_overlapped"]] for r in t.summary()]), ""]
    out += ["![trace kernels predicted vs measured](img/trace_kernels.png)", ""]
    return out


def _simai_section(simai) -> list[str]:
    a, f = simai
    rows = [[r["part"], f"{r['simai_us']:,.0f}", f"{r['flowsim_us']:,.0f}", f"{r['difference_us']:+,.0f}"]
            for r in breakdown_rows(a, f)]
    return ["## 4. SimAI example workload", "",
            f"`flowsim simai run ../shared/data/{SIMAI_WORKLOAD} --simai-analytical -g 9216 -nv 360 -nic 48.5 "
            f"-n_p_s 8 -g_p_s 8` reproduces SimAI-Analytical's published 7,545,619 us: {a.total_s / US:,.0f} us. "
            f"flowsim's own prediction (`--cluster {SIMAI_CLUSTER}`, {f.schedule}): {f.total_s / US:,.0f} us.", "",
            _table(["part (us)", "SimAI-Analytical", "flowsim", "flowsim - SimAI"], rows), ""]


def _aicb_section(aicb) -> list[str]:
    rows = [[r.op, r.group, r.n_ranks, f"{r.size_bytes:,}", r.calls, f"{r.measured_s / US:,.1f}",
             f"{r.predicted_s / US:,.1f}", f"{100 * r.error:+.1f} %", f"{r.algo}/{r.proto}"]
            for r in aicb.rows.itertuples()]
    skipped = ", ".join(f"{n} {reason}" for reason, n in aicb.skipped.items())
    return ["## 5. Collectives measured by AICB (8 x A100)", "",
            f"`flowsim simai aicb-log ../shared/data/{AICB_LOG} --cluster {AICB_CLUSTER} --tp {AICB_TP}`: median time "
            f"per collective and size >= 1 MiB (skipped rows: {skipped}).", "",
            _table(["op", "group", "ranks", "size (B)", "calls", "measured median (us)", "flowsim (us)", "error",
                    "flowsim algo"], rows), ""]


def render_markdown(report: AccuracyReport, data_dir: str = "../shared/data") -> str:
    """The markdown of docs/ACCURACY.md.

    Parameters
    ----------
    report : AccuracyReport
        What to show.
    data_dir : str, optional
        Data folder as shown in the commands.

    Returns
    -------
    str
    """
    out = ["# flowsim accuracy", "",
           f"Generated by `flowsim report docs --data-dir {data_dir}` from the shared data sets; every figure is the "
           "one the named command prints. Do not edit by hand.", "", "## Headline", ""]
    if report.runs:
        s = report.runs.summary
        out.append(f"- Training step time: {s.n} published runs, median |error| {s.median_abs_error_pct:.1f} %, "
                   f"p90 {s.p90_abs_error_pct:.1f} %, Spearman {s.spearman:.3f}{_calibration_note(report)}.")
    if report.nccl:
        med = sorted(c.summary.median_abs_error_large for _, c in report.nccl)
        out.append(f"- Collectives: {len(report.nccl)} nccl-tests comparisons; median |busbw error| at >= 1 MiB "
                   f"is below 10 % in {sum(m < 0.10 for m in med)} of them (median of medians "
                   f"{100 * med[len(med) // 2]:.1f} %).")
    for t in report.traces:
        gemm = next((r for r in t.summary() if r["group"] == "gemm"), None)
        if gemm:
            out.append(f"- GEMMs in {t.trace}: {gemm['count']} ops, median error {100 * gemm['median_error']:+.1f} %, "
                       f"p90 |error| {100 * gemm['p90_abs_error']:.1f} %.")
    if report.simai:
        out.append(f"- SimAI-Analytical compatibility: {report.simai[0].total_s / US:,.0f} us "
                   "(SimAI: 7,545,619 us).")
    if report.aicb is not None and len(report.aicb.rows):
        err = report.aicb.rows.error
        out.append(f"- Collectives measured by AICB on 8 x A100: {len(err)} (op, size) medians, error from "
                   f"{100 * err.min():+.0f} % to {100 * err.max():+.0f} % (its timer adds tens of us; see section 5).")
    out.append("")
    if report.runs:
        out += _runs_section(report.runs)
    if report.nccl:
        out += _nccl_section(report.nccl)
    if report.traces:
        out += _traces_section(report.traces)
    if report.simai:
        out += _simai_section(report.simai)
    if report.aicb:
        out += _aicb_section(report.aicb)
    return "\n".join(out)


def write_report(report: AccuracyReport, out_dir: str | Path, data_dir: str = "../shared/data") -> list[Path]:
    """Write ``ACCURACY.md`` and its PNG plots (``img/``) into ``out_dir``.

    Parameters
    ----------
    report : AccuracyReport
        From :func:`run_report`.
    out_dir : str or Path
        Folder (created if needed).
    data_dir : str, optional
        Data folder as shown in the commands.

    Returns
    -------
    list of Path
        The files written.
    """
    from flowsim.validation.report_plots import write_plots

    out_dir = Path(out_dir)
    (out_dir / "img").mkdir(parents=True, exist_ok=True)
    md = out_dir / "ACCURACY.md"
    md.write_text(render_markdown(report, data_dir) + "\n")
    return [md, *write_plots(report, out_dir / "img")]


def main(argv=None) -> None:
    """``python -m flowsim.validation.report [OUT_DIR] [DATA_DIR]``: the whole report."""
    argv = sys.argv[1:] if argv is None else argv
    out = argv[0] if argv else "docs"
    data = argv[1] if len(argv) > 1 else "../shared/data"
    for path in write_report(run_report(data), out, data):
        print(path)


if __name__ == "__main__":
    main()
