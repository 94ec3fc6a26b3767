"""Train a small GPT with DDP or FSDP2: a plain PyTorch script, as launched by torchrun on GPUs.

    torchrun --nproc-per-node 8 examples/capture_gpt_train.py --parallel fsdp
    flowsim capture --world-size 64 --out gpt.json -- python examples/capture_gpt_train.py --parallel fsdp

Under ``flowsim capture`` (which sets FLOWSIM_CAPTURE=1) it runs two steps, marked with
``flowsim.capture.step()``: the capture records the second (DDP's buckets are settled after the first).
The model matches ``flowsim.capture.gpt_example``: pre-norm blocks with a fused QKV projection, causal
SDPA and a 4h GELU MLP; untied embedding and LM head; bf16 weights; AdamW.
"""
import argparse
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

try:
    from flowsim.capture import step as capture_step
except ImportError:  # flowsim is only needed to capture
    capture_step = contextlib.nullcontext


class Block(nn.Module):
    def __init__(self, hidden, heads, **kw):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden, **kw), nn.LayerNorm(hidden, **kw)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden, **kw), nn.Linear(hidden, hidden, **kw)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden, **kw), nn.Linear(4 * hidden, hidden, **kw)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, vocab, **kw):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden, **kw)
        self.blocks = nn.ModuleList(Block(hidden, heads, **kw) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden, **kw)
        self.head = nn.Linear(hidden, vocab, bias=False, **kw)

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mbs", type=int, default=2, help="micro-batch size (sequences per rank)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size, MiB")
    p.add_argument("--steps", type=int, default=2 if os.environ.get("FLOWSIM_CAPTURE") else 100)
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    model = GPT(args.layers, args.hidden, args.heads, args.vocab, device=device, dtype=torch.bfloat16)
    if args.parallel == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank], bucket_cap_mb=args.bucket_cap_mb,
                                                    gradient_as_bucket_view=True)
    else:
        from torch.distributed.fsdp import fully_shard

        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens = torch.randint(0, args.vocab, (args.mbs, args.seq), device=device)  # stands in for a data loader
    for it in range(args.steps):
        with capture_step():
            loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten())  # fp32 loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        if not os.environ.get("FLOWSIM_CAPTURE") and dist.get_rank() == 0 and it % 10 == 0:
            print(f"step {it} loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
