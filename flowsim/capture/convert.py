"""Turn one dispatched aten / c10d call into a workload row (pure functions of shapes, no torch state).

Compute rows follow the op-table schema of :mod:`flowsim.kernels` (``kind``, ``dtype``, GEMM and attention
shapes, ``flops``, ``bytes``); collective rows carry the nccl-tests op name and size convention of
:func:`flowsim.nccl_models.predict`:

* allreduce, broadcast, sendrecv: the message (the tensor),
* allgather: the gathered output (per-rank input x ranks),
* reducescatter: the full input (per-rank output x ranks),
* alltoall: the whole send buffer.
"""
from __future__ import annotations

DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
          "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8"}
"""torch dtype -> op-table dtype; other dtypes (integers, bool, fp64) are priced as memory rows of fp32."""

GEMM_OPS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"}
ATTN_FWD_OPS = {"aten._scaled_dot_product_flash_attention.default",
                "aten._scaled_dot_product_flash_attention_for_cpu.default"}
ATTN_BWD_OPS = {name.replace(".default", "_backward.default") for name in ATTN_FWD_OPS}

# Ops that launch no kernel: views, metadata, allocation without initialisation, profiler markers.
NO_KERNEL_OPS = {
    "aten.view.default", "aten._unsafe_view.default", "aten.t.default", "aten.transpose.int",
    "aten.permute.default", "aten.expand.default", "aten.as_strided.default", "aten.detach.default",
    "aten.alias.default", "aten.slice.Tensor", "aten.select.int", "aten.unsqueeze.default",
    "aten.squeeze.dim", "aten.squeeze.default", "aten.reshape.default", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.unbind.int", "aten.chunk.default", "aten.empty.memory_format",
    "aten.empty_strided.default", "aten.new_empty.default", "aten.new_empty_strided.default",
    "aten.empty_like.default", "aten.set_.source_Storage",
    "aten.resize_.default", "aten.set_.source_Storage_storage_offset", "aten.unflatten.int",
    "aten.flatten.using_ints", "aten.view_as.default", "aten.is_same_size.default", "aten._local_scalar_dense.default",
    "aten.view_as_complex.default", "aten.view_as_real.default", "aten._conj.default",
    "prim.device.default", "prim.layout.default", "aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default",
    "aten.sym_storage_offset.default", "aten.record_stream.default", "aten.lift_fresh.default",
    "profiler._record_function_enter_new.default", "profiler._record_function_exit._RecordFunction",
    "aten.resize_storage_bytes_.default", "inductor.resize_storage_bytes_.default",
    "c10d.barrier.default",  # a synchronisation, not priced
}

# c10d (ProcessGroup) and _c10d_functional ops: op name -> (nccl-tests op, index of the tensor whose bytes
# give the nccl-tests size, multiply by group size?)
C10D_OPS = {
    "c10d.allreduce_.default": ("allreduce", 0, False),
    "c10d.allreduce_coalesced_.default": ("allreduce", 0, False),
    "c10d.broadcast_.default": ("broadcast", 0, False),
    "c10d._allgather_base_.default": ("allgather", 0, False),
    "c10d.allgather_into_tensor_coalesced_.default": ("allgather", 0, False),
    "c10d.allgather_.default": ("allgather", 0, False),
    "c10d._reduce_scatter_base_.default": ("reducescatter", 1, False),
    "c10d.reduce_scatter_tensor_coalesced_.default": ("reducescatter", 1, False),
    "c10d.reduce_scatter_.default": ("reducescatter", 1, False),
    "c10d.alltoall_base_.default": ("alltoall", 1, False),
    "c10d.alltoall_.default": ("alltoall", 1, False),
    "c10d.send.default": ("sendrecv", 0, False),
    "c10d.recv_.default": ("sendrecv", 0, False),
    "_c10d_functional.all_reduce.default": ("allreduce", 0, False),
    "_c10d_functional.all_reduce_coalesced.default": ("allreduce", 0, False),
    "_c10d_functional.broadcast.default": ("broadcast", 0, False),
    "_c10d_functional.all_gather_into_tensor.default": ("allgather", 0, True),
    "_c10d_functional.all_gather_into_tensor_coalesced.default": ("allgather", 0, True),
    "_c10d_functional.reduce_scatter_tensor.default": ("reducescatter", 0, False),
    "_c10d_functional.reduce_scatter_tensor_coalesced.default": ("reducescatter", 0, False),
    "_c10d_functional.all_to_all_single.default": ("alltoall", 0, False),
}
FUNCTIONAL_WAIT = "_c10d_functional.wait_tensor.default"
P2P_OPS = {"c10d.send.default", "c10d.recv_.default"}
"""Point-to-point ops; their third argument is the peer's rank in the op's group."""


def dtype_name(torch_dtype) -> str:
    """Op-table dtype of a torch dtype (fp32 for non-float dtypes)."""
    return DTYPES.get(str(torch_dtype), "fp32")


# Ops that take a tensor argument only for its shape and read none (or one element per row) of it:
# op name -> (index of that argument, elements read per row of the output). nll_loss picks the target's
# log-probability from each row (ATen NLLLoss.cpp); its backward writes the gradient from the target alone.
PARTLY_READ_ARGS = {
    "aten.nll_loss_forward.default": (0, 1),
    "aten.nll_loss_backward.default": (1, 0),
}


def compute_bytes(name: str, args: list, out) -> int:
    """Bytes a kernel reads and writes: its tensor arguments and outputs, less what it does not read
    (:data:`PARTLY_READ_ARGS`)."""
    nbytes = tensor_bytes(args) + tensor_bytes(out if isinstance(out, (list, tuple)) else [out])
    if name in PARTLY_READ_ARGS:
        index, per_row = PARTLY_READ_ARGS[name]
        skipped = args[index]
        rows = skipped.shape[0] if skipped.dim() > 1 else 1
        nbytes -= tensor_bytes(skipped) - rows * per_row * skipped.element_size()
    return nbytes


def tensor_bytes(t) -> int:
    """Bytes of a tensor, or of every tensor in a (nested) list/tuple; 0 for non-tensors."""
    if isinstance(t, (list, tuple)):
        return sum(tensor_bytes(x) for x in t)
    if hasattr(t, "element_size") and hasattr(t, "numel"):
        return int(t.numel()) * int(t.element_size())
    return 0


def first_float_dtype(values) -> str:
    """Op-table dtype of the first floating tensor among ``values`` (nested lists allowed), else fp32."""
    for v in values:
        if isinstance(v, (list, tuple)):
            found = first_float_dtype(v)
            if found != "fp32":
                return found
        elif hasattr(v, "dtype") and getattr(v.dtype, "is_floating_point", False):
            return dtype_name(v.dtype)
    return "fp32"


def gemm_row(name: str, args) -> dict:
    """GEMM row ``C[m, n] = A[m, k] B[k, n]`` (``batch`` independent products) of mm/addmm/bmm/baddbmm."""
    a, b = (args[0], args[1]) if name in ("aten.mm.default", "aten.bmm.default") else (args[1], args[2])
    if a.dim() == 3:
        batch, m, k = a.shape
        n = b.shape[2]
    else:
        batch, (m, k), n = 1, a.shape, b.shape[1]
    return {"kind": "gemm", "dtype": dtype_name(a.dtype), "m": int(m), "n": int(n), "k": int(k),
            "batch": int(batch), "flops": 2 * int(batch) * int(m) * int(n) * int(k)}


def attention_row(name: str, args, kwargs, backward: bool) -> dict:
    """FlashAttention row from q, k of shape [batch, heads, seq, head_dim] (SDPA layout).

    Backward ops take the output gradient first, then q, k, v. FLOP convention of flowsim.kernels
    (flash-attention's benchmark): forward ``4 b h s_q s_k d``, halved when causal; backward 2.5x.
    """
    q, k = (args[1], args[2]) if backward else (args[0], args[1])
    causal = bool(kwargs.get("is_causal", False))
    if not causal:
        # positional is_causal: flash fwd (q, k, v, dropout_p, is_causal, ...); bwd passes it after the
        # saved statistics; look for the first bool among the positional arguments
        causal = next((a for a in args if isinstance(a, bool)), False)
    b, h, sq, d = (int(x) for x in q.shape)
    hk, sk = int(k.shape[1]), int(k.shape[2])
    flops = 4 * b * h * sq * sk * d * (0.5 if causal else 1.0) * (2.5 if backward else 1.0)
    return {"kind": "attn_bwd" if backward else "attn_fwd", "dtype": dtype_name(q.dtype), "batch": b,
            "heads": h, "kv_heads": hk, "seq_q": sq, "seq_k": sk, "head_dim": d, "causal": causal,
            "flops": float(flops)}
