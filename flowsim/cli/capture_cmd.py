"""``flowsim capture``: record the workload of a built-in example step at a large world size on CPU."""
from __future__ import annotations

import click

from flowsim.cli.common import echo_json, user_errors

EXAMPLES = {"gpt-ddp": "ddp", "gpt-fsdp": "fsdp", "gpt-tp-dp": "tp-dp"}


@click.command()
@click.option("--example", type=click.Choice(sorted(EXAMPLES)), required=True,
              help="Built-in plain-PyTorch GPT step: DDP, FSDP2 fully_shard, or DTensor TP x FSDP2 DP.")
@click.option("--world-size", type=click.IntRange(min=1), required=True, help="Ranks of the job.")
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True, help="Rank to capture.")
@click.option("--tp", type=click.IntRange(min=1), default=8, show_default=True, help="TP size (gpt-tp-dp).")
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True, help="Transformer blocks.")
@click.option("--hidden", type=click.IntRange(min=1), default=256, show_default=True, help="Hidden size.")
@click.option("--heads", type=click.IntRange(min=1), default=8, show_default=True, help="Attention heads.")
@click.option("--vocab", type=click.IntRange(min=1), default=1024, show_default=True, help="Vocabulary size.")
@click.option("--seq", type=click.IntRange(min=1), default=128, show_default=True, help="Sequence length.")
@click.option("--mbs", type=click.IntRange(min=1), default=2, show_default=True, help="Micro-batch (sequences).")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), required=True, help="Workload JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@user_errors
def capture(example, world_size, rank, tp, layers, hidden, heads, vocab, seq, mbs, out, as_json):
    """Capture one training step of rank RANK of a WORLD-SIZE job on this CPU and save it.

    Example: flowsim capture --example gpt-ddp --world-size 64 --out workload.json
    then:    flowsim estimate --workload workload.json --cluster dgx-h100
    """
    from flowsim.capture import GPTShape, capture as run_capture, gpt_example, save

    shape = GPTShape(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq, micro_batch=mbs)
    setup, step = gpt_example(EXAMPLES[example], world_size, tp=tp, shape=shape)
    wl = run_capture(step, setup=setup, world_size=world_size, rank=rank, label=example)
    save(wl, out)
    comms = wl.comms()
    summary = {"out": out, "world_size": world_size, "rank": rank, "compute_ops": len(wl.ops) - len(comms),
               "collectives": len(comms), "collective_bytes": sum(c["size_bytes"] for c in comms),
               "unknown_ops": wl.unknown_ops}
    if as_json:
        echo_json(summary)
    else:
        click.echo(f"captured {summary['compute_ops']} compute ops and {summary['collectives']} collectives "
                   f"({summary['collective_bytes'] / 2**20:.2f} MiB) of rank {rank}/{world_size} -> {out}")
