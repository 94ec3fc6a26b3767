"""The built-in GPU catalogue: one YAML file per GPU in ``data/``, looked up by key or by file path."""
from __future__ import annotations

import functools
from pathlib import Path

from flowsim.errors import ConfigError
from flowsim.gpu_specs.loader import load_spec_file
from flowsim.gpu_specs.spec import GPUSpec

DATA_DIR = Path(__file__).resolve().parent / "data"


def gpu_keys() -> list[str]:
    """Keys of the built-in GPUs, sorted (the file names in ``data/`` without ``.yaml``)."""
    return list(_keys())


@functools.lru_cache(maxsize=1)
def _keys() -> tuple:
    return tuple(sorted(p.stem for p in DATA_DIR.glob("*.yaml")))


@functools.lru_cache(maxsize=None)
def _builtin(key: str) -> GPUSpec:
    spec = load_spec_file(DATA_DIR / f"{key}.yaml")
    if spec.key != key:
        raise ConfigError(f"{key}.yaml: key", "must equal the file name", spec.key)
    return spec


def get_gpu(name_or_path: str) -> GPUSpec:
    """Return a GPU's datasheet record by built-in key or from a user YAML spec file.

    Parameters
    ----------
    name_or_path : str
        A built-in key such as ``"h100-sxm"`` (case-insensitive), or the path of a YAML spec file for an
        unlisted GPU (same format as the built-in files, see :mod:`flowsim.gpu_specs.loader`).

    Returns
    -------
    GPUSpec

    Raises
    ------
    ConfigError
        ``gpu: unknown GPU; known: ...`` for a name that is neither a key nor an existing file, or the
        validation error of the spec file.
    """
    name = str(name_or_path).strip()
    if name.lower() in _keys():
        return _builtin(name.lower())
    path = Path(name).expanduser()
    if path.is_file():
        return load_spec_file(path)
    raise ConfigError("gpu", f"unknown GPU; known: {', '.join(gpu_keys())} (or a path to a YAML spec file)", name)


def list_gpus() -> list[GPUSpec]:
    """All built-in GPUs, sorted by key."""
    return [_builtin(k) for k in gpu_keys()]


def is_builtin(gpu: GPUSpec) -> bool:
    """True when ``gpu`` is the built-in record itself (not a user spec file, nor a modified copy)."""
    return gpu.key in gpu_keys() and _builtin(gpu.key) is gpu
