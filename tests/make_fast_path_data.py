"""Freeze the analytic step's results on 200 random valid configurations: tests/data/fast_path_expected.json.gz.

Run ``python tests/make_fast_path_data.py`` from the repository root, on the code whose numbers are the reference
(tests/test_fast_path.py then holds every speed change of the analytic path to them, 1e-9 relative). Rerun it only
when a change is MEANT to move the numbers (a physics or data change), and say so in the commit message.

Configurations: a seeded sampler (``random.Random(SEED)``) over preset models x clusters x parallel layouts x
micro-batch / batch / sequence x recompute x precision x kernel fusion x pipeline schedule x the overlap and
optimizer switches; the draws that ``build_config`` or ``simulate`` refuse (ConfigError) are skipped.
"""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

DATA = Path(__file__).with_name("data") / "fast_path_expected.json.gz"
SEED = 22
N_CONFIGS = 200
MODELS = ("llama3-8b", "llama2-7b", "gpt3-175b", "llama3-70b", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3")
MOE = ("mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3")
CLUSTERS = ("dgx-h100", "dgx-a100", "dgx-b200", "gb200-nvl72", "hgx-h800", "dgx-h200")
SCHEDULES = ("auto", "1f1b", "gpipe", "interleaved", "zb-h1", "dualpipe")


def sample(rng: random.Random) -> dict:
    """One configuration's keyword arguments (usually valid)."""
    c = rng.choice
    model = c(MODELS)
    tp, pp, cp, dp, mbs = c((1, 2, 4, 8)), c((1, 2, 2, 4)), c((1, 1, 1, 2)), c((1, 2, 4, 8, 16)), c((1, 2))
    kw = {"model": model, "cluster": c(CLUSTERS), "tp": tp, "pp": pp, "cp": cp, "dp": dp, "gpus": tp * pp * cp * dp,
          "mbs": mbs, "gbs": mbs * dp * c((1, 2, 4, 8, 16)), "seq": c((1024, 2048, 4096)),
          "pipeline_layer_split": "balanced", "recompute": c(("none", "selective", "full")),
          "precision": c(("bf16", "bf16", "fp16", "fp8")), "kernel_fusion": c(("fused", "fused", "eager")),
          "distributed_optimizer": c((False, True)), "overlap_grad_reduce": c((False, True))}
    if tp > 1:
        kw["sp"] = model in MOE or c((False, True))
        kw["tp_comm_overlap"] = kw["sp"] and c((False, True))
    if model in MOE:
        kw["ep"] = c((1, 2, 4, 8))
    if pp > 1:
        kw["schedule"] = c(SCHEDULES)
        if kw["schedule"] == "interleaved" or c((False, False, True)):
            kw["vpp"] = 2
    return kw


def flat(d, prefix: str = "") -> dict:
    """The numbers of a result mapping, flattened to ``{path: float}`` (booleans as 0/1)."""
    out = {}
    for k, v in (d.items() if isinstance(d, dict) else enumerate(d)):
        if isinstance(v, (dict, list, tuple)):
            out.update(flat(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)):
            out[f"{prefix}{k}"] = float(v)
    return out


def result_numbers(result) -> dict:
    """Every number of a Result the test compares: its JSON view (less the echoed config) and the timeline's
    per-op seconds, per-pass pipeline times and exposed data-parallel / optimizer seconds."""
    d = result.to_dict()
    d.pop("config")
    tl = result.timeline
    d["timeline"] = {"op_time_s": [float(x) for x in tl.op_time_s], "p2p_s": tl.p2p_s,
                     "dp_exposed_s": list(tl.dp_exposed_s), "optimizer_s": list(tl.optimizer_s),
                     "busy_s": [float(x) for x in tl.pipeline.busy_s]}
    return flat(d)


def configs_and_results(n: int = N_CONFIGS, seed: int = SEED):
    """``n`` (kwargs, result numbers) pairs of valid configurations, in sampling order."""
    import flowsim
    from flowsim.errors import ConfigError

    rng, out = random.Random(seed), []
    while len(out) < n:
        kw = sample(rng)
        try:
            out.append((kw, result_numbers(flowsim.simulate(flowsim.build_config(**kw)))))
        except ConfigError:
            continue
    return out


def main() -> None:
    pairs = configs_and_results()
    DATA.parent.mkdir(exist_ok=True)
    with gzip.open(DATA, "wt") as f:
        json.dump({"seed": SEED, "configs": [kw for kw, _ in pairs], "results": [r for _, r in pairs]}, f,
                  separators=(",", ":"))
    print(f"{len(pairs)} configurations -> {DATA}")


if __name__ == "__main__":
    main()
