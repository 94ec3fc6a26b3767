"""A small GPT in plain PyTorch and its data-parallel, FSDP2 and tensor x data parallel steps.

``gpt_example(parallel, world_size, ...)`` returns ``(setup, step)`` for :func:`flowsim.capture.capture`.
The model is a pre-norm GPT with untied embeddings (as flowsim's parametric model assumes): token
embedding, ``layers`` blocks (LayerNorm, fused QKV Linear, causal SDPA, output Linear, LayerNorm,
Linear-GELU-Linear MLP of 4h), final LayerNorm, LM head, cross-entropy on the logits upcast to fp32; bf16 weights,
AdamW (foreach). DDP uses ``gradient_as_bucket_view=True`` (gradients live in the buckets, as Megatron-LM's
gradient buffer does, so no per-bucket copy).
"""
from __future__ import annotations

import dataclasses

from flowsim.errors import ConfigError

PARALLEL = ("ddp", "fsdp", "tp-dp")


@dataclasses.dataclass(frozen=True)
class GPTShape:
    """Size of the example model and batch (tokens per rank = ``micro_batch * seq``)."""

    layers: int = 2
    hidden: int = 256
    heads: int = 4
    vocab: int = 1024
    seq: int = 128
    micro_batch: int = 2


def _model(shape: GPTShape):
    import torch
    import torch.nn.functional as F
    from torch import nn

    kw = {"dtype": torch.bfloat16}

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h = shape.hidden
            self.ln1, self.ln2 = nn.LayerNorm(h, **kw), nn.LayerNorm(h, **kw)
            self.qkv, self.proj = nn.Linear(h, 3 * h, **kw), nn.Linear(h, h, **kw)
            self.fc1, self.fc2 = nn.Linear(h, 4 * h, **kw), nn.Linear(4 * h, h, **kw)

        def forward(self, x):
            b, s, _ = x.shape
            d = shape.hidden // shape.heads
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, -1, d).permute(2, 0, 3, 1, 4)  # local heads under TP
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(shape.vocab, shape.hidden, **kw)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.ln = nn.LayerNorm(shape.hidden, **kw)
            self.head = nn.Linear(shape.hidden, shape.vocab, bias=False, **kw)

        def forward(self, tokens):
            x = self.emb(tokens)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return GPT()


def gpt_example(parallel: str, world_size: int, *, tp: int = 8, shape: GPTShape = GPTShape(),
                bucket_cap_mb: float = 25.0):
    """``(setup, step)`` of the example GPT under ``parallel`` on ``world_size`` ranks.

    Parameters
    ----------
    parallel : {"ddp", "fsdp", "tp-dp"}
        DDP (gradient all-reduce in ``bucket_cap_mb`` buckets); FSDP2 ``fully_shard`` per block and root;
        2-D: DTensor ``parallelize_module`` (column-parallel QKV/fc1, row-parallel proj/fc2) over ``tp``
        consecutive ranks, FSDP2 ``fully_shard`` per block and root over the data-parallel dimension.
    world_size : int
        Ranks of the job.
    tp : int, optional
        Tensor-parallel size for ``tp-dp`` (must divide ``world_size`` and ``heads``).
    shape : GPTShape, optional
        Model and batch size.
    bucket_cap_mb : float, optional
        DDP bucket size, MiB (PyTorch's ``bucket_cap_mb``).

    Returns
    -------
    (setup, step) : callables for :func:`flowsim.capture.capture`.
    """
    if parallel not in PARALLEL:
        raise ConfigError("parallel", f"must be one of {', '.join(PARALLEL)}", parallel)
    if parallel == "tp-dp" and (world_size % tp or shape.heads % tp):
        raise ConfigError("world_size", f"must be a multiple of tp={tp} (and heads={shape.heads} too)",
                          world_size)

    def setup():
        import torch
        import torch.distributed as dist

        model = _model(shape)
        if parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=True)
        elif parallel == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for blk in model.blocks:
                fully_shard(blk)
            fully_shard(model)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            mesh = init_device_mesh("cpu", (dist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))
            for blk in model.blocks:
                parallelize_module(blk, mesh["tp"], {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                                                     "fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
                fully_shard(blk, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        tokens = torch.randint(0, shape.vocab, (shape.micro_batch, shape.seq))
        return model, opt, tokens

    def step(state):
        import torch.nn.functional as F

        model, opt, tokens = state
        logits = model(tokens)
        # the loss in fp32 (logits upcast), as torchtitan and transformers compute it
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    return setup, step
