"""The step core: one optimizer step of a pipeline of stages, whatever built its program.

A step program says, per pipeline stage and model chunk, how long one micro-batch's forward, backward (and, for
the split-backward schedules, weight-gradient) pass takes on one GPU, how long an activation takes to reach the
next stage, and which communication a paired schedule can hide. Three front ends build it:

* the parametric model (:func:`flowsim.simulate`): passes from the workload's op tables
  (:mod:`flowsim.step.blocks`), then the data-parallel reduction (:mod:`flowsim.step.data_parallel`), optimizer
  and memory on top;
* captured workloads (:mod:`flowsim.capture.program`): passes from the captured op sequence run on the streams
  (:mod:`flowsim.step.streams`);
* SimAI/AICB workloads (:mod:`flowsim.validation.simai_flowsim`): passes from the file's micro-batch blocks.

All of them price collectives with :class:`flowsim.step.pricer.CollectivePricer`, share SMs by
:mod:`flowsim.step.overlap`, and run the pipeline here, in :func:`run_pipeline`, the one place that calls the
schedule simulator (:func:`flowsim.step.schedule.simulate_pipeline`), with each stage's CPU issuing its
passes (the host-side timeline, :mod:`flowsim.step.host`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowsim.step.host import PassHost
from flowsim.step.schedule import PipelineTimeline, simulate_pipeline


@dataclass(frozen=True)
class PipelineProgram:
    """Per-stage pass times of one step (seconds; arrays float64[p, v] over stages and model chunks).

    Attributes
    ----------
    schedule : str
        ``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1`` or ``dualpipe`` (:data:`flowsim.step.schedule.SCHEDULE_IDS`).
    microbatches : int
        Micro-batches per step.
    fwd_s, bwd_s : numpy.ndarray
        One micro-batch's forward and backward (with recompute) through each chunk, exposed communication
        included.
    p2p_s : float
        One activation (or gradient) transfer between neighbouring stages.
    wgrad_s : numpy.ndarray or None
        The weight-gradient part of ``bwd_s`` (run as a pass of its own by ``zb-h1`` and ``dualpipe``).
    hidden : tuple or None
        ``(comm_fwd_s, comm_bwd_s, sm_share)``: communication inside the passes that a paired
        forward-and-backward call hides (DualPipe, paired 1F1B), and the SM share it holds.
    paired : bool
        1F1B with each steady-state forward paired with the next backward.
    host : PassHost or None
        The CPU seconds to issue each pass and its issue lag (:func:`flowsim.step.host.pass_host`); None: the GPU
        never waits for the CPU.
    p2p_sync : bool
        The CPU waits for the GPU at every pipeline send and receive.
    engine : str
        ``megatron`` or ``deepspeed`` (DeepSpeed's pipeline engine: sends block the stream).
    """

    schedule: str
    microbatches: int
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    p2p_s: float = 0.0
    wgrad_s: np.ndarray | None = None
    hidden: tuple | None = None
    paired: bool = False
    host: PassHost | None = None
    p2p_sync: bool = False
    engine: str = "megatron"


@dataclass(frozen=True)
class PipelineRun:
    """The pipeline part of a step.

    Attributes
    ----------
    timeline : PipelineTimeline
        The schedule with the transfers.
    pp_exposed_s : float
        How much later the last stage ends than with free transfers (0 when not asked for), seconds.
    """

    timeline: PipelineTimeline
    pp_exposed_s: float


def run_pipeline(program: PipelineProgram, *, p2p_exposure: bool = False) -> PipelineRun:
    """Run the program's pipeline schedule; with ``p2p_exposure``, also measure what the transfers add to the
    step (the same schedule with free transfers, compared at the last stage's end)."""
    free = p2p_exposure and program.fwd_s.shape[0] > 1
    timeline = simulate_pipeline(program.schedule, program.microbatches, program.fwd_s, program.bwd_s, program.p2p_s,
                                 program.wgrad_s, program.hidden, paired=program.paired, host=program.host,
                                 p2p_sync=program.p2p_sync, engine=program.engine, free_transfers=free)
    exposed = max(0.0, float(timeline.end_s.max() - timeline.free_end_s)) if free else 0.0
    return PipelineRun(timeline=timeline, pp_exposed_s=exposed)


def step_end_s(timeline: PipelineTimeline, *tails_s) -> tuple[float, int]:
    """End of the step and the stage that ends it, seconds: each stage's last backward plus what runs after it
    (``tails_s``: float64[p] arrays or scalars, added in order, e.g. the exposed data-parallel communication and
    the optimizer step)."""
    ends = timeline.end_s
    for tail in tails_s:
        ends = ends + np.asarray(tail, dtype=np.float64)
    crit = int(np.argmax(ends))
    return float(ends[crit]), crit
