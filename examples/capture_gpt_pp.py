"""Train a small GPT with pipeline x data parallelism: plain PyTorch, hand-written point-to-point.

    torchrun --nproc-per-node 8 examples/capture_gpt_pp.py --pp 4 --microbatches 8
    flowsim capture --world-size 64 --rank 0 --rank 16 --rank 32 --rank 48 --out pp.json \\
        -- python examples/capture_gpt_pp.py --pp 4 --microbatches 8

Ranks are stage-major (rank = stage * dp + data-parallel index, as Megatron-LM numbers them with pipeline
outermost). Stage s holds layers / pp blocks (the first also the embedding, the last the final norm, LM
head and loss). Each step runs the micro-batches GPipe-style: all forwards (receive the activation from
rank - dp, run the stage, send to rank + dp), then all backwards (receive the output gradient, backward,
send the input gradient back); then one all-reduce of the stage's flattened gradients over its
data-parallel group, and AdamW. The blocks are those of examples/capture_gpt_train.py. Under
``flowsim capture`` (FLOWSIM_CAPTURE=1) it runs one step.
"""
import argparse
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from capture_gpt_train import Block

try:
    from flowsim.capture import step as capture_step
except ImportError:  # flowsim is only needed to capture
    capture_step = contextlib.nullcontext


class Stage(nn.Module):
    """``layers / pp`` blocks of the GPT, with the embedding on the first stage and the head on the last."""

    def __init__(self, args, first_stage, last_stage, **kw):
        super().__init__()
        self.emb = nn.Embedding(args.vocab, args.hidden, **kw) if first_stage else None
        self.blocks = nn.ModuleList(Block(args.hidden, args.heads, **kw) for _ in range(args.layers // args.pp))
        self.ln = nn.LayerNorm(args.hidden, **kw) if last_stage else None
        self.head = nn.Linear(args.hidden, args.vocab, bias=False, **kw) if last_stage else None

    def forward(self, x):
        if self.emb is not None:
            x = self.emb(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x)) if self.head is not None else x


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pp", type=int, default=4, help="pipeline stages")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mbs", type=int, default=2, help="micro-batch size (sequences)")
    p.add_argument("--steps", type=int, default=1 if os.environ.get("FLOWSIM_CAPTURE") else 100)
    return p.parse_args()


def train_step(args, model, opt, tokens, dp_group, prev_rank, next_rank):
    """One step: GPipe forwards and backwards over the micro-batches, gradient all-reduce, AdamW."""
    kw = {"dtype": torch.bfloat16, "device": tokens.device}
    inputs, outputs = [], []
    for _ in range(args.microbatches):
        if prev_rank is None:
            x = tokens
        else:
            x = torch.empty(args.mbs, args.seq, args.hidden, **kw)
            dist.recv(x, prev_rank)
            x.requires_grad_()
        y = model(x)
        if next_rank is None:
            y = F.cross_entropy(y.flatten(0, 1).float(), tokens.flatten()) / args.microbatches
        else:
            dist.send(y.detach(), next_rank)
        inputs.append(x)
        outputs.append(y)
    for x, y in zip(inputs, outputs):
        if next_rank is None:
            y.backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, next_rank)
            y.backward(grad)
        if prev_rank is not None:
            dist.send(x.grad, prev_rank)
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat, group=dp_group)
    flat.div_(dist.get_world_size(dp_group))
    for g, v in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(v.view_as(g))
    opt.step()
    opt.zero_grad(set_to_none=False)


def main():
    args = parse_args()
    dist.init_process_group(backend="nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world // args.pp
    stage = rank // dp
    dp_group = None
    for s in range(args.pp):  # every rank creates every group, in the same order
        group = dist.new_group(list(range(s * dp, (s + 1) * dp)))
        if s == stage:
            dp_group = group
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    model = Stage(args, stage == 0, stage == args.pp - 1, device=device, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens = torch.randint(0, args.vocab, (args.mbs, args.seq), device=device)  # stands in for a data loader
    prev_rank = rank - dp if stage > 0 else None
    next_rank = rank + dp if stage < args.pp - 1 else None
    for _ in range(args.steps):
        with capture_step():
            train_step(args, model, opt, tokens, dp_group, prev_rank, next_rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
