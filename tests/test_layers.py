"""Layers at import time (docs/ARCHITECTURE.md): the import graph read from the code (ast, module-level and
function-level imports) runs only from higher layers to lower ones and has no cycle; lower packages load in a
fresh interpreter without the layers above them; old module paths still import, with a DeprecationWarning.
"""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flowsim._moved import MOVED

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"flowsim": "flowsim", "kernels": "flowsim.kernels", "gpu_specs": "flowsim.gpu_specs",
           "nccl_models": "flowsim.nccl_models", "validation": "flowsim.validation"}
"""Source folder -> the package it installs as (setup.cfg package_dir)."""

LAYERS = (
    ("flowsim._jit", "flowsim._moved", "flowsim._numba_cache", "flowsim._version", "flowsim.errors",
     "flowsim.io_text", "flowsim.units"),
    ("flowsim.gpu_specs",),
    ("flowsim.kernels",),
    ("flowsim.nccl_models",),
    ("flowsim.config",),
    ("flowsim.model",),
    ("flowsim.network",),
    ("flowsim.step",),
    ("flowsim.capture", "flowsim.explore", "flowsim.export"),
    ("flowsim.calibrate",),
    ("flowsim.validation",),
    ("flowsim.cli", "flowsim.service", "flowsim"),
)
"""Layer order, lowest first: a module may import its own layer and the ones before it. ``flowsim`` is the
package front (flowsim/__init__.py, its public names loaded lazily): only the front ends use it.
``flowsim._moved`` (old import paths) names modules only as strings."""

PENDING: set = set()
"""Known upward or cyclic edges (importer, imported) being removed; empty: every edge follows the layers."""


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [SOURCES[rel.parts[0]]] + list(rel.parts[1:])
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict:
    mods = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts and not path.name.startswith("."):
                mods[_module_name(path)] = path
    return mods


MODULES = _modules()


def _target(name: str):
    """The flowsim module an import of dotted ``name`` loads (its longest known prefix), or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set:
    """Flowsim modules ``module`` imports anywhere in its file (lazy imports included)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]  # importlib.import_module("flowsim....")
        else:
            continue
        out.update(t for t in map(_target, names) if t and t != module)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str):
    """Index in LAYERS of the longest owner of ``module`` (the front ``flowsim`` owns only itself)."""
    best, level = -1, None
    for i, owners in enumerate(LAYERS):
        for owner in owners:
            owns = module == owner or (owner != "flowsim" and module.startswith(owner + "."))
            if owns and len(owner) > best:
                best, level = len(owner), i
    return level


def test_the_graph_holds_module_level_and_lazy_imports():
    assert "flowsim.config.layout" in GRAPH["flowsim.step.memory"]          # module level
    assert "flowsim.config.profiles" in GRAPH["flowsim.config.loader"]      # inside a function
    assert "flowsim.model.ops" in GRAPH["flowsim.model.moe"]                # from-import of names
    assert "flowsim.units" in GRAPH["flowsim.gpu_specs.loader"]             # import a.b as c


def test_every_module_has_a_layer():
    assert [m for m in MODULES if _layer(m) is None] == []


def test_no_import_points_up_a_layer():
    known = {m for m in MODULES if _layer(m) is not None}  # the others fail test_every_module_has_a_layer
    up = sorted((a, b) for a, targets in GRAPH.items() if a in known for b in targets
                if b in known and _layer(b) > _layer(a) and (a, b) not in PENDING)
    assert up == [], "imports against the layer order (importer, imported):\n" + "\n".join(map(str, up))


def _cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph.get(w, ())))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def test_cycle_finder_finds_chains():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other():
    graph = {a: {b for b in targets if (a, b) not in PENDING} for a, targets in GRAPH.items()}
    assert _cycles(graph) == []


def _loaded_after(statement: str) -> list:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


@pytest.mark.parametrize("package, numba_free", [("flowsim.gpu_specs", True), ("flowsim.nccl_models", True),
                                                 ("flowsim.kernels", False), ("flowsim.config", True)])
def test_a_lower_package_loads_without_the_layers_above(package, numba_free):
    loaded = _loaded_after(f"import {package}")
    above = [m for m in loaded if m.startswith("flowsim.")
             and _layer(m) is not None and _layer(m) > _layer(package)]
    assert above == []
    if numba_free:
        assert "numba" not in loaded


def test_the_package_front_loads_the_engine_on_first_use():
    loaded = _loaded_after("import flowsim; flowsim.__version__")
    assert "numba" not in loaded and "flowsim.step.simulate" not in loaded
    loaded = _loaded_after("import flowsim; flowsim.simulate")
    assert "flowsim.step.simulate" in loaded


def test_old_module_paths_warn_and_give_the_new_module():
    code = """
import importlib, json, sys, warnings
import flowsim
from flowsim._moved import MOVED
out = {}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = importlib.import_module(old)
    out[old] = [mod is sys.modules[new], [(w.category.__name__, str(w.message)) for w in caught]]
import flowsim.simulate
from flowsim.store import ResultStore
from flowsim.explore.store import ResultStore as new_store
out["front"] = [callable(flowsim.simulate) and not isinstance(flowsim.simulate, type(sys)), ResultStore is new_store]
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out.pop("front") == [True, True]
    for old, (same, caught) in out.items():
        assert same, old
        assert ["DeprecationWarning", f"{old} is deprecated; import {MOVED[old]}"] in caught, (old, caught)


def test_moved_names_warn_and_resolve():
    from flowsim.config.training import MEGATRON_MODULES
    from flowsim.model import ops, recompute, workload

    with pytest.warns(DeprecationWarning, match=r"^flowsim.model.workload.CommOp is deprecated; import it from "
                                                 r"flowsim.model.ops$"):
        assert workload.CommOp is ops.CommOp
    with pytest.warns(DeprecationWarning, match="import it from flowsim.config.training"):
        assert recompute.MEGATRON_MODULES is MEGATRON_MODULES
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        workload.nothing


def test_no_module_over_800_lines():
    long = {m: n for m, p in MODULES.items() if m.startswith("flowsim.") and p.is_relative_to(ROOT / "flowsim")
            for n in [len(p.read_text().splitlines())] if n > 800}
    assert long == {}
