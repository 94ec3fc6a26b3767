"""Record the ops and collectives one rank of a large job issues, on CPU, with no GPU and no network.

``capture(step, world_size=512)`` initialises ``torch.distributed`` on PyTorch's fake process group (every
collective returns at once, nothing is sent), runs ``step`` under ``FakeTensorMode`` (tensors carry shape,
dtype and device but no memory) and watches every dispatched op with a ``TorchDispatchMode``:

* compute ops become op-table rows (:mod:`flowsim.capture.convert`): GEMMs with ``m, n, k, batch``,
  SDPA flash attention with its shape, everything else a memory-bound row of its input + output bytes;
* ProcessGroup (``c10d``) and functional (``_c10d_functional``) collectives become collective rows with the
  nccl-tests op name and size and the global ranks of their group.

Overlap (stream) structure. A collective is *blocking* (the compute stream waits for it) unless the
framework lets compute run beside it:

* functional collectives (DTensor / tensor parallelism) are asynchronous until their ``wait_tensor``;
* DDP's bucket all-reduces are asynchronous from the moment their bucket is ready in backward until the
  end of the backward pass (where DDP waits for all of them). The fake process group completes the
  reducer's futures with no value, which DDP rejects, so during capture every DDP gets a communication
  hook that does what DDP's default hook does (divide the bucket by the group size, all-reduce it) and
  records the end-of-backward wait;
* FSDP2 (recognised by its copy-in kernels right before each collective) runs its all-gathers and
  reduce-scatters on side streams: an all-gather is waited by its copy-out kernel and may start
  (``issue``) where the previous all-gather was copied out (one-layer prefetch, as FSDP2's implicit
  forward and explicit backward prefetching give); a reduce-scatter is waited where the next one is
  issued, the last one at the end of the step;
* other ProcessGroup collectives (broadcasts, send/recv, user calls) are blocking.

Workarounds for running frameworks on fake tensors (applied only inside :func:`session`):
DDP's start-up check of parameter shapes across ranks reads tensor values and is skipped; DeviceMesh
construction (which reads its rank table) runs outside the fake mode; after each warm-up step DDP's
buckets are rebuilt, as DDP does after its first iteration, so that the recorded step has the
steady-state buckets (the int32 index tensor the rebuild fills is real, everything else stays fake); a
rebuild DDP starts itself at the next forward gets the same real int32 tensor. The coalesced c10d
collectives (``torch.distributed._coalescing_manager``, Megatron-core's DDP), which torch registers without
a Meta kernel, get their CPU kernel as one (it hands the tensors to the fake group). ``all_gather_object``
gives every rank this rank's object and ``broadcast_object_list`` keeps this rank's list (the real ones
read pickled sizes from tensors).

Rows the autograd engine issues (the backward pass, its hooks and callbacks) are tagged
``backward: True``; point-to-point rows (send / recv, isend / irecv, ``batch_isend_irecv``) carry the
peer's global rank (``peer``) and are blocking.
"""
from __future__ import annotations

import contextlib
import sys
import warnings

from flowsim.capture import convert
from flowsim.capture.data import CapturedWorkload, Stage
from flowsim.errors import ConfigError, FlowsimWarning

KNOWN_OTHER_MEMORY_OPS = {"fsdp.all_gather_copy_in.default", "fsdp.split_with_sizes_copy.default",
                          "fsdp.chunk_cat.default"}
"""Non-aten ops that are plain copies (FSDP2's packing kernels): memory rows without a warning."""


def _make_recorder():
    """The dispatch mode class (built lazily so that importing flowsim never imports torch)."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    plain_types = (torch.Tensor, torch.nn.Parameter, FakeTensor)

    class _Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.groups = {}
            self.paused = False
            self.ddp_async = False      # set by the DDP hook around its all-reduce
            self.reset()

        def reset(self):
            """Start a new op list (the process groups seen so far are kept)."""
            self.ops, self.unknown = [], set()
            self.ddp_pending = []       # DDP all-reduces waiting for the end of backward
            self.functional = {}        # id(output tensor) -> index of its functional collective
            self.fsdp_gathers = []        # FSDP2 all-gathers not yet copied out
            self.fsdp_copy_out = None     # index of the last FSDP2 copy-out
            self.fsdp_scatter = None      # index of the last FSDP2 reduce-scatter

        def append(self, row):
            """Record ``row``, tagged ``backward`` when the autograd engine issued it."""
            if torch._C._current_graph_task_id() != -1:
                row["backward"] = True
            self.ops.append(row)

        def group_key(self, pg) -> str:
            ranks = tuple(dist.get_process_group_ranks(pg))
            for key, r in self.groups.items():
                if tuple(r) == ranks:
                    return key
            key = f"g{len(self.groups)}"
            self.groups[key] = list(ranks)
            return key

        def record_comm(self, name, func_args, out):
            op, tensor_index, times_group = convert.C10D_OPS[name]
            if name.startswith("_c10d_functional"):
                pg = dist.distributed_c10d._resolve_process_group(func_args[-1])
            else:
                pg = next(dist.ProcessGroup.unbox(a) for a in func_args if isinstance(a, torch.ScriptObject))
            key = self.group_key(pg)
            size = convert.tensor_bytes(func_args[tensor_index])
            if times_group:
                size *= len(self.groups[key])
            row = {"type": "comm", "name": name, "op": op, "size_bytes": int(size),
                   "dtype": convert.first_float_dtype([func_args[tensor_index]]), "group": key,
                   "blocking": True, "wait": None}
            if name in convert.P2P_OPS:
                row["peer"] = self.groups[key][func_args[2]]  # the op takes the peer's rank in the group
            idx = len(self.ops)
            prev = self.ops[-1]["name"] if self.ops else ""
            if name.startswith("_c10d_functional"):
                row["blocking"] = False
                self.functional[id(out)] = idx
            elif self.ddp_async:
                row["blocking"] = False
                self.ddp_pending.append(idx)
            elif op == "allgather" and prev == "fsdp.all_gather_copy_in.default":
                # FSDP2: waited by its copy-out (fsdp.split_with_sizes_copy, see record_compute); prefetched
                # one layer ahead, so it may start where the previous gather was copied out
                row["blocking"] = False
                if not self.fsdp_gathers and self.fsdp_copy_out is not None:
                    row["issue"] = self.fsdp_copy_out
                self.fsdp_gathers.append(idx)
            elif op == "reducescatter" and prev == "fsdp.chunk_cat.default":
                # FSDP2: a reduce-scatter is waited when the next one is issued (or at the end of the step)
                row["blocking"] = False
                if self.fsdp_scatter is not None:
                    self.ops[self.fsdp_scatter]["wait"] = idx
                self.fsdp_scatter = idx
            self.append(row)

        def record_wait(self, func_args):
            idx = self.functional.pop(id(func_args[0]), None)
            if idx is not None:
                self.ops[idx]["wait"] = len(self.ops)

        def end_of_backward(self):
            for idx in self.ddp_pending:
                self.ops[idx]["wait"] = len(self.ops)
            self.ddp_pending = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(t not in plain_types for t in types):
                # a tensor subclass (DTensor) runs first; the ops it issues on its local shards come back here
                return NotImplemented
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if self.paused:
                return out
            name = str(func)
            if name in convert.C10D_OPS:
                self.record_comm(name, args, out)
            elif name == convert.FUNCTIONAL_WAIT:
                self.record_wait(args)
            elif name not in convert.NO_KERNEL_OPS:
                self.record_compute(name, func, args, kwargs, out)
            return out

        def record_compute(self, name, func, args, kwargs, out):
            nbytes = convert.compute_bytes(name, list(args) + list(kwargs.values()), out)
            if name in convert.GEMM_OPS:
                row = convert.gemm_row(name, args)
            elif name in convert.ATTN_FWD_OPS or name in convert.ATTN_BWD_OPS:
                row = convert.attention_row(name, args, kwargs, name in convert.ATTN_BWD_OPS)
            else:
                row = {"kind": "memory", "dtype": convert.first_float_dtype(list(args) + [out]), "flops": 0}
                known = (name.startswith("aten.") and func._overloadpacket not in flop_registry) \
                    or name in KNOWN_OTHER_MEMORY_OPS
                if not known:
                    self.unknown.add(name)
            row.update(type="compute", name=name, bytes=int(nbytes))
            if name == "fsdp.split_with_sizes_copy.default" and self.fsdp_gathers:
                self.ops[self.fsdp_gathers.pop(0)]["wait"] = len(self.ops)
                self.fsdp_copy_out = len(self.ops)
            self.append(row)

    return _Recorder


@contextlib.contextmanager
def patched(obj, attr, value):
    """Set ``obj.attr = value`` within the block."""
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, old)


def _framework_patches(stack, recorder, ddps):
    """Apply the fake-tensor workarounds of the module docstring on ``stack`` (an ExitStack)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import torch.nn.parallel.distributed as ddp_mod
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def outside_fake(fn):
        def wrapper(*args, **kwargs):
            with unset_fake_temporarily():
                return fn(*args, **kwargs)
        return wrapper

    ddp_cls = ddp_mod.DistributedDataParallel
    ddp_init = ddp_cls.__init__

    def hook(group, bucket):
        buf = bucket.buffer()
        n = dist.get_world_size(group)
        buf.div_(n)
        if not recorder.ddp_pending:
            torch.autograd.Variable._execution_engine.queue_callback(recorder.end_of_backward)
        recorder.ddp_async = True
        try:
            dist.all_reduce(buf, group=group, async_op=True)
        finally:
            recorder.ddp_async = False
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    def init(self, *args, **kwargs):
        ddp_init(self, *args, **kwargs)
        self.register_comm_hook(self.process_group, hook)
        ddps.append(self)

    pre_forward = ddp_cls._pre_forward

    def pre_forward_real_ints(self, *args, **kwargs):
        # a bucket rebuild not settled by Session.settle_ddp (a script without step markers) runs here
        with _real_int_tensors():
            return pre_forward(self, *args, **kwargs)

    stack.enter_context(_meta_kernels_for_coalesced_collectives())
    for module in (dist, dist.distributed_c10d):
        stack.enter_context(patched(module, "all_gather_object", _all_gather_object))
        stack.enter_context(patched(module, "broadcast_object_list", _broadcast_object_list))
    stack.enter_context(patched(ddp_mod, "_verify_param_shape_across_processes", lambda *a, **k: None))
    stack.enter_context(patched(ddp_cls, "__init__", init))
    stack.enter_context(patched(ddp_cls, "_pre_forward", pre_forward_real_ints))
    stack.enter_context(patched(device_mesh.DeviceMesh, "__init__", outside_fake(device_mesh.DeviceMesh.__init__)))
    original_init_mesh = device_mesh.init_device_mesh
    wrapped_init_mesh = outside_fake(original_init_mesh)
    # every module that already imported the name (FSDP2's _fsdp_init, once anything imported it) calls it
    # through its own binding
    for module in [m for m in list(sys.modules.values()) if m is not None]:
        if getattr(module, "init_device_mesh", None) is original_init_mesh:
            stack.enter_context(patched(module, "init_device_mesh", wrapped_init_mesh))


def _all_gather_object(object_list, obj, group=None):
    """``torch.distributed.all_gather_object`` during a capture: every rank runs the same program, so every
    rank's object is this rank's (the real call pickles ``obj`` into a tensor and reads its size)."""
    object_list[:] = [obj] * len(object_list)


def _broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """``torch.distributed.broadcast_object_list`` during a capture: the list keeps this rank's objects."""


@contextlib.contextmanager
def _meta_kernels_for_coalesced_collectives():
    """Within the block, the c10d collectives of :data:`convert.C10D_OPS` that have no Meta kernel (the
    coalesced ones: ``allreduce_coalesced_``, ``allgather_into_tensor_coalesced_``,
    ``reduce_scatter_tensor_coalesced_``, which ``torch.distributed._coalescing_manager`` issues, e.g. for
    Megatron-core's DDP buckets) run on fake tensors: their Meta kernel is their CPU kernel, which hands the
    tensors to the fake process group and returns its Work without touching the data."""
    import torch

    cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    lib = torch.library.Library("c10d", "IMPL")
    try:
        for qualified in convert.C10D_OPS:
            namespace, name, _ = qualified.split(".")
            if namespace == "c10d" and not torch._C._dispatch_has_kernel_for_dispatch_key(f"c10d::{name}", "Meta"):
                op = getattr(torch.ops.c10d, name).default
                lib.impl(name, lambda *args, _op=op: _op.redispatch(cpu, *args), "Meta")
        yield
    finally:
        lib._destroy()


def _real_int_tensors():
    """A dispatch mode under which new int32 tensors are real (DDP's bucket rebuild writes the bucket
    indices into one with a C++ accessor); every other op stays fake."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import TorchDispatchMode

    class _RealInts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten.empty.memory_format and kwargs.get("dtype") == torch.int32:
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)

    return _RealInts()


def _check_positive_int(field, value, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        rule = "must be a positive integer" if minimum == 1 else "must be a non-negative integer"
        raise ConfigError(field, rule, value)


def capture(step, *, world_size: int, rank: int = 0, setup=None, warmup_steps: int = 1,
            label: str = "") -> CapturedWorkload:
    """Run one training step of one rank of a ``world_size`` job on fake tensors and record what it issues.

    Parameters
    ----------
    step : callable
        ``step()`` (or ``step(state)`` with ``setup``): one training step (forward, backward, optimizer).
        It runs on CPU tensors that hold no data; write it device-agnostic (no ``.cuda()``), and create
        device meshes with ``torch.distributed.device_mesh.init_device_mesh("cpu", ...)``.
    world_size : int
        Ranks of the job, >= 1.
    rank : int, optional
        The rank to run (default 0), in ``[0, world_size)``.
    setup : callable, optional
        ``setup() -> state``: builds the model, parallel wrappers and optimizer once, unrecorded.
    warmup_steps : int, optional
        Unrecorded steps before the recorded one (default 1: DDP settles its buckets after its first
        iteration). Needs ``setup``, or a ``step`` that keeps its model between calls.
    label : str, optional
        Stored with the workload.

    Returns
    -------
    CapturedWorkload

    Raises
    ------
    ConfigError
        Bad ``world_size``/``rank``, torch.distributed already initialised, or a step (or setup) that raises
        (the message names the exception).
    """
    _check_positive_int("warmup_steps", warmup_steps, 0)
    with session(world_size, rank) as sess:
        state = _call("setup", setup) if setup is not None else None

        def run():
            return _call("step", step, *(() if setup is None else (state,)))

        for _ in range(warmup_steps):
            run()
            sess.settle_ddp()
        sess.recorder.paused = False
        run()
        sess.recorder.paused = True
    return sess.workload(label)


class Session:
    """An open capture (see :func:`session`): the recorder and the DDP modules built under it."""

    def __init__(self, recorder, ddps: list, world_size: int, rank: int):
        self.recorder, self.ddps, self.world_size, self.rank = recorder, ddps, world_size, rank

    def settle_ddp(self) -> None:
        """Rebuild every DDP's buckets in the order its gradients became ready, as DDP does after its first
        iteration (the int32 bucket-index tensor is real, everything else stays fake)."""
        with _real_int_tensors():
            for ddp in self.ddps:
                ddp.reducer._rebuild_buckets()

    def workload(self, label: str = "") -> CapturedWorkload:
        """The ops recorded so far as a single-stage workload; warns (FlowsimWarning) about unknown ops."""
        unknown = sorted(self.recorder.unknown)
        if unknown:
            warnings.warn(f"ops not known to the recorder, kept as memory-bound rows: {', '.join(unknown)}",
                          FlowsimWarning, stacklevel=3)
        return CapturedWorkload(world_size=self.world_size, stages=[Stage(rank=self.rank, ops=self.recorder.ops)],
                                groups=dict(self.recorder.groups), unknown_ops=unknown, label=label)


@contextlib.contextmanager
def session(world_size: int, rank: int):
    """Open a capture of rank ``rank`` of a ``world_size`` job: the fake process group as the default group,
    the framework workarounds of the module docstring, ``FakeTensorMode`` and a paused recorder.

    Yields
    ------
    Session
        Unpause ``session.recorder`` (``paused = False``) around what should be recorded.

    Raises
    ------
    ConfigError
        Bad ``world_size``/``rank``, torch not installed, or torch.distributed already initialised.
    """
    _check_positive_int("world_size", world_size)
    _check_positive_int("rank", rank, 0)
    if rank >= world_size:
        raise ConfigError("rank", f"must be < world_size ({world_size})", rank)
    try:
        import torch.distributed as dist
    except ImportError:
        raise ConfigError("torch", "is needed to capture: pip install flowsim[capture]", "not installed") from None
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ConfigError("torch.distributed", "is already initialised; capture starts its own fake process "
                                               "group", "an initialised default group")
    recorder = _make_recorder()()
    recorder.paused = True
    ddps = []
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with contextlib.ExitStack() as stack:
            _framework_patches(stack, recorder, ddps)
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            stack.enter_context(recorder)
            yield Session(recorder, ddps, world_size, rank)
    finally:
        dist.destroy_process_group()


def _call(what, fn, *args):
    try:
        return fn(*args)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of user code is reported as bad input
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(what, f"raised {type(e).__name__}: {first}") from e
