"""The per-stage breakdown (flowsim.step.simulate._stage_breakdowns), summed over the stage axis in numpy, equals bit
for bit the loop over stages it replaced (kept here as the slow reference) on the frozen fast-path configs: dense
and MoE layers, DualPipe and paired 1F1B (the hidden all-to-all), every schedule of the draws."""
import gzip
import json

import make_fast_path_data
import numpy as np
import pytest

import flowsim
import flowsim.step.simulate as step_simulate
from flowsim.step.result import StageBreakdown

CONFIGS = json.load(gzip.open(make_fast_path_data.DATA, "rt"))["configs"]


def _reference(wl, ps, run, dp_x, opt_s, mems, step: float) -> tuple:
    """The loop over stages, as before the numpy sums."""
    tl, runs, prog = run.timeline, ps.runs, ps.program
    hid = (prog.fwd_s + prog.bwd_s) @ runs - tl.busy_s if prog.hidden is not None else np.zeros(len(dp_x))
    stages, keys = [], ("compute", "tp", "cp", "ep")
    per_kind = [((n_l @ runs).tolist(), (n_r @ runs).tolist(),
                 [(blk[f"{k}_fwd"] + blk[f"{k}_bwd"], blk[f"{k}_recompute"]) for k in keys])
                for blk, n_l, n_r in ps.kinds]
    layer_runs = (wl.chunk_layers @ runs).tolist()
    end_runs = [[0] * len(dp_x), [0] * len(dp_x)]
    for i, ends in enumerate((ps.first, ps.last)):
        for sc, c in ends:
            end_runs[i][sc] += int(runs[c])
    for s in range(len(dp_x)):
        tot = dict.fromkeys(keys, 0.0)
        for n_ls, n_rs, secs in per_kind:
            nl, nr = n_ls[s], n_rs[s]
            for key, (fb, rc) in zip(keys, secs):
                tot[key] += nl * fb + nr * rc
        n_emb, n_head = end_runs[0][s], end_runs[1][s]
        for blk, n in ((ps.emb, n_emb), (ps.head, n_head)):
            tot["compute"] += n * (blk["compute_fwd"] + blk["compute_bwd"])
            tot["tp"] += n * (blk["tp_fwd"] + blk["tp_bwd"])
        tot["ep"] -= max(0.0, float(hid[s]))
        dp_c = layer_runs[s] * (ps.fsdp_f + ps.fsdp_b) + dp_x[s] + n_emb * ps.first_gather
        busy = sum(tot.values()) + dp_c + opt_s[s] + run.pp_exposed_s
        stages.append(StageBreakdown(stage=s, compute_s=tot["compute"], tp_comm_s=tot["tp"], cp_comm_s=tot["cp"],
                                     ep_comm_s=tot["ep"], pp_comm_s=run.pp_exposed_s, dp_comm_s=dp_c,
                                     bubble_s=max(0.0, step - busy), optimizer_s=float(opt_s[s]),
                                     memory_bytes=mems[s].total_bytes))
    return tuple(stages)


def _bits(stages) -> list:
    return [{k: float(v).hex() for k, v in vars(s).items()} for s in stages]


@pytest.mark.filterwarnings("ignore")
def test_stage_breakdowns_equal_the_loop_over_stages(monkeypatch):
    calls = []
    fast = step_simulate._stage_breakdowns

    def both(*args):
        got = fast(*args)
        calls.append((args[1].program.hidden is not None, len(args[1].kinds)))
        assert _bits(got) == _bits(_reference(*args))
        return got

    monkeypatch.setattr(step_simulate, "_stage_breakdowns", both)
    for kw in CONFIGS[:80]:
        flowsim.simulate(flowsim.build_config(**kw))
    assert any(hidden for hidden, _ in calls) and any(kinds == 2 for _, kinds in calls)  # DualPipe, MoE reached
