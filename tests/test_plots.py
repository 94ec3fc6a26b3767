"""Plots: pipeline sizes as discrete colours, axes from zero, token budgets in words."""
import pytest

import flowsim
from flowsim.explore import plots
from flowsim.explore.space import LayoutSpace
from flowsim.explore.tune import tune

pytest.importorskip("matplotlib")


@pytest.mark.parametrize("n, text", [(3e11, "300B"), (1.5e12, "1.5T"), (2e6, "2M"), (999, "999")])
def test_tokens_label(n, text):
    assert plots.tokens_label(n) == text


def test_tune_plot_one_colour_per_pipeline_size(tmp_path, monkeypatch):
    job = {"model": "llama2-7b", "cluster": "dgx-h100", "gpus": 8, "gbs": 16, "seq": 4096}
    space = LayoutSpace.default(flowsim.build_config(job), tp=(2, 4), pp=(1, 2), vpp=(1,), cp=(1,), mbs=(1,),
                                recompute=("none", "full"), zero=(1,))
    res = tune(job, space, jobs=1)
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    monkeypatch.setattr(plots._pyplot(), "close", lambda fig: None)
    plots.tune_plot(res, tmp_path / "t.png")
    ax = figs[0].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    pps = sorted(set(res.to_frame()["pp"]))
    assert [x for x in labels if x.startswith("pp=")] == [f"pp={p} ({(res.to_frame()['pp'] == p).sum()})" for p in pps]
    assert len(figs[0].axes) == 1  # no continuous colour bar
    assert ax.get_xlim()[0] == 0
