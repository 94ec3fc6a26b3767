"""flowsim.config.layout.group_spans, kept per set of the fields it reads, equals the rank-order rules computed
from the config each time (the slow reference below) and hands every caller its own dict."""
from hypothesis import given, settings, strategies as st

from flowsim.config import TrainingConfig
from flowsim.config.layout import expert_rank_order, group_spans


def _reference(t) -> dict:
    etp, ep = t.expert_tensor_parallel_size, t.ep
    stage = t.tp * t.cp * t.dp
    if expert_rank_order(t) == "tp-ep-dp-pp":
        experts = {"etp": (etp, 1), "ep": (ep, etp), "edp": (stage // (ep * etp), ep * etp), "tpep": (etp * ep, 1)}
    else:
        experts = {"etp": (t.tp, 1), "ep": (ep, t.tp * t.cp), "edp": (t.dp // ep, t.tp * t.cp * ep),
                   "tpep": (t.tp * ep, 1)}
    spans = {"tp": (t.tp, 1), "cp": (t.cp, t.tp), "dp": (t.dp * t.cp, t.tp), "dps": (t.dp_shard, t.tp),
             "dpr": (t.dp * t.cp // t.dp_shard, t.tp * t.dp_shard), "pp": (2, stage), **experts}
    if t.moe_flex_nvlink_ranks:
        stride = spans["ep"][1]
        inside = min(ep, max(t.moe_flex_nvlink_ranks // stride, 1))
        spans.update(epn=(inside, stride), epx=(max(ep // inside, 1), stride * inside))
    return spans


@st.composite
def _trainings(draw) -> TrainingConfig:
    tp, cp, ep, etp = (draw(st.sampled_from((1, 2, 4, 8))) for _ in range(4))
    dp = ep * draw(st.sampled_from((1, 2, 4, 8)))
    shard = draw(st.sampled_from((0, dp * cp, max(dp * cp // 2, 1))))
    return TrainingConfig(tensor_model_parallel_size=tp, context_parallel_size=cp, data_parallel_size=dp,
                          data_parallel_shard_size=shard, expert_model_parallel_size=ep,
                          expert_tensor_parallel_size=etp, pipeline_model_parallel_size=draw(st.sampled_from((1, 4))),
                          expert_rank_order=draw(st.sampled_from(("", "tp-ep-dp-pp", "tp-cp-ep-dp-pp"))),
                          framework_version=draw(st.sampled_from(("", "nemo-24.07"))),
                          moe_flex_nvlink_ranks=draw(st.sampled_from((0, 8, 72))))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_trainings())
def test_group_spans_equal_the_rules(t):
    assert group_spans(t) == _reference(t)


def test_each_caller_gets_its_own_dict():
    t = TrainingConfig(tensor_model_parallel_size=8, data_parallel_size=4)
    spans = group_spans(t)
    spans["tp"] = (0, 0)
    del spans["dp"]
    assert group_spans(t) == _reference(t)
