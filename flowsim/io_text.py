"""Reading input files and checking output paths, with one policy for every reader.

Input text is UTF-8; a leading UTF-8 byte-order mark (what spreadsheet programs write) is dropped; any other
encoding, a binary file, a truncated gzip stream, JSON with ``NaN``/``Infinity`` or YAML nested or sized beyond
any config is a one-line :class:`flowsim.ConfigError` naming the file. Output paths are checked before any work
starts, and no directory is created that the user did not name.

Layer 0: imports nothing from flowsim but :mod:`flowsim.errors`.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import tempfile
import zlib
from pathlib import Path

from flowsim.errors import ConfigError

BOM = b"\xef\xbb\xbf"
# YAML configs are a few kB and three levels deep (model/cluster/training); 16 MiB and 32 levels are far
# beyond any config yet keep the parser's recursion and memory bounded (a file of 50,000 '[' would otherwise
# exhaust Python's recursion limit).
MAX_YAML_BYTES = 16 * 2**20
MAX_YAML_DEPTH = 32


def decode(data: bytes, field: str, path) -> str:
    """UTF-8 text of ``data`` (a leading BOM dropped); ConfigError for other encodings or binary data."""
    if data.startswith(BOM):
        data = data[len(BOM):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(field, f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); save it as "
                          "UTF-8", str(path)) from None
    if "\x00" in text:
        raise ConfigError(field, "is a binary file, not text (NUL byte at offset "
                          f"{text.index(chr(0))})", str(path))
    return text


def read_bytes(path, field: str) -> bytes:
    """Bytes of ``path``; gzip-compressed files (``.gz``) are decompressed. ConfigError when unreadable."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(field, f"cannot read file: {e.strerror or e}", str(path)) from None
    if str(path).endswith(".gz") or data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as e:
            raise ConfigError(field, f"not a complete gzip file ({str(e) or type(e).__name__})", str(path)) from None
    return data


def read_text(path, field: str) -> str:
    """UTF-8 text of the file ``path`` (gzip allowed, BOM dropped); ConfigError naming ``field`` otherwise."""
    return decode(read_bytes(path, field), field, path)


def open_text(path, field: str) -> io.StringIO:
    """A text stream over :func:`read_text` (for csv readers; newlines kept as written)."""
    return io.StringIO(read_text(path, field), newline="")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} given twice")
        out[k] = v
    return out


def loads_json(text: str, field: str, path):
    """Parse JSON ``text``; ``NaN``, ``Infinity`` and ``-Infinity`` are errors, as in standard JSON, and so is a
    key repeated in one object."""
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(field, f"not valid JSON: {str(e).splitlines()[0] if str(e) else 'too deeply nested'}",
                          str(path)) from None


def read_json(path, field: str):
    """Parse the JSON file ``path`` under this module's policy."""
    return loads_json(read_text(path, field), field, path)


def _depth(obj, limit: int, level: int = 0) -> int:
    if level > limit:
        return level
    children = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
    return max((_depth(c, limit, level + 1) for c in children), default=level)


def _yaml_loader():
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (PyYAML keeps the last silently)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        keys = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                repeated = key in keys
                keys.add(key)
            except TypeError:  # an unhashable key: the base constructor reports it
                repeated = False
            if repeated:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
        return loader.construct_mapping(node, deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Loader


def loads_yaml(text: str, field: str, path):
    """Parse YAML ``text`` like ``yaml.safe_load``, bounded in size and nesting depth; a key repeated in one
    mapping is an error."""
    import yaml

    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(field, f"YAML file larger than {MAX_YAML_BYTES // 2**20} MiB", str(path))
    try:
        data = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        data = None
        deep = True
    except yaml.YAMLError as e:
        raise ConfigError(field, f"not valid YAML: {str(e).splitlines()[0]}", str(path)) from None
    else:
        deep = _depth(data, MAX_YAML_DEPTH) > MAX_YAML_DEPTH
    if deep:
        raise ConfigError(field, f"YAML nested deeper than {MAX_YAML_DEPTH} levels", str(path))
    return data


def check_output_file(path, field: str) -> None:
    """Raise ConfigError unless ``path`` can be written as a file: its folder exists and is writable and it is
    not a folder itself. ``-`` (stdout) passes. Nothing is created."""
    if str(path) == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise ConfigError(field, "is a directory; give a file path", str(path))
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(field, "folder does not exist (flowsim creates no folders you did not name)", str(path))
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(field, "is not writable", str(path))
    try:  # a probe: access() says yes to root on /proc and read-only mounts
        if p.exists():
            with open(p, "ab"):
                pass
        else:  # a scratch file beside it: creating and removing ``path`` itself would race with (and could
            # delete the file of) another process creating it at the same moment, as concurrent stores do
            tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        raise ConfigError(field, f"cannot be written ({e.strerror})", str(path)) from None


def check_output_dir(path, field: str) -> None:
    """Raise ConfigError unless ``path`` is a writable folder or can be made as one folder inside an existing,
    writable one. Nothing is created."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(field, "exists and is not a directory", str(path))
    target = p if p.is_dir() else p.parent
    if not target.is_dir():
        raise ConfigError(field, "parent folder does not exist (flowsim creates only the folder you named)",
                          str(path))
    if not os.access(target, os.W_OK):
        raise ConfigError(field, "is not writable", str(path))
    try:  # a probe, as in check_output_file
        if p.is_dir():
            tempfile.TemporaryFile(dir=p).close()
        else:
            p.mkdir()
            p.rmdir()
    except OSError as e:
        raise ConfigError(field, f"cannot be written ({e.strerror})", str(path)) from None
