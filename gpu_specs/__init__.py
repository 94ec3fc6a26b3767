"""GPU datasheets: one YAML file per GPU in ``data/``, loaded into :class:`GPUSpec` records in SI units."""
from flowsim.gpu_specs.catalog import get_gpu, gpu_keys, is_builtin, list_gpus
from flowsim.gpu_specs.loader import load_spec_file
from flowsim.gpu_specs.spec import GPUSpec

__all__ = ["GPUSpec", "get_gpu", "gpu_keys", "is_builtin", "list_gpus", "load_spec_file"]
