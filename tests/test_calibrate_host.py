"""The host-cost multiplier: its profile field, the host model applying it, and the second calibration stage
(informed runs only; recovery on synthetic runs; refusal when fewer than 3 runs inform it)."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from flowsim.calibrate import Run
from flowsim.calibrate.host import INFORM_PCT, fit_host, host_key
from flowsim.config import build_config
from flowsim.config.cluster import CPUS
from flowsim.errors import ConfigError
from flowsim.kernels.calibration import (
    HOST_CPUS,
    PARAMETERS,
    Parameter,
    Profile,
    host_scale,
    load_profile,
    write_profile,
)
from flowsim.model.host_costs import block_host_s

HOST = PARAMETERS["host_multiplier"]


def _cfg(cpu="arm", release="megatron-bridge-25.11", host="te", gbs=8):
    cfg = build_config(dict(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=1, gbs=gbs, software_release=release,
                            host_overhead=host))
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, cpu=cpu))


def _profile(tmp_path, value, cpu="arm", family="megatron-bridge-2025", name="host.yaml"):
    path = tmp_path / name
    write_profile(Profile((Parameter("host_multiplier", cpu, family, value, HOST.range, 0.0, 3, "test", 0.0),)),
                  path)
    return str(path)


def test_cpu_families_match_the_config():
    assert HOST_CPUS == CPUS and HOST.scopes == CPUS


def test_profile_value_reaches_the_host_model(tmp_path):
    cfg = _cfg()
    table = {"name": np.array(["qkv", "attn"]), "kind": np.array(["gemm", "attn_fwd"]),
             "phase": np.array(["fwd", "fwd"]), "count": np.array([1, 1])}
    base = block_host_s(table, cfg.training, "arm")
    scaled = dataclasses.replace(cfg.training, calibration=_profile(tmp_path, 1.7))
    assert host_scale(scaled.calibration, scaled.software_release, "", "arm") == 1.7
    assert block_host_s(table, scaled, "arm") == pytest.approx(1.7 * base)
    # Another CPU family, or no calibration: untouched.
    assert block_host_s(table, scaled, "intel") == pytest.approx(block_host_s(table, cfg.training, "intel"))
    assert host_scale("none", scaled.software_release, "", "arm") == 1.0


def test_host_multiplier_on_a_gpu_generation_is_a_one_line_error(tmp_path):
    path = _profile(tmp_path, 1.2)
    raw = yaml.safe_load(open(path))
    raw["parameters"][0]["arch"] = "hopper"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"^calibration.parameters\[0\].arch: must be one of intel, amd, arm for "
                                          r"host_multiplier \(got hopper\)$"):
        load_profile(str(bad))


def test_host_key_needs_a_release_and_a_host_model():
    assert host_key(_cfg()) == "host_multiplier:arm:megatron-bridge-2025"
    assert host_key(_cfg(host="none")) == ""
    assert host_key(_cfg(release="")) == ""


def _synthetic_runs(tmp_path, truth):
    """Runs whose simulated step is gpu_s + h * host_s * multiplier (h = 1 for host-bound runs, 0 for GPU-bound
    ones), the multiplier read from the profile each simulation gets; measured at multiplier ``truth``."""
    rng = np.random.default_rng(0)
    runs, parts = [], {}
    for i, (src, bound) in enumerate([("A", 1), ("A", 1), ("B", 1), ("B", 1), ("C", 1), ("C", 0), ("A", 0)]):
        cfg = _cfg(gbs=8 * (i + 1))
        gpu_s, host_s = rng.uniform(1.0, 2.0), rng.uniform(0.5, 1.0) * bound
        parts[cfg.training.global_batch_size] = (gpu_s, host_s)
        runs.append(Run(i, src, cfg, gpu_s + host_s * truth))

    def simulate(cfg):
        gpu_s, host_s = parts[cfg.training.global_batch_size]
        t = cfg.training
        return SimpleNamespace(step_time_s=gpu_s + host_s * host_scale(t.calibration, t.software_release, "",
                                                                        cfg.cluster.cpu))
    return runs, simulate


def test_second_stage_recovers_the_multiplier_of_the_informed_runs(tmp_path):
    runs, simulate = _synthetic_runs(tmp_path, 1.6)
    host = fit_host(runs, simulate, Profile(()), 7)
    assert host.informed == {"host_multiplier:arm:megatron-bridge-2025": 5} and host.refused == ()
    (p,) = host.result.parameters
    assert p.value == pytest.approx(1.6, rel=0.02) and p.rows == 5
    assert host.ratio_in[-2:] == pytest.approx([1.0, 1.0])  # GPU-bound runs: untouched
    measured = np.array([r.measured_s for r in runs])
    assert np.median(np.abs(host.ratio_in * np.array([simulate(r.config).step_time_s for r in runs]) / measured
                            - 1)) < 0.01


def test_second_stage_refuses_a_multiplier_fewer_than_three_runs_inform(tmp_path):
    runs, simulate = _synthetic_runs(tmp_path, 1.6)
    host = fit_host(runs[4:], simulate, Profile(()), 7)  # one host-bound run, two GPU-bound ones
    assert host.result is None and host.refused == (("host_multiplier:arm:megatron-bridge-2025", 1),)
    assert INFORM_PCT == 0.5
