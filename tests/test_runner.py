"""The tune/sweep runner against a plain loop over flowsim.simulate: same outcomes, store rows and ranking."""
import hashlib
import json
import sqlite3

import pytest

import flowsim
from flowsim._version import __version__
from flowsim.explore.point import PointResult, config_dict, config_key, peak_memory_bytes
from flowsim.explore.runner import run_configs
from flowsim.explore.space import LayoutSpace, enumerate_layouts
from flowsim.explore.store import ResultStore
from flowsim.explore.tune import rank_key

JOB = {"model": "llama2-7b", "cluster": "dgx-h100", "gpus": 8, "gbs": 16, "seq": 4096}
SPACE = dict(tp=(1, 2, 8), pp=(1, 2), vpp=(1, 2), cp=(1, 2), mbs=(1, 2), recompute=("none", "full"), zero=(0, 1, 3))


@pytest.fixture(scope="module")
def configs():
    return list(enumerate_layouts(JOB, LayoutSpace.default(flowsim.build_config(JOB, gbs=8), **SPACE)).configs)


def _reference_key(cfg) -> str:
    """The store key as first defined: the hash of the whole config's JSON in one dump."""
    text = json.dumps({"config": config_dict(cfg), "flowsim": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def test_config_key_is_the_hash_of_the_whole_config_json(configs):
    for cfg in configs[::7]:
        assert config_key(cfg) == _reference_key(cfg)
    odd = flowsim.build_config(JOB, **{"nic_gbps": 400.0})  # equal to 400 as a field, not as JSON
    assert config_key(odd) == _reference_key(odd)
    assert config_key(flowsim.build_config(JOB, tp=2)) == _reference_key(flowsim.build_config(JOB, tp=2))
    import dataclasses
    base = flowsim.build_config(JOB)
    values = (0.0, -0.0, float("nan"), 1, True, 1.0, "1", None, [1, 2], (1, 2), (1.0, 2), (True, 2), (-0.0,), (0.0,))
    for value in values + values:  # equal values with different JSON, each seen twice (the second from the cache)
        cfg = dataclasses.replace(base, cluster=dataclasses.replace(base.cluster, nic_latency_s=value),
                                  training=dataclasses.replace(base.training, bucket_size_bytes=value))
        assert config_key(cfg) == _reference_key(cfg), value


@pytest.mark.parametrize("jobs", [1, 2])
def test_runner_equals_a_plain_simulate_loop(tmp_path, configs, jobs):
    with ResultStore(tmp_path / "r.sqlite") as store:
        report = run_configs(configs, store=store, jobs=jobs, progress=False)
        rows = store.get(config_key(c) for c in configs)
        pruned = store.memory_pruned()
    expected_fit, expected_pruned = {}, {}
    for cfg in configs:  # the reference: every config simulated on its own, nothing skipped
        r = flowsim.simulate(cfg)
        key = _reference_key(cfg)
        if r.fits_memory:
            expected_fit[key] = PointResult.of(cfg, r, key)
        else:
            expected_pruned[key] = r.memory_bytes_per_gpu
    assert expected_fit and expected_pruned  # the space exercises both paths
    assert report.evaluated == len(expected_fit) and report.memory_pruned == len(expected_pruned)
    for cfg, o in zip(configs, report.outcomes):
        key = _reference_key(cfg)
        assert o.key == key
        if key in expected_fit:
            assert o.status == "evaluated" and o.point == expected_fit[key]
        else:
            assert o.status == "memory" and o.memory_bytes == expected_pruned[key] == peak_memory_bytes(cfg)
    assert rows == expected_fit
    assert pruned == expected_pruned
    with sqlite3.connect(tmp_path / "r.sqlite") as db:  # the config text as config_dict dumps it, and the heads
        stored = {k: v for k, *v in db.execute("SELECT key, model, gpu, num_gpus, config_json FROM points")}
    for cfg in configs:
        key = _reference_key(cfg)
        if key in expected_fit:
            d = config_dict(cfg)
            assert stored[key] == [d["model"]["name"], d["cluster"]["gpu"], d["cluster"]["num_gpus"],
                                   json.dumps(d, sort_keys=True, default=str)]
    ranked = sorted((o.point for o in report.outcomes if o.point is not None), key=rank_key)
    assert [p.key for p in ranked] == [p.key for p in sorted(expected_fit.values(), key=rank_key)]


def test_layout_to_dict_is_asdict(configs):
    import dataclasses

    from flowsim.explore.space import Layout

    for cfg in configs[::11]:
        layout = Layout.of(cfg)
        assert layout.to_dict() == dataclasses.asdict(layout) and list(layout.to_dict()) == list(
            dataclasses.asdict(layout))


def test_replaced_equals_dataclasses_replace(configs):
    import dataclasses

    from flowsim.explore.space import replaced

    cfg = configs[0]
    for obj, changes in ((cfg.training, dict(micro_batch_size=4, zero_stage=3)), (cfg, dict(framework_defaults=()))):
        fast, slow = replaced(obj, **changes), dataclasses.replace(obj, **changes)
        assert type(fast) is type(slow) and fast == slow and hash(fast) == hash(slow)
        assert fast.__dict__ == slow.__dict__ and obj == replaced(obj)
    with pytest.raises(TypeError):
        replaced(cfg.training, no_such_field=1)
