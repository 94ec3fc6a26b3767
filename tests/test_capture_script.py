"""``flowsim capture -- python train.py ARGS``: a user's training script captured in-process on CPU.

examples/capture_gpt_train.py builds the model of flowsim.capture.gpt_example (2 blocks, h 256, 4 heads,
vocab 1024, seq 128, batch 2, bf16) with plain PyTorch and CUDA calls (``torch.cuda.set_device``,
``device="cuda:N"``, ``DDP(device_ids=[local_rank])``), so its capture must equal the in-process callable
capture of the same model op for op.
"""
import json
import os
import sys
import textwrap
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from flowsim.capture import capture, capture_script, gpt_example, load  # noqa: E402
from flowsim.capture import script as script_module  # noqa: E402
from flowsim.cli import main  # noqa: E402
from flowsim.errors import ConfigError  # noqa: E402

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "capture_gpt_train.py")


def _without_group_names(w):
    """Ops with group keys replaced by their rank lists (keys depend on the order groups were first used)."""
    return [dict(o, group=w.groups[o["group"]]) if o["type"] == "comm" else o for o in w.ops]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_cli_script_equals_callable_capture(parallel, tmp_path):
    out = tmp_path / "w.json"
    res = CliRunner().invoke(main, ["capture", "--world-size", "64", "--out", str(out), "--", "python", EXAMPLE,
                                    "--parallel", parallel, "--bucket-cap-mb", "0.25"])
    assert res.exit_code == 0, res.output
    w = load(out)
    setup, step = gpt_example(parallel, 64, bucket_cap_mb=0.25)
    ref = capture(step, setup=setup, world_size=64)
    # the same collectives (sizes, groups, overlap structure) and the same kernels, in the same order
    assert _without_group_names(w) == _without_group_names(ref)
    sizes = sorted((c["op"], c["size_bytes"]) for c in w.comms())
    if parallel == "ddp":  # the 8 buckets of tests/test_capture.py::test_ddp_buckets
        assert sizes == sorted(("allreduce", b) for b in (524288, 525824, 525824, 526336, 526336, 527360, 527360,
                                                          525312))
    else:  # 4 block gathers, 1 root gather, 2 block and 1 root reduce-scatters (test_fsdp2_gathers_...)
        assert sizes == sorted([("allgather", 1049600)] + [("allgather", 1579520)] * 4
                               + [("reducescatter", 1579520)] * 2 + [("reducescatter", 1049600)])
    assert {len(w.groups[c["group"]]) for c in w.comms()} == {64}
    assert f"of rank 0/64\n-> {out}" in res.output
    est = CliRunner().invoke(main, ["estimate", "--workload", str(out), "--cluster", "dgx-h100", "--json"])
    assert est.exit_code == 0, est.output
    assert json.loads(est.output)["pipeline"] is None


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_launcher_environment_cuda_calls_and_restore(tmp_path):
    """The script sees torchrun's variables, a fake process group under any backend, and CUDA on the CPU."""
    script = _script(tmp_path, """
        import os, sys
        import torch, torch.distributed as dist
        env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                          "MASTER_ADDR", "MASTER_PORT", "FLOWSIM_CAPTURE")}
        assert env == {"RANK": "13", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8",
                       "GROUP_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                       "FLOWSIM_CAPTURE": "1"}, env
        assert sys.argv == [__file__, "--lr", "3"], sys.argv
        dist.init_process_group(backend="nccl", init_method="env://")
        assert (dist.get_rank(), dist.get_world_size()) == (13, 16)
        assert torch.cuda.is_available() and torch.cuda.device_count() == 8
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
        model = torch.nn.Linear(64, 32).to(device).cuda()
        x = torch.randn(8, 64).cuda().pin_memory()
        assert x.type() == "torch.cuda.FloatTensor" and x.type(torch.bfloat16).dtype == torch.bfloat16
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = model(x + torch.ones(64, device="cuda:5"))
        dist.all_reduce(y)
        torch.cuda.synchronize()
        dist.destroy_process_group()
        """)
    w = capture_script(["python", script, "--lr", "3"], world_size=16, ranks=[13])
    gemm = [o for o in w.compute() if o["kind"] == "gemm"]
    assert [(o["m"], o["n"], o["k"], o["dtype"]) for o in gemm] == [(8, 32, 64, "bf16")]  # autocast on the CPU
    assert [(c["op"], c["size_bytes"], c["blocking"]) for c in w.comms()] == [("allreduce", 8 * 32 * 2, True)]
    assert w.rank == 13 and w.label == f"python {script} --lr 3"
    # everything is restored: no process group, no launcher variables, torch.cuda as on this machine
    assert not torch.distributed.is_initialized()
    assert "RANK" not in os.environ and "FLOWSIM_CAPTURE" not in os.environ
    assert not torch.cuda.is_available()


def test_framework_state_is_reset_between_ranks(tmp_path, monkeypatch):
    """Every rank runs in this process: a framework that keeps its process groups in module globals (Megatron's
    parallel_state, which refuses a second initialisation) has them reset after each rank."""
    state = types.ModuleType("flowsim_test_parallel_state")
    state.group = None

    def reset():
        state.group = None

    state.reset = reset
    monkeypatch.setitem(sys.modules, state.__name__, state)
    monkeypatch.setattr(script_module, "FRAMEWORK_RESETS", {state.__name__: "reset"})
    script = _script(tmp_path, """
        import torch, torch.distributed as dist
        import flowsim_test_parallel_state as state
        assert state.group is None, "initialised twice"
        state.group = dist.new_group([0, 1])
        dist.all_reduce(torch.ones(4), group=state.group)
        """)
    w = capture_script([script], world_size=4, ranks=[0, 1])
    assert [[c["size_bytes"] for c in w.comms(s)] for s in range(2)] == [[16], [16]]
    assert state.group is None


STEPS = """
    import sys
    import torch
    import flowsim.capture
    model = torch.nn.Linear(16, 16)
    for i in range(int(sys.argv[1])):
        torch.randn(3)                     # between steps: not recorded
        with flowsim.capture.step():
            model(torch.randn(4, 16)).sum().backward()
        print("finished step", i + 1)
    """


def test_step_markers(tmp_path, capsys):
    script = _script(tmp_path, STEPS)
    # default: the last marked step, only its ops; the autograd engine's are tagged backward (weight and
    # bias gradients, accumulated into the gradients of the earlier steps)
    w = capture_script([script, "3"], world_size=8)
    assert [(o["name"], o.get("backward", False)) for o in w.ops] == [
        ("aten.randn.default", False), ("aten.addmm.default", False), ("aten.sum.default", False),
        ("aten.ones_like.default", False), ("aten.mm.default", True), ("aten.sum.dim_IntList", True),
        ("aten.add_.Tensor", True), ("aten.add_.Tensor", True)]
    assert "finished step 3" in capsys.readouterr().out
    # --step 2 of 5: the script is stopped right after its second step
    w2 = capture_script([script, "5"], world_size=8, step=2)
    assert w2.ops == w.ops
    out = capsys.readouterr().out
    assert "finished step 1" in out and "finished step 2" not in out
    with pytest.raises(ConfigError, match=r"^step: must be at most the 3 marked steps the script ran \(got 4\)"):
        capture_script([script, "3"], world_size=8, step=4)
    unmarked = _script(tmp_path, "import torch\ntorch.randn(3) + 1\n")
    assert [o["name"] for o in capture_script([unmarked], world_size=8).ops] == ["aten.randn.default",
                                                                                 "aten.add.Tensor"]
    with pytest.raises(ConfigError, match="step: needs flowsim.capture.step"):
        capture_script([unmarked], world_size=8, step=1)


def test_unmarked_ddp_script_runs_several_steps(tmp_path):
    """Without markers everything is recorded, DDP's constructor broadcast included; its bucket rebuild at
    the second forward works on fake tensors."""
    script = _script(tmp_path, """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64).cuda())
        for _ in range(3):
            model(torch.randn(8, 64, device="cuda")).sum().backward()
        """)
    w = capture_script([script], world_size=16)
    reduces = [c for c in w.comms() if c["op"] == "allreduce"]
    assert [(c["size_bytes"], c["blocking"]) for c in reduces] == [((64 * 64 + 64) * 4, False)] * 3
    assert w.comms()[0]["op"] == "broadcast" and w.comms()[0]["size_bytes"] == (64 * 64 + 64) * 4


@pytest.mark.parametrize("body, message", [
    ("x = 1\nraise ValueError('bad lr')\n", "Error: script: ValueError: bad lr (at {script}:2)"),
    ("import sys\nsys.exit(3)\n", "Error: script: must exit with status 0 (got 3)"),
    ("import math\nmath.sqrt(4)\n", "Error: script: recorded no op (no torch op ran in the recorded part) "
                                    "(got {script})"),
])
def test_cli_script_errors_are_one_line(tmp_path, body, message):
    script = _script(tmp_path, body)
    res = CliRunner().invoke(main, ["capture", "--world-size", "8", "--out", str(tmp_path / "w.json"), "--",
                                    "python", script])
    assert res.exit_code == 2
    assert res.output.strip() == message.format(script=script)


def test_cli_capture_argument_errors(tmp_path):
    out = str(tmp_path / "w.json")
    cases = [(["--", "python", str(tmp_path / "missing.py")], "Error: script: must be an existing .py file"),
             (["--example", "gpt-ddp", "--", "python", EXAMPLE], "Error: script: give either --example"),
             ([], "Error: script: give either --example NAME or a script after '--' (not both) (got neither)"),
             (["--example", "gpt-ddp", "--rank", "0", "--rank", "8"], "Error: --rank: takes one rank with --example")]
    for args, message in cases:
        res = CliRunner().invoke(main, ["capture", "--world-size", "8", "--out", out, *args])
        assert res.exit_code == 2 and res.output.startswith(message), (args, res.output)
