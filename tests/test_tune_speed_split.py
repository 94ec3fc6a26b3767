"""The pipeline split (flowsim.model.stage_split.stage_split) is shared by the configs with one split key: the split
reads nothing outside its key (every attribute read is recorded), and splits taken from the cache equal splits built
alone with every cache cleared."""
import numpy as np
import pytest
from fuzz_inputs import layouts
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import flowsim
from flowsim.errors import ConfigError
from flowsim.explore.space import LayoutSpace, enumerate_layouts
from flowsim.model import stage_split, workload


class _Recorder:
    """Reads attributes of ``obj``, recording their names in ``reads``; ``children`` answers some names instead."""

    def __init__(self, obj, reads: set, children=None):
        self._obj, self._reads, self._children = obj, reads, children or {}

    def __getattr__(self, name):
        self._reads.add(name)
        return self._children[name] if name in self._children else getattr(self._obj, name)


@st.composite
def _split_configs(draw) -> dict:
    """A usually valid layout with the knobs the split reads: schedules, chunks, recompute policies, the embedding
    and loss in the split, MoE and MTP layers, an explicit layout."""
    kw = draw(layouts())
    if kw["pp"] > 1:
        kw["schedule"] = draw(st.sampled_from(("auto", "1f1b", "gpipe", "zb-h1", "dualpipe", "interleaved")))
        if kw["schedule"] in ("interleaved", "auto") and draw(st.booleans()):
            kw["vpp"] = draw(st.sampled_from((2, 4)))
        if kw["schedule"] == "dualpipe":
            kw.update(vpp=1, gbs=kw["mbs"] * kw["dp"] * 2 * kw["pp"] * draw(st.sampled_from((1, 2))))
    kw["account_for_embedding_in_pipeline_split"] = draw(st.booleans())
    kw["account_for_loss_in_pipeline_split"] = draw(st.booleans())
    rec = draw(st.sampled_from(("none", "full", "full_partial", "modules", "op", "every_n")))
    if rec == "full_partial":
        kw.update(recompute="full", recompute_num_layers=draw(st.sampled_from((1, 2))))
    elif rec == "modules":
        kw.update(recompute="selective", recompute_modules=("core_attn", "mlp"))
    elif rec in ("op", "every_n"):
        kw.update(recompute="selective", selective_ac_option="op" if rec == "op" else "2")
    else:
        kw["recompute"] = rec
    if kw["model"] == "deepseek-v3" and draw(st.booleans()):
        kw["mtp_num_layers"] = 1
    return kw


@settings(max_examples=250, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(_split_configs())
def test_the_split_reads_nothing_outside_its_key(kw):
    try:
        cfg = flowsim.build_config(**kw)
    except ConfigError:
        assume(False)
    cfg_reads, training_reads = set(), set()
    proxy = _Recorder(cfg, cfg_reads, {"training": _Recorder(cfg.training, training_reads)})
    got = stage_split._stage_split(proxy)
    assert cfg_reads <= {"model", "training", "seq_length"}, cfg_reads
    assert training_reads <= set(stage_split.SPLIT_FIELDS), training_reads - set(stage_split.SPLIT_FIELDS)
    _assert_same_split(got, stage_split._stage_split(cfg))


def test_an_explicit_layout_is_read_through_the_key():
    small = dict(num_layers=6, hidden_size=1024, num_attention_heads=8, seq_length=1024, vocab_size=32000,
                 gpu="h100-sxm", num_gpus=8, global_batch_size=16, micro_batch_size=1, pp=2, vpp=2)
    a, b = (flowsim.build_config(small, pipeline_model_parallel_layout=s) for s in ("Ett|t|tt|tL", "Et|tt|t|ttL"))
    assert stage_split.split_key(a) != stage_split.split_key(b)
    stage_split._SPLITS.clear()
    assert stage_split.stage_split(a).chunk_layers.tolist() == [[2, 2], [1, 1]]
    assert stage_split.stage_split(b).chunk_layers.tolist() == [[1, 1], [2, 2]]


def _assert_same_split(a, b):
    for name, x, y in zip(stage_split.StageSplit._fields, a, b, strict=True):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y) and not x.flags.writeable, name
        else:
            assert type(x) is type(y) and x == y and all(type(p) is float for p in x), name


@pytest.fixture(scope="module")
def spaces():
    dense = {"model": "gpt3-175b", "cluster": "dgx-h100", "gpus": 1024, "gbs": 1536, "seq": 2048}
    moe = {"model": "mixtral-8x7b", "cluster": "dgx-h100", "gpus": 64, "gbs": 128, "seq": 4096, "ep": 2, "sp": True}
    out = []
    for job, tp in ((dense, 8), (moe, 2)):
        configs = enumerate_layouts(job, LayoutSpace.default(flowsim.build_config(job, tp=tp))).configs
        out.append(list(configs[::7]))
    return out


def test_shared_splits_equal_splits_built_alone(spaces):
    for configs in spaces:
        keys = {stage_split.split_key(c) for c in configs}
        assert len(keys) * 4 <= len(configs)  # the space does share its splits
        stage_split._SPLITS.clear()
        workload._WORKLOADS.clear()
        for cfg in configs:
            split = stage_split.stage_split(cfg)
            _assert_same_split(split, stage_split._stage_split(cfg))
            wl = workload.build_workload(cfg)
            assert all(getattr(wl, name) is value for name, value in zip(stage_split.StageSplit._fields, split))


def test_the_workload_keeps_the_split_of_its_config():
    cfg = flowsim.build_config(model="deepseek-v3", cluster="hgx-h800", gpus=64, pp=4, vpp=2, ep=16, gbs=64,
                               distributed_optimizer=True, pipeline_layer_split="balanced", mtp_num_layers=1,
                               recompute="full", recompute_num_layers=2)
    wl = workload._build_workload(cfg)
    layers, moe = stage_split.chunk_layer_counts(cfg, with_moe=True)
    assert np.array_equal(wl.chunk_layers, layers) and np.array_equal(wl.chunk_moe_layers, moe)
    assert wl.chunk_recompute_layers.tolist() == np.minimum(layers, 2).tolist()
    assert wl.stage_params == stage_split.stage_params(cfg, layers, moe)
    assert len(wl.stage_expert_params) == 4 and sum(wl.stage_expert_params) > 0
