"""Optional: a Megatron-core GPTModel with tensor parallelism 2 captured from a script on CPU.

Skipped unless megatron-core is installed (``pip install --no-deps megatron-core``; checked with 0.16.1:
it imports on CPU without apex or Transformer Engine, falling back to torch norms and optimizers).

Model: 2 layers, h 256, 4 heads, vocab 1024, seq s 128, micro-batch b 2, fp32 (see docs/CAPTURE.md for
why not bf16), the local (non-TE) layer spec, TP 2 on ranks 0-1 of 16.
"""
import textwrap

import pytest

pytest.importorskip("megatron.core")

from flowsim.capture import capture_script  # noqa: E402

SCRIPT = """
    import contextlib
    import torch, torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig

    dist.init_process_group("nccl")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    # the RNG tracker compares CPU RNG states by value (.item()), which fake tensors do not have
    mrandom.CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
    cfg = TransformerConfig(num_layers=2, hidden_size=256, num_attention_heads=4, use_cpu_initialization=True,
                            tensor_model_parallel_size=2)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=1024,
                     max_sequence_length=128).cuda()
    tokens = torch.randint(0, 1024, (2, 128), device="cuda")
    position_ids = torch.arange(128, device="cuda").unsqueeze(0).expand(2, 128)
    loss = model(tokens, position_ids, None, labels=tokens)
    loss.sum().backward()
    """


def test_megatron_gpt_tp2(tmp_path):
    path = tmp_path / "megatron_gpt.py"
    path.write_text(textwrap.dedent(SCRIPT))
    w = capture_script([str(path)], world_size=16)
    act = 128 * 2 * 256 * 4  # [s, b, h] fp32
    # forward: vocab-parallel embedding + 2 row-parallel outputs per layer; vocab-parallel cross-entropy's 3
    # reductions over [s, b] (max logit, target logit, sum of exponentials); backward: the input gradients of
    # the column-parallel QKV and fc1 of each layer and of the LM head
    assert [(c["op"], c["size_bytes"], c["blocking"]) for c in w.comms()] == \
        [("allreduce", act, True)] * 5 + [("allreduce", 128 * 2 * 4, True)] * 3 + [("allreduce", act, True)] * 5
    assert {tuple(w.groups[c["group"]]) for c in w.comms()} == {(0, 1)}
    gemm = {(o["m"], o["n"], o["k"]) for o in w.compute() if o["kind"] == "gemm" and o["batch"] == 1}
    tokens = 128 * 2
    # forward GEMMs of one TP rank: QKV 3h/2, projection h/2 -> h, fc1 4h/2, fc2 4h/2 -> h, LM head V/2
    assert {(tokens, 384, 256), (tokens, 256, 128), (tokens, 512, 256), (tokens, 256, 512),
            (tokens, 512, 256)} <= gemm
