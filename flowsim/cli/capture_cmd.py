"""``flowsim capture``: record the workload of a training script, or of a built-in example step, on CPU."""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, user_errors
from flowsim.errors import ConfigError

EXAMPLES = {"gpt-ddp": "ddp", "gpt-fsdp": "fsdp", "gpt-tp-dp": "tp-dp"}


@click.command(context_settings={"allow_interspersed_args": False})
@click.argument("script", nargs=-1, type=click.UNPROCESSED)
@click.option("--example", type=click.Choice(sorted(EXAMPLES)),
              help="Built-in plain-PyTorch GPT step instead of a script: DDP, FSDP2 fully_shard, or DTensor "
                   "TP x FSDP2 DP.")
@click.option("--world-size", type=click.IntRange(min=1), required=True, help="Ranks of the job.")
@click.option("--rank", "ranks", type=click.IntRange(min=0), multiple=True,
              help="Rank to capture [default: 0]. Repeat it to capture one rank per pipeline stage, in stage "
                   "order (scripts only).")
@click.option("--step", "step_index", type=click.IntRange(min=1),
              help="Record the N-th flowsim.capture.step() block of the script and stop it there "
                   "[default: the last block; a script without blocks is recorded whole].")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True,
              help="Ranks per node, for the script's LOCAL_RANK and LOCAL_WORLD_SIZE.")
@click.option("--tp", type=click.IntRange(min=1), default=8, show_default=True, help="TP size (gpt-tp-dp).")
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Transformer blocks (example).")
@click.option("--hidden", type=click.IntRange(min=1), default=256, show_default=True, help="Hidden size (example).")
@click.option("--heads", type=click.IntRange(min=1), default=8, show_default=True, help="Attention heads (example).")
@click.option("--vocab", type=click.IntRange(min=1), default=1024, show_default=True, help="Vocabulary size (example).")
@click.option("--seq", type=click.IntRange(min=1), default=128, show_default=True, help="Sequence length (example).")
@click.option("--mbs", type=click.IntRange(min=1), default=2, show_default=True, help="Micro-batch (example).")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), required=True, help="Workload JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr (shown for several --rank).")
@user_errors
def capture(script, example, world_size, ranks, step_index, gpus_per_node, tp, layers, hidden, heads, vocab, seq,
            mbs, out, as_json, no_progress):
    """Capture one training step of rank RANK of a WORLD-SIZE job on this CPU and save it.

    \b
    A script runs in this process as each --rank would under torchrun, on fake tensors:
      flowsim capture --world-size 64 --out w.json -- python train.py ARGS
    Pipeline parallel: one --rank per stage, e.g. --rank 0 --rank 16 --rank 32 --rank 48.
    Or a built-in example:
      flowsim capture --example gpt-ddp --world-size 64 --out w.json
    then:
      flowsim estimate --workload w.json --cluster dgx-h100
    """
    from flowsim.capture import save

    if bool(script) == bool(example):
        raise ConfigError("script", "give either --example NAME or a script after '--' (not both)",
                          "both" if script else "neither")
    if script:
        from flowsim.capture import capture_script

        wl = capture_script(list(script), world_size=world_size, ranks=ranks or (0,), step=step_index,
                            local_world_size=gpus_per_node, progress=not no_progress)
    else:
        wl = _capture_example(example, world_size, ranks, step_index, tp, layers, hidden, heads, vocab, seq, mbs)
    save(wl, out)
    stages = [dict(rank=st.rank, compute_ops=len(wl.compute(s)), collectives=len(wl.comms(s)),
                   collective_bytes=sum(c["size_bytes"] for c in wl.comms(s))) for s, st in enumerate(wl.stages)]
    if as_json:
        echo_json({"out": out, "world_size": world_size, "stages": stages, "unknown_ops": wl.unknown_ops})
        return
    for s, st in enumerate(stages):
        stage = f"stage {s}: " if len(stages) > 1 else ""
        click.echo(f"{stage}captured {st['compute_ops']} compute ops and {st['collectives']} collectives "
                   f"({st['collective_bytes'] / 2**20:.2f} MiB) of rank {st['rank']}/{world_size}")
    click.echo(f"-> {out}")


def _capture_example(example, world_size, ranks, step_index, tp, layers, hidden, heads, vocab, seq, mbs):
    """The workload of a built-in example step (one rank)."""
    from flowsim.capture import GPTShape, capture as run_capture, gpt_example

    if len(ranks) > 1:
        raise ConfigError("--rank", "takes one rank with --example (several ranks are pipeline stages of a "
                                    "script)", list(ranks))
    if step_index is not None:
        raise ConfigError("--step", "applies to scripts only", step_index)
    shape = GPTShape(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq, micro_batch=mbs)
    setup, step = gpt_example(EXAMPLES[example], world_size, tp=tp, shape=shape)
    return run_capture(step, setup=setup, world_size=world_size, rank=ranks[0] if ranks else 0, label=example)
