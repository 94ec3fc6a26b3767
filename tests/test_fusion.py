"""Memory-bound kernel sets (flowsim.model.fusion): the eager table re-derived from PyTorch, and its use."""
import pytest

from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.model.fusion import (DDP_ACCUMULATE_BYTES_PER_PARAM, DDP_SCALE_BYTES_PER_PARAM, FSDP_COPY_BYTES_PER_PARAM,
                            eager_grad_bytes_per_param, traffic)
from flowsim.model.workload import build_layer, build_head

T, H = 256, 512  # tokens and width of the recorded modules


def _reference_modules():
    """The eager reference implementations the table in flowsim.model.fusion names: (step, make, fn, elems)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    bf = torch.bfloat16

    class LlamaRMSNorm(nn.Module):  # transformers' LlamaRMSNorm
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H, dtype=bf))

        def forward(self, x):
            x32 = x.to(torch.float32)
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * x32.to(bf)

    def rope(q):  # Meta Llama reference apply_rotary_emb (complex multiply in fp32)
        freqs = torch.ones(H // 2, dtype=torch.complex64)
        qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        return torch.view_as_real(qc * freqs).flatten(-2).type_as(q)

    target = torch.zeros(T, dtype=torch.long)
    return [
        ("layernorm", lambda: nn.LayerNorm(H, dtype=bf), lambda m, x: m(x)),
        ("rmsnorm", LlamaRMSNorm, lambda m, x: m(x)),
        ("gelu", nn.Identity, lambda m, x: F.gelu(x)),
        ("rope", nn.Identity, lambda m, x: rope(x)),
        ("cross_entropy", nn.Identity, lambda m, x: F.cross_entropy(x.float(), target)),
    ]


def _recorded_bytes(make, fn, backward):
    """Bytes of the memory-bound kernels flowsim.capture records for ``fn`` on a bf16 [T, H] input."""
    import torch

    from flowsim.capture import capture

    def setup():
        return make(), torch.randn(T, H, dtype=torch.bfloat16, requires_grad=True)

    def step(state):
        y = fn(*state)
        if backward:
            y.backward(torch.ones_like(y)) if y.dim() else y.backward()

    w = capture(step, setup=setup, world_size=1, warmup_steps=0)
    return sum(o["bytes"] for o in w.ops if o["type"] == "compute" and o["kind"] == "memory"
               and "ones_like" not in o["name"])


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("case", range(5))
def test_eager_table_matches_recorded_pytorch_kernels(case):
    pytest.importorskip("torch")
    step, make, fn = _reference_modules()[case]
    fwd = _recorded_bytes(make, fn, False)
    bwd = _recorded_bytes(make, fn, True) - fwd
    expect = traffic(step, "eager")
    # per element of the [T, H] input; row statistics (mean, rsqrt, loss) add well under 1 %
    assert fwd / (T * H) == pytest.approx(expect.fwd, rel=0.01)
    assert bwd / (T * H) == pytest.approx(expect.bwd, rel=0.01)


def test_swiglu_eager_bytes_by_hand():
    # silu(a): read a, write s (4); s * b: read s and b, write y (6). Backward of the product: dy*b and
    # dy*s (6 each), silu_backward: read dy_s and a, write da (6).
    assert traffic("swiglu", "eager") == (4 + 6, 6 + 6 + 6)
    assert traffic("swiglu", "fused") == (6, 10)


def _cfg(**kw):
    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=1, gbs=8, mbs=1)
    base.update(kw)
    return build_config(**base)


def test_eager_layer_moves_more_bytes_and_same_flops():
    fused, eager = build_layer(_cfg()).compute, build_layer(_cfg(kernel_fusion="eager")).compute
    assert eager.flops.sum() == fused.flops.sum()
    mem = lambda df: df[df.kind == "memory"].bytes.sum()  # noqa: E731
    assert mem(eager) > 2 * mem(fused)
    # Llama: RMSNorm over 2 x [tokens, h], rope over q and k, SwiGLU over [tokens, ffn]
    m = _cfg().model
    tokens = _cfg().seq_length
    rope = tokens * (m.num_attention_heads + m.num_query_groups) * m.kv_channels
    extra_fwd = (2 * tokens * m.hidden_size * (36 - 4) + rope * (20 - 4) + tokens * m.ffn_hidden_size * (10 - 6))
    fwd = lambda df: df[(df.kind == "memory") & (df.phase == "fwd")].bytes.sum()  # noqa: E731
    assert fwd(eager) - fwd(fused) == pytest.approx(extra_fwd)
    # no linear biases in Llama, so no bias-gradient reductions
    assert not eager.name.str.contains("bias_grad").any()


def test_eager_head_upcasts_the_loss():
    cfg = _cfg(kernel_fusion="eager")
    head = build_head(cfg).compute
    ce = head[head.name.str.startswith("cross_entropy")]
    logits = cfg.seq_length * cfg.model.vocab_size
    assert ce.bytes.sum() == pytest.approx((14 + 22) * logits, rel=0.01)  # vocab padded to 128


def test_eager_grad_work_per_parameter():
    assert eager_grad_bytes_per_param(0, 4) == 4 * DDP_ACCUMULATE_BYTES_PER_PARAM + DDP_SCALE_BYTES_PER_PARAM == 28
    # FSDP2: chunk_cat of the bf16 gradients into the fp32 reduce-scatter input (2 + 4) per micro-batch; the
    # copy-outs of zero_stage 3 are the layer's rows, zero_stage 2's forward copy-out is here (4)
    assert eager_grad_bytes_per_param(3, 2) == 2 * (2 + 4) == 12
    assert eager_grad_bytes_per_param(3, 2, reduce_bytes=2) == 2 * (2 + 2)
    assert eager_grad_bytes_per_param(2, 1) == FSDP_COPY_BYTES_PER_PARAM + 2 + 4 == 10
    # FSDP1: cast bf16 -> fp32 (2 + 4) and the in-place pre-division in fp32 (4 + 4), no packing copy
    assert eager_grad_bytes_per_param(3, 2, fsdp_version=1) == 2 * (6 + 8) == 28
    assert eager_grad_bytes_per_param(2, 1, fsdp_version=1) == 14
    # reduce dtype bf16: no cast, the pre-division in bf16 (2 + 2)
    assert eager_grad_bytes_per_param(3, 1, fsdp_version=1, reduce_bytes=2) == 4


def test_fsdp_gradient_work_also_runs_under_torch_compile():
    """Inductor compiles the model, not FSDP's hooks: a compiled FSDP1 job pays the gradient cast and pre-division
    (14 bytes per parameter per micro-batch) as an eager one does; a Megatron-style fused job pays none."""
    from flowsim.gpu_specs import get_gpu
    from flowsim.kernels.memory import memory_reference, stream_efficiency
    from flowsim.model.workload import build_workload
    from flowsim.step.data_parallel import pytorch_wrapper
    from flowsim.step.optimizer import optimizer_s

    base = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=8, zero_stage=3, fsdp_version=1)
    compiled = build_config(**base, kernel_fusion="fused", host_overhead="compiled")
    fused = build_config(**base)
    assert pytorch_wrapper(compiled.training) and not pytorch_wrapper(fused.training)
    assert pytorch_wrapper(build_config(**base, kernel_fusion="eager").training)
    gpu = get_gpu("h100-sxm")
    wl = build_workload(fused)
    bw = gpu.hbm_Bps * stream_efficiency(memory_reference(gpu).measured)
    extra_s = float(optimizer_s(compiled, build_workload(compiled), gpu)[0] - optimizer_s(fused, wl, gpu)[0])
    # one micro-batch; the compiled step's few optimizer launches add microseconds of host time
    assert extra_s == pytest.approx(14 * wl.stage_params[0] / bw, rel=0.01)


def test_eager_step_is_slower_and_bad_value_is_named():
    import flowsim

    fused = flowsim.simulate(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=16, mbs=1)
    eager = flowsim.simulate(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=16, mbs=1, kernel_fusion="eager")
    assert eager.step_time_s > fused.step_time_s
    with pytest.raises(ConfigError) as e:
        _cfg(kernel_fusion="compiled")
    assert str(e.value) == "kernel_fusion: must be one of fused, eager (got compiled)"
