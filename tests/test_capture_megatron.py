"""Megatron-core GPTModel captured from scripts on CPU: tensor parallelism, and TP x PP x DP with Megatron's own
1F1B schedule.

megatron-core 0.16.1 is in the ``test`` extra (and the ``megatron`` extra); it imports on CPU without apex or
Transformer Engine, falling back to torch norms and optimizers. The module is skipped where it is absent.

Both scripts use the local (non-TE) layer spec, h 256, 4 heads, vocab V 1024, seq s 128, micro-batch b 2.

* TP: 2 layers, TP 2 on ranks 0-1 of 16, fp32 (learned absolute position embeddings: docs/CAPTURE.md says why
  they need fp32 here), one forward and backward.
* PP: 8 layers, TP 2 x PP 4 x DP 2 on 16 ranks (Megatron's order: rank = tp + 2 dp + 4 pp, so stage p holds
  ranks 4p .. 4p + 3), bf16 with rotary embeddings, embedding tied to the output layer, Megatron's
  DistributedDataParallel and ``finalize_model_grads``, ``get_forward_backward_func()`` over m = 8 micro-batches,
  Megatron's Adam. Captured ranks 0, 4, 8, 12 (one per stage).

Workarounds in the scripts (docs/CAPTURE.md): the RNG tracker's ``fork`` (both) and the optimizer's gradient
norm (PP) read tensor values, which fake tensors do not have.

Parameters of one TP rank (h = 256): a layer's QKV 3h^2/2 + 3h/2, projection h^2/2 + h, fc1 2h^2 + 2h,
fc2 2h^2 + h = 394,624 (bf16) and its two LayerNorms 4h = 1024 (torch LayerNorm, fp32); the embedding (and the
tied output layer) V h / 2 = 131,072; the final LayerNorm 2h = 512 (fp32).
"""
import textwrap

import pytest

pytest.importorskip("megatron.core")

from flowsim.capture import capture_script, load, save  # noqa: E402
from flowsim.capture.program import simulate_workload  # noqa: E402

RNG_WORKAROUND = """
    # the RNG tracker compares CPU RNG states by value (.item()), which fake tensors do not have
    mrandom.CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
"""

TP_SCRIPT = """
    import contextlib
    import torch, torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig

    dist.init_process_group("nccl")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
""" + RNG_WORKAROUND + """
    cfg = TransformerConfig(num_layers=2, hidden_size=256, num_attention_heads=4, use_cpu_initialization=True,
                            tensor_model_parallel_size=2)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=1024,
                     max_sequence_length=128).cuda()
    tokens = torch.randint(0, 1024, (2, 128), device="cuda")
    position_ids = torch.arange(128, device="cuda").unsqueeze(0).expand(2, 128)
    loss = model(tokens, position_ids, None, labels=tokens)
    loss.sum().backward()
    """

PP_SCRIPT = """
    import contextlib
    import torch, torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer.optimizer import ChainedOptimizer, MegatronOptimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig
    from flowsim.capture import step as capture_step

    S, B, V, M = 128, 2, 1024, 8
    dist.init_process_group("nccl")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=4)
""" + RNG_WORKAROUND + """
    cfg = TransformerConfig(num_layers=8, hidden_size=256, num_attention_heads=4, use_cpu_initialization=True,
                            tensor_model_parallel_size=2, pipeline_model_parallel_size=4, bf16=True,
                            params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=V,
                     max_sequence_length=S, position_embedding_type="rope",
                     share_embeddings_and_output_weights=True,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage()).cuda()
    model = DistributedDataParallel(cfg, DistributedDataParallelConfig(), model)
    cfg.no_sync_func, cfg.finalize_model_grads_func = model.no_sync, finalize_model_grads
    # the gradient norm is read with .item(), which fake tensors cannot answer: a constant norm instead
    MegatronOptimizer.get_grad_norm = ChainedOptimizer.get_grad_norm = lambda self: 1.0
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True), [model])
    tokens = torch.randint(0, V, (B, S), device="cuda")
    position_ids = torch.arange(S, device="cuda").unsqueeze(0).expand(B, S)

    def forward_step(data_iterator, model):
        output = model(tokens, position_ids, None, labels=tokens)  # per-token loss on the last stage
        return output, lambda loss: (loss.sum(), {})

    for microbatches in (1, M):  # a cheap first step creates Adam's state; the capture keeps the last step
        with capture_step():
            model.zero_grad_buffer()
            optimizer.zero_grad()
            get_forward_backward_func()(forward_step_func=forward_step, data_iterator=None, model=[model],
                                        num_microbatches=microbatches, seq_length=S, micro_batch_size=B)
            optimizer.step()
    """

S, B, H, V = 128, 2, 256, 1024
P, M, TP = 4, 8, 2
RANKS = [0, 4, 8, 12]
LAYER = 3 * H * H // 2 + 3 * H // 2 + H * H // 2 + H + 2 * H * H + 2 * H + 2 * H * H + H  # bf16, one TP rank
LAYER_NORMS = 4 * H  # fp32
EMBEDDING = V * H // TP


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_megatron_gpt_tp2(tmp_path):
    w = capture_script([_script(tmp_path, "megatron_gpt.py", TP_SCRIPT)], world_size=16)
    act = S * B * H * 4  # [s, b, h] fp32
    # forward: vocab-parallel embedding + 2 row-parallel outputs per layer; vocab-parallel cross-entropy's 3
    # reductions over [s, b] (max logit, target logit, sum of exponentials); backward: the input gradients of
    # the column-parallel QKV and fc1 of each layer and of the LM head
    assert [(c["op"], c["size_bytes"], c["blocking"]) for c in w.comms()] == \
        [("allreduce", act, True)] * 5 + [("allreduce", S * B * 4, True)] * 3 + [("allreduce", act, True)] * 5
    assert {tuple(w.groups[c["group"]]) for c in w.comms()} == {(0, 1)}
    gemm = {(o["m"], o["n"], o["k"]) for o in w.compute() if o["kind"] == "gemm" and o["batch"] == 1}
    tokens = S * B
    # forward GEMMs of one TP rank: QKV 3h/2, projection h/2 -> h, fc1 4h/2, fc2 4h/2 -> h, LM head V/2
    assert {(tokens, 384, 256), (tokens, 256, 128), (tokens, 512, 256), (tokens, 256, 512),
            (tokens, 512, 256)} <= gemm


@pytest.fixture(scope="module")
def pp(tmp_path_factory):
    script = _script(tmp_path_factory.mktemp("megatron_pp"), "megatron_pp.py", PP_SCRIPT)
    return capture_script([script], world_size=16, ranks=RANKS)


def _megatron_1f1b(s: int) -> list:
    """(direction, peer) of stage ``s``'s point-to-point calls in Megatron's non-interleaved 1F1B
    (forward_backward_pipelining_without_interleaving; a batched call sends before it receives)."""
    prev = [RANKS[s - 1]] if s > 0 else []
    nxt = [RANKS[s + 1]] if s < P - 1 else []
    recv_fwd, send_fwd = [("recv", r) for r in prev], [("send", r) for r in nxt]
    recv_bwd, send_bwd = [("recv", r) for r in nxt], [("send", r) for r in prev]
    warmup = min(P - s - 1, M)
    calls = (recv_fwd + send_fwd) * warmup + recv_fwd
    for i in range(M - warmup):  # steady state: forward, send it and receive its gradient, backward
        calls += send_fwd + recv_bwd + send_bwd + (recv_fwd if i < M - warmup - 1 else [])
    return calls + (recv_bwd + send_bwd) * warmup  # cool-down backwards


def test_megatron_pp_p2p_per_stage(pp):
    act = S * B * H * 2  # one micro-batch's [s, b, h] activation (or its gradient), bf16
    assert [st.rank for st in pp.stages] == RANKS
    for s in range(P):
        p2p = [c for c in pp.comms(s) if "peer" in c]
        got = [("send" if c["name"] == "c10d.send.default" else "recv", c["peer"]) for c in p2p]
        assert got == _megatron_1f1b(s), s
        assert len(got) == 2 * M * (1 if s in (0, P - 1) else 2)
        assert {(c["op"], c["size_bytes"], c["dtype"], c["blocking"]) for c in p2p} == {("sendrecv", act, "bf16", True)}
        assert {tuple(pp.groups[c["group"]]) for c in p2p} == {tuple(RANKS)}  # Megatron's pipeline group


def test_megatron_pp_tensor_parallel_all_reduces(pp):
    act = S * B * H * 2
    # per micro-batch: 2 row-parallel outputs per layer (forward) and 2 column-parallel input gradients per
    # layer (backward), 2 layers per stage; the first stage adds the vocab-parallel embedding's reduction, the
    # last the LM head's input gradient and cross-entropy's 3 fp32 reductions over [s, b]
    per_mb = {0: {act: 9}, 1: {act: 8}, 2: {act: 8}, 3: {act: 9, S * B * 4: 3}}
    for s, rank in enumerate(RANKS):
        tp = [c for c in pp.comms(s) if pp.groups[c["group"]] == [rank, rank + 1]]
        assert all(c["op"] == "allreduce" and c["blocking"] for c in tp)
        sizes = {}
        for c in tp:
            sizes[c["size_bytes"]] = sizes.get(c["size_bytes"], 0) + 1
        assert sizes == {size: M * n for size, n in per_mb[s].items()}, s


def test_megatron_pp_gradient_sync_after_the_last_backward(pp):
    # Megatron's DDP: one coalesced all-reduce per grad buffer (bf16 weights, fp32 torch LayerNorms) over the
    # stage's 2 data-parallel ranks; the tied embedding's gradient is all-reduced between the first and last
    # stages (ranks 0 and 12)
    bf16 = {0: 2 * LAYER + EMBEDDING, 1: 2 * LAYER, 2: 2 * LAYER, 3: 2 * LAYER + EMBEDDING}
    fp32 = {0: 2 * LAYER_NORMS, 1: 2 * LAYER_NORMS, 2: 2 * LAYER_NORMS, 3: 2 * LAYER_NORMS + 2 * H}
    for s, rank in enumerate(RANKS):
        ops = pp.stages[s].ops
        last_backward = max(i for i, o in enumerate(ops) if o.get("backward"))
        tail = [o for o in ops[last_backward:] if o["type"] == "comm"]
        dp = [(o["name"], o["size_bytes"]) for o in tail if pp.groups[o["group"]] == [rank, rank + TP]]
        assert sorted(dp) == sorted([("c10d.allreduce_coalesced_.default", 2 * bf16[s]),
                                     ("c10d.allreduce_coalesced_.default", 4 * fp32[s])]), s
        embedding = [o["size_bytes"] for o in tail if pp.groups[o["group"]] == [0, 12]]
        assert embedding == ([2 * EMBEDDING] if s in (0, P - 1) else []), s


def test_megatron_pp_simulates_with_a_1f1b_bubble(pp, tmp_path):
    """On an NVL72 rack (all 16 ranks share NVLink) the critical stage ends where 1F1B puts it: the first
    micro-batch crosses every stage and back, the other m - 1 follow at the pace of the slowest stage."""
    path = tmp_path / "megatron_pp.json"
    save(pp, path)
    r = simulate_workload(load(path), "gb200-nvl72")
    pipe = r.pipeline
    assert (pipe.microbatches, pipe.schedule, pipe.p2p_bytes) == (M, "1f1b", S * B * H * 2)
    fb = pipe.fwd_s + pipe.bwd_s
    assert (pipe.p2p_s < 0.05 * fb).all() and (pipe.tail_s > 0).all()
    c = pipe.critical_stage
    assert pipe.end_s[c] == pytest.approx(fb.sum() + (M - 1) * fb.max() + 2 * (P - 1) * pipe.p2p_s, rel=0.02)
    assert r.bubble_s == pytest.approx(pipe.end_s[c] - M * fb[c])
    assert r.bubble_s > (P - 1) * fb.min()  # at least the (p - 1) micro-batch slots of 1F1B's fill and drain
    assert r.step_time_s == pytest.approx(pipe.end_s[c] + pipe.tail_s[c])
