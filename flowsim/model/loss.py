"""The language-model loss: cross-entropy over the vocabulary shard's logits, as each implementation runs it.

Bytes read plus written per logit by each kernel, forward and backward (2-byte logits, fp32 where the code
upcasts; the per-token gathers of the target logit and the loss itself are left out;
:data:`flowsim.model.fusion.CROSS_ENTROPY_KERNELS`):

* ``fused``: one kernel each way that reads the 2-byte logits and writes the fp32 softmax (6), backward reads
  it and writes the 2-byte gradient (6): Megatron-core's ``cross_entropy_loss_fusion``
  (``fusions/fused_cross_entropy.py``, jit-fused) and Transformer Engine's Triton cross-entropy.
* ``megatron``: Megatron-LM's vocab-parallel cross-entropy as separate PyTorch ops (megatron-core 0.8.0
  ``tensor_parallel/cross_entropy.py``: ``.float()`` (read 2, write 4), ``torch.max`` (4), in-place ``-=`` the
  max (8), ``torch.exp(out=)`` (8), ``sum`` (4), ``div_`` by the sum (8) = 38; backward ``mul_`` of the saved
  softmax by the loss gradient (8) and the upcast's backward to 16 bits (read 4, write 2) = 14; the same ops in
  Megatron-LM 2021's ``mpu/cross_entropy.py`` after ``gpt_model.py``'s ``output.float()``).
* ``fp32_upcast``: ``F.cross_entropy(logits.float(), labels)`` (torchtitan, transformers): ``to(fp32)`` 6,
  ``_log_softmax`` 8; backward ``nll_loss_backward`` fills the fp32 gradient 4, ``_log_softmax_backward_data``
  12, ``to(bf16)`` 6 (read off :mod:`flowsim.capture` recordings, ``tests/test_fusion.py``).

Without a stated implementation (``TrainingConfig.cross_entropy_impl`` empty) the kernel set decides: ``fused``
kernels run ``fused``, eager PyTorch ``fp32_upcast``.
"""
from __future__ import annotations

from flowsim.model.fusion import CROSS_ENTROPY_KERNELS
from flowsim.model.ops import memory


def cross_entropy_impl(training) -> str:
    """The implementation a job runs: its ``cross_entropy_impl``, else the one of its kernel set."""
    if training.cross_entropy_impl:
        return training.cross_entropy_impl
    return "fused" if training.kernel_fusion == "fused" else "fp32_upcast"


def cross_entropy_rows(rows: list, name: str, impl: str, logits: float) -> None:
    """Append one memory-bound row per kernel of ``impl`` over ``logits`` logits (``name``, ``name.bwd``;
    several kernels of a phase are numbered ``name.1``, ...)."""
    for phase, per in zip(("fwd", "bwd"), CROSS_ENTROPY_KERNELS[impl]):
        base = name + (".bwd" if phase == "bwd" else "")
        for i, b in enumerate(per):
            rows.append(memory(base + (f".{i}" if i else ""), logits * b, phase))
