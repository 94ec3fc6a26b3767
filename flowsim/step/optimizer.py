"""The optimizer step of one GPU of every pipeline stage."""
from __future__ import annotations

import numpy as np

from flowsim.kernels import KERNEL_MIN_TIME_S
from flowsim.kernels.memory import memory_reference, stream_efficiency
from flowsim.model.fusion import eager_grad_bytes_per_param
from flowsim.model.workload import ADAM_BYTES_PER_PARAM
from flowsim.step.data_parallel import zero_level


def optimizer_s(cfg, wl, gpu) -> np.ndarray:
    """Adam step of one GPU of every stage, float64[p] seconds: memory-bound over the local parameter shard
    (``ADAM_BYTES_PER_PARAM`` per parameter at the GPU's measured streaming bandwidth), plus, with eager kernels,
    PyTorch's per-parameter data-parallel gradient work (:mod:`flowsim.model.fusion`); at least one kernel's
    floor."""
    t = cfg.training
    zero = zero_level(t)
    edp = t.tp * t.cp * t.dp // (t.ep * t.expert_tensor_parallel_size)
    held = np.asarray(wl.stage_params) + np.asarray(wl.stage_expert_params)
    n = (np.asarray(wl.stage_params) / (t.dp_shard if zero >= 1 else 1)
         + np.asarray(wl.stage_expert_params) / (edp if zero >= 1 else 1))
    nbytes = ADAM_BYTES_PER_PARAM * n
    if t.kernel_fusion == "eager" and t.dp * t.cp > 1:
        nbytes = nbytes + eager_grad_bytes_per_param(zero, cfg.num_microbatches) * held
    eff = stream_efficiency(memory_reference(gpu).measured)
    return np.maximum(nbytes / (gpu.hbm_Bps * eff), KERNEL_MIN_TIME_S)
