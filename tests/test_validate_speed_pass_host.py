"""The passes' host terms (flowsim.step.simulate._pass_host) and the optimizer step's seconds (_optimizer_s) are
shared by the configs with one key: building them reads nothing of the config outside the key (every attribute read
is recorded), configs that differ only in their NIC rate (the rows of a large runs file) share them, and a config
simulated after others gives the numbers of a simulation with every cache cleared (the uncached path), on random
configs with the host model's knobs."""
import random
import warnings

import pytest
from make_fast_path_data import result_numbers, sample
from test_tune_speed_split import _Recorder

import flowsim
from flowsim.config.cluster import CPUS
from flowsim.config.training import CUDA_GRAPH_SCOPES, HOST_MODES
from flowsim.errors import ConfigError
from flowsim.model import memo
from flowsim.step import simulate as step_simulate

KEY_TRAINING = {"host_overhead", "calibration", "software_release", "framework_version", "cuda_graphs", "schedule"}
"""The training fields in _pass_host's key (``schedule`` through whether the backward is split)."""


def _clear():
    memo.clear_all()


def _host_configs(n: int, seed: int) -> list:
    """``n`` valid configs of the fast-path sampler with a host model (mode, CUDA graphs, CPU family), each followed
    by the same config at two other NIC rates."""
    rng, out = random.Random(seed), []
    while len(out) < 3 * n:
        kw = dict(sample(rng), host_overhead=rng.choice(HOST_MODES[1:]), cuda_graphs=rng.choice(CUDA_GRAPH_SCOPES),
                  cpu=rng.choice(CPUS))
        try:
            out += [flowsim.build_config(**kw, **nic) for nic in ({}, {"nic_gbps": 100.0}, {"nic_gbps": 200.0})]
        except ConfigError:
            continue
    return out


def _numbers(cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return result_numbers(flowsim.simulate(cfg))
        except ConfigError as e:
            return str(e)


def test_building_the_host_terms_reads_only_the_key(monkeypatch):
    build, reads = step_simulate._build_pass_host, {"cfg": set(), "training": set(), "cluster": set()}

    def recorded(cfg, *args):
        children = {"training": _Recorder(cfg.training, reads["training"]),
                    "cluster": _Recorder(cfg.cluster, reads["cluster"])}
        return build(_Recorder(cfg, reads["cfg"], children), *args)

    monkeypatch.setattr(step_simulate, "_build_pass_host", recorded)
    _clear()
    for cfg in _host_configs(25, seed=5):
        _numbers(cfg)
    assert reads["cfg"] == {"training", "cluster"} and reads["cluster"] == {"cpu"}
    assert {"host_overhead", "cuda_graphs"} <= reads["training"] <= KEY_TRAINING


def test_the_optimizer_step_reads_only_its_key(monkeypatch):
    build, reads = step_simulate.optimizer_s, {"cfg": set(), "cluster": set()}

    def recorded(cfg, *args):
        return build(_Recorder(cfg, reads["cfg"], {"cluster": _Recorder(cfg.cluster, reads["cluster"])}), *args)

    monkeypatch.setattr(step_simulate, "optimizer_s", recorded)
    _clear()
    for cfg in _host_configs(25, seed=6):
        _numbers(cfg)
    assert {"training", "model"} <= reads["cfg"] <= {"training", "model", "cluster", "num_microbatches"}
    assert reads["cluster"] == {"cpu"}  # the workload and the GPU are built from the rest of the key


def test_rows_that_differ_in_their_nic_rate_share_the_host_terms():
    _clear()
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=32, tp=8, pp=2, dp=2, gbs=64, host_overhead="te")
    results = [flowsim.simulate(flowsim.build_config(**base, nic_gbps=nic)) for nic in (100.0, 200.0, 400.0)]
    assert len(step_simulate._PASS_HOST) == len(step_simulate._OPTIMIZER) == 1
    assert len({r.step_time_s for r in results}) == 3  # the NIC rate does move the step


@pytest.mark.parametrize("seed", [1, 2])
def test_shared_host_terms_give_the_uncached_numbers(seed):
    configs = _host_configs(40, seed)
    _clear()
    warm = [_numbers(cfg) for cfg in configs]  # caches shared, in order
    assert len(step_simulate._PASS_HOST) < len(configs) // 2
    for cfg, numbers in zip(configs, warm):
        _clear()
        assert _numbers(cfg) == numbers, cfg.training
