"""Run a script written for CUDA on the CPU fake tensors of a capture.

Inside :func:`cpu_for_cuda`:

* every ``device`` argument of a torch function that names CUDA (``"cuda"``, ``"cuda:3"``,
  ``torch.device("cuda", 3)``) names the CPU instead, so ``torch.randn(..., device="cuda")``,
  ``tensor.to(device)`` and ``nn.Linear(..., device=dev)`` make CPU fake tensors;
* ``Tensor.cuda()``, ``Tensor.pin_memory()``, ``Module.cuda()`` and a ``Module.to(device)`` that changes
  no dtype return their tensor or module unchanged (``Module._apply`` would try to swap the fake
  parameters with themselves, which fails);
* ``Tensor.type()`` names the CUDA type (``"torch.cuda.BFloat16Tensor"``): scripts check it (Megatron-core's
  mixed-precision optimizer refuses parameters of other types); ``Tensor.type(dtype)`` converts as usual;
* ``torch.autocast("cuda", ...)`` becomes CPU autocast, ``init_device_mesh("cuda", ...)`` a CPU mesh,
  ``DistributedDataParallel(model, device_ids=[local_rank])`` drops its (CUDA) ``device_ids``;
* ``torch.cuda.is_available()`` is True, ``device_count()`` is the ranks per node, ``current_device()``
  the local rank; ``set_device``, ``synchronize``, ``empty_cache``, ``manual_seed(_all)`` and
  ``set_rng_state(_all)`` do nothing, ``get_rng_state`` returns the CPU generator's state (RNG trackers such
  as Megatron-LM's save and restore it).

Other ``torch.cuda`` calls (streams, events, memory statistics) fail as they do on a CPU-only machine.
"""
from __future__ import annotations

import contextlib
import re

_CUDA = re.compile(r"cuda(:\d+)?")


def _cpu_device(value):
    """``value`` with a CUDA device replaced by the CPU; anything else unchanged."""
    import torch

    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, str) and _CUDA.fullmatch(value):
        return "cpu"
    return value


def _function_mode():
    """A TorchFunctionMode that moves CUDA device arguments to the CPU (see the module docstring)."""
    import torch
    from torch.overrides import TorchFunctionMode

    identity = {torch.Tensor.cuda, torch.Tensor.pin_memory}

    class _CpuForCuda(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in identity:
                return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:  # the type's name, as on CUDA
                return func(*args).replace("torch.", "torch.cuda.", 1)
            if func is torch.device:  # torch.device("cuda", 3) -> cpu, not cpu:3
                return _cpu_device(func(*args, **(kwargs or {})))
            kwargs = kwargs or {}
            if isinstance(kwargs.get("device"), int):  # device=3 means cuda:3
                kwargs = dict(kwargs, device="cpu")
            return func(*(_cpu_device(a) for a in args), **{k: _cpu_device(v) for k, v in kwargs.items()})

    return _CpuForCuda()


@contextlib.contextmanager
def cpu_for_cuda(local_rank: int, local_world_size: int):
    """Within the block, CUDA requests of a script land on the CPU (module docstring).

    Parameters
    ----------
    local_rank : int
        What ``torch.cuda.current_device()`` returns.
    local_world_size : int
        What ``torch.cuda.device_count()`` returns.
    """
    import torch
    import torch.distributed.device_mesh as device_mesh
    from torch.amp.autocast_mode import autocast
    from torch.nn.parallel import DistributedDataParallel as DDP

    from flowsim.capture.recorder import patched

    def new_no_op():
        # a new function per patched name: torch._dynamo refuses one object under two torch names
        return lambda *args, **kwargs: None

    autocast_init = autocast.__init__
    mesh_init = device_mesh.init_device_mesh
    ddp_init = DDP.__init__

    def cpu_autocast_init(self, device_type, *args, **kwargs):
        autocast_init(self, _cpu_device(device_type), *args, **kwargs)

    def cpu_init_device_mesh(device_type, *args, **kwargs):
        return mesh_init(_cpu_device(device_type), *args, **kwargs)

    def cpu_ddp_init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        ddp_init(self, module, None, None, *args, **kwargs)

    module_to = torch.nn.Module.to

    def device_only_to(self, *args, **kwargs):
        _, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        return self if dtype is None and memory_format is None else module_to(self, *args, **kwargs)

    cuda = {"is_available": lambda: True, "device_count": lambda: local_world_size,
            "current_device": lambda: local_rank, "set_device": new_no_op(), "synchronize": new_no_op(),
            "empty_cache": new_no_op()}
    rng = {"manual_seed": new_no_op(), "manual_seed_all": new_no_op(), "set_rng_state": new_no_op(),
           "set_rng_state_all": new_no_op(),
           "get_rng_state": lambda device="cuda": torch.get_rng_state(),
           "get_rng_state_all": lambda: [torch.get_rng_state()] * local_world_size}
    with contextlib.ExitStack() as stack:
        for name, fn in cuda.items():
            stack.enter_context(patched(torch.cuda, name, fn))
        for name, fn in rng.items():
            for module in (torch.cuda, torch.cuda.random):
                stack.enter_context(patched(module, name, fn))
        stack.enter_context(patched(autocast, "__init__", cpu_autocast_init))
        stack.enter_context(patched(DDP, "__init__", cpu_ddp_init))
        stack.enter_context(patched(torch.nn.Module, "cuda", lambda self, device=None: self))
        stack.enter_context(patched(torch.nn.Module, "to", device_only_to))
        for module in (device_mesh, torch.distributed):
            stack.enter_context(patched(module, "init_device_mesh", cpu_init_device_mesh))
        stack.enter_context(_function_mode())
        yield
