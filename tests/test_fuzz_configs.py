"""Fuzz: generated configs (tests/fuzz_inputs.py) either fail with one ConfigError line or simulate to a result
that holds every invariant (flowsim.step.invariants) with no NaN or infinity anywhere in its JSON view.

``FLOWSIM_FUZZ_CONFIGS`` sets the number of examples (default 2,000, the CI run); a longer local run is in
docs/RELIABILITY.md. Examples are derandomized in CI (the same 2,000 each run); set ``FLOWSIM_FUZZ_SEED`` to
draw others. ``FLOWSIM_FUZZ_STATS=FILE`` switches to survey mode for the documented long run: every example runs
(a failure is counted and its first configs kept instead of stopping the run) and the counts (rejected,
simulated, each kind of failure, slowest example, examples over 10 s) are written to FILE as JSON; they are
figures for the docs, never asserted on.
"""
from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections import Counter

from hypothesis import HealthCheck, given, seed, settings

from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.step.invariants import check_result
from flowsim.step.simulate import simulate
from fuzz_inputs import configs

N_CONFIGS = int(os.environ.get("FLOWSIM_FUZZ_CONFIGS", "2000"))
SEED = os.environ.get("FLOWSIM_FUZZ_SEED")
STATS = os.environ.get("FLOWSIM_FUZZ_STATS")
SLOW_S = 10.0  # an example slower than this counts as a hang in the documented long run
_stats: Counter = Counter()
_slowest = [0.0, None]
_failures: dict = {}


def non_finite(obj, path="") -> list[str]:
    """Paths of every float in ``obj`` (nested dicts/lists) that is NaN or infinite."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in non_finite(v, f"{path}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in non_finite(v, f"{path}[{i}]")]
    return []


def run_one(cfg: dict) -> str:
    """``rejected`` (one-line ConfigError) or ``simulated`` (invariants hold, no NaN/inf); anything else raises."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy overflow / invalid value: a wrong number
        try:
            sim = build_config(cfg)
        except ConfigError as e:
            assert "\n" not in str(e) and str(e).startswith(f"{e.field}: "), str(e)
            return "rejected"
        try:
            result = simulate(sim)
        except ConfigError as e:  # a rule only the engine can check (e.g. the topology's radix)
            assert "\n" not in str(e), str(e)
            return "rejected"
        check_result(result)
        bad = non_finite(result.to_dict())
        assert not bad, f"non-finite values at {bad[:5]} for {cfg}"
    return "simulated"


_settings = settings(max_examples=N_CONFIGS, deadline=None, derandomize=SEED is None, database=None,
                     suppress_health_check=list(HealthCheck))


@_settings
@given(configs())
def _fuzz(cfg):
    start = time.perf_counter()
    if STATS:  # survey mode: count failures, keep going
        try:
            outcome = run_one(cfg)
        except Exception as e:  # noqa: BLE001 -- counted by kind, first examples kept
            outcome = f"failed: {type(e).__name__}"
            _failures.setdefault(outcome, []).append(f"{cfg!r}: {str(e)[:300]}")
    else:
        outcome = run_one(cfg)
    elapsed = time.perf_counter() - start
    _stats[outcome] += 1
    _stats["over_10_s"] += elapsed > SLOW_S
    if elapsed > _slowest[0]:
        _slowest[:] = [elapsed, repr(cfg)]


def test_generated_configs_reject_cleanly_or_simulate_correctly():
    _stats.clear()
    _failures.clear()
    (seed(int(SEED))(_fuzz) if SEED else _fuzz)()
    if STATS:
        with open(STATS, "w") as f:
            json.dump({"examples": sum(v for k, v in _stats.items() if k != "over_10_s"), **_stats,
                       "slowest_s": _slowest[0], "slowest_config": _slowest[1], "seed": SEED,
                       "failures": {k: {"count": len(v), "first": v[:5]} for k, v in _failures.items()}}, f, indent=1)
