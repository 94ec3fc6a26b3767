"""The answer of one simulation: step time, throughput, MFU, memory and where the time goes."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class StepTimeline:
    """What a trace needs (see :mod:`flowsim.export.trace`, :mod:`flowsim.export.chakra`): the pipeline schedule (seconds),
    the p2p time and bytes, the layers (and MoE layers) of each chunk and how many of each re-run their
    ``recompute`` ops, the op table (``op_columns``: column name -> numpy array; :attr:`ops` its DataFrame view)
    with each op's seconds and the row span of each block, each layer block's collectives with their estimates,
    the group sizes, each stage's exposed data-parallel and optimizer seconds, and ``block_runs``: per block name,
    int64[p, 3], how many times one GPU of each stage runs the block's ``fwd``, ``bwd`` and ``recompute`` ops per
    step."""

    pipeline: PipelineTimeline
    p2p_s: float
    p2p_bytes: float
    chunk_layers: np.ndarray
    chunk_moe_layers: np.ndarray
    chunk_recompute_layers: np.ndarray
    chunk_recompute_moe_layers: np.ndarray
    op_columns: dict
    op_time_s: np.ndarray
    spans: dict
    comms: dict
    group_sizes: dict
    dp_exposed_s: tuple
    optimizer_s: tuple
    block_runs: dict

    @cached_property
    def ops(self):
        """The op table as a pandas DataFrame (:mod:`flowsim.kernels.ops` schema, plus ``name``, ``phase`` and
        ``count``), built on first use (imports pandas)."""
        import pandas as pd

        return pd.DataFrame(self.op_columns)


@dataclass(frozen=True)
class StageBreakdown:
    """Where one pipeline stage's step time goes, in seconds per optimizer step.

    Attributes
    ----------
    stage : int
        Pipeline rank (0 = first).
    compute_s : float
        Forward, backward and recompute kernels on the compute stream (excluding TP communication).
    tp_comm_s : float
        Tensor-parallel (and sequence-parallel) collectives on the critical path.
    cp_comm_s : float
        Context-parallel communication not hidden behind attention.
    pp_comm_s : float
        Pipeline send/receive time on this stage's critical path.
    ep_comm_s : float
        Expert-parallel token dispatch and combine (all-to-all) on the critical path.
    dp_comm_s : float
        Data-parallel gradient reduction / parameter gathering not hidden behind compute.
    bubble_s : float
        Time the stage waits on other stages (pipeline bubble).
    optimizer_s : float
        Optimizer step (parameter update kernels).
    memory_bytes : float
        Peak device memory of one GPU of this stage, bytes.
    """

    stage: int
    compute_s: float
    tp_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    bubble_s: float
    optimizer_s: float
    memory_bytes: float
    ep_comm_s: float = 0.0


@dataclass(frozen=True)
class CollectiveChoice:
    """One kind of collective issued in the step, with the NCCL algorithm and protocol chosen.

    Attributes
    ----------
    group : str
        Parallel dimension (``tp``, ``cp``, ``dp``, ``pp``).
    op : str
        Collective (``allreduce``, ``allgather``, ``reducescatter``, ``sendrecv``).
    size_bytes : float
        Message size in the nccl-tests convention.
    n_ranks : int
        Ranks in the communicator.
    algo, proto : str
        NCCL algorithm and protocol chosen.
    time_s : float
        Predicted time of one call.
    count_per_step : int
        Calls per optimizer step, summed over one GPU of each pipeline stage (a collective that only some
        stages issue, such as a data-parallel bucket of a given size, counts where it is issued).
    """

    group: str
    op: str
    size_bytes: float
    n_ranks: int
    algo: str
    proto: str
    time_s: float
    count_per_step: int


@dataclass(frozen=True)
class Result:
    """Prediction for one optimizer step of a training job.

    Conventions
    -----------
    * Times are seconds per optimizer step (all micro-batches, gradient reduction and optimizer).
    * Model FLOPs count the useful work only: 6 x (non-embedding parameters + LM head) per token for the
      dense GEMMs, plus attention ``12 * layers * seq * kv_channels * heads`` per token halved for causal
      masking (Megatron-LM / PaLM convention, causal); recompute is not counted.
      ``mfu = model_flops / (step_time_s * num_gpus * peak)`` with the dense peak of the GEMM dtype.
    * Hardware FLOPs include recompute; ``hfu`` uses them.
    * Exposed communication is the part of a stage's communication during which its compute stream is idle.

    Attributes
    ----------
    step_time_s : float
        Wall time of one optimizer step (the slowest stage's end).
    tokens_per_s : float
        Tokens per second of the whole job.
    model_flops : float
        Model FLOPs of one step (whole job).
    hardware_flops : float
        FLOPs executed including recompute (whole job).
    tflops_per_gpu : float
        Model TFLOP/s per GPU (model_flops / step / GPUs / 1e12).
    mfu, hfu : float
        Model and hardware FLOPs utilisation, fractions of the dense peak.
    peak_flop_per_s : float
        Dense peak of one GPU used for MFU, FLOP/s.
    memory_bytes_per_gpu : float
        Peak memory of the most loaded GPU, bytes.
    memory_capacity_bytes : float
        Device memory of one GPU, bytes.
    fits_memory : bool
        Whether ``memory_bytes_per_gpu`` fits in ``memory_capacity_bytes``.
    stages : tuple[StageBreakdown, ...]
        Per pipeline stage breakdown.
    collectives : tuple[CollectiveChoice, ...]
        Every distinct collective with its NCCL algorithm/protocol.
    config : dict
        The resolved configuration that produced this result.
    memory_detail : dict
        Bytes of weights, gradients, optimizer states, activations and the runtime outside the caching allocator
        (the CUDA context) on the most loaded GPU; they sum to ``memory_bytes_per_gpu``.
    timeline : StepTimeline or None
        The per-stage schedule and per-pass op sequence, for trace export (:mod:`flowsim.export.trace`).
    """

    step_time_s: float
    tokens_per_s: float
    model_flops: float
    hardware_flops: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    peak_flop_per_s: float
    memory_bytes_per_gpu: float
    memory_capacity_bytes: float
    fits_memory: bool
    stages: tuple = field(default_factory=tuple)
    collectives: tuple = field(default_factory=tuple)
    config: dict = field(default_factory=dict, repr=False)
    memory_detail: dict = field(default_factory=dict, repr=False)
    timeline: object = field(default=None, repr=False, compare=False)

    @property
    def memory_gb_per_gpu(self) -> float:
        """Peak memory of the most loaded GPU in GB (1e9 bytes)."""
        return self.memory_bytes_per_gpu / 1e9

    def breakdown(self) -> dict:
        """Critical-path breakdown of the slowest stage, seconds per step, by component."""
        s = max(self.stages, key=lambda x: x.compute_s + x.tp_comm_s + x.cp_comm_s + x.ep_comm_s + x.pp_comm_s
                + x.dp_comm_s + x.bubble_s + x.optimizer_s)
        return {"stage": s.stage, "compute_s": s.compute_s, "tp_comm_s": s.tp_comm_s, "cp_comm_s": s.cp_comm_s,
                "ep_comm_s": s.ep_comm_s, "pp_comm_s": s.pp_comm_s, "dp_comm_s": s.dp_comm_s,
                "bubble_s": s.bubble_s, "optimizer_s": s.optimizer_s}

    def to_dict(self) -> dict:
        """The stable JSON view (what ``flowsim estimate --json`` prints)."""
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops,
            "memory_gb_per_gpu": self.memory_gb_per_gpu,
            "memory_capacity_gb": self.memory_capacity_bytes / 1e9,
            "fits_memory": self.fits_memory,
            "memory_detail_gb": {k: v / 1e9 for k, v in self.memory_detail.items()},
            "breakdown": self.breakdown(),
            "stages": [asdict(s) for s in self.stages],
            "collectives": [asdict(c) for c in self.collectives],
            "config": self.config,
        }

    def to_frame(self):
        """One row per pipeline stage with its breakdown (seconds) and memory (bytes), a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame([asdict(s) for s in self.stages]).set_index("stage")

    def __repr__(self) -> str:
        return (f"Result(step_time_s={self.step_time_s:.4g}, tokens_per_s={self.tokens_per_s:.4g}, "
                f"mfu={self.mfu:.3f}, memory_gb_per_gpu={self.memory_gb_per_gpu:.1f}, "
                f"fits_memory={self.fits_memory})")
