"""Fuzz: the command line and every file reader, driven through click's CliRunner.

Each case must end with exit 0 (and, for ``--json``, finite figures) or exit 2 with a last line
``Error: <field>: <rule>``; never a traceback (exit 1) or any other exception. Per CI run: 150 generated
``estimate`` argument lists, 40 ``topo`` / ``kernels predict`` argument lists, 20 generated files for each of
7 readers (140) and 10 cut or damaged Kineto traces: 340 cases, derandomized. ``FLOWSIM_FUZZ_CLI_SCALE``
multiplies them and ``FLOWSIM_FUZZ_SEED`` draws other cases, for a longer local run (docs/RELIABILITY.md).
"""
from __future__ import annotations

import functools
import gzip
import json
import math
import os
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from flowsim.cli import main

SCALE = float(os.environ.get("FLOWSIM_FUZZ_CLI_SCALE", "1"))
SEED = os.environ.get("FLOWSIM_FUZZ_SEED")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _settings(n: int):
    """Hypothesis settings for ``n`` cases (times the scale), derandomized unless a seed is given."""
    s = settings(max_examples=max(1, int(n * SCALE)), deadline=None, derandomize=SEED is None, database=None,
                 suppress_health_check=list(HealthCheck))
    return (lambda f: seed(int(SEED))(s(f))) if SEED else s


def check_cli(args: list[str]):
    """Run ``flowsim args``; assert a clean ending (see the module docstring); return the result."""
    r = CliRunner().invoke(main, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception))
    assert "Traceback" not in r.output, (args, r.output[-2000:])
    assert r.exit_code in (0, 2), (args, r.exit_code, r.output[-2000:])
    if r.exit_code == 2:
        last = r.output.strip().splitlines()[-1]
        assert last.startswith("Error: "), (args, r.output[-2000:])
    elif "--json" in args:
        data = json.loads(r.output)
        for key in ("step_time_s", "mfu", "hfu", "tokens_per_s", "time_s"):
            if key in data:
                assert isinstance(data[key], (int, float)) and math.isfinite(data[key]), (args, key, data[key])
    return r


# --- argument lists -----------------------------------------------------------------------------------------

NUMBERS = st.one_of(st.sampled_from(["0", "-1", "1", "2", "3", "8", "64", "1e9", "1000000000", "1099511627776",
                                     "nan", "inf", "-inf", "1e-9", "0.5", "", "abc", "2**10", "1_000"]),
                    st.integers(-5, 5000).map(str))
ESTIMATE_FLAGS = ("--gpus", "--tp", "--pp", "--vpp", "--dp", "--cp", "--ep", "--mbs", "--gbs", "--seq",
                  "--nic-gbps", "--nics-per-node", "--gpus-per-node", "--zero-stage")
SET_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "bucket_size_bytes", "oversubscription",
            "nic_latency_s", "etp", "num_moe_experts", "switch_radix", "vocab_size", "hidden_dropout",
            "recompute_num_layers", "tp", "tensor_model_parallel_size", "unknown_key", "seq_length")


@st.composite
def estimate_args(draw) -> list[str]:
    args = ["estimate", "--model", draw(st.sampled_from(["llama3-8b", "llama2-7b", "mixtral-8x7b", "nope"])),
            "--cluster", draw(st.sampled_from(["dgx-h100", "dgx-a100", "gb200-nvl72"]))]
    if draw(st.booleans()):
        args += ["--gpus", "8"]
    for flag in draw(st.lists(st.sampled_from(ESTIMATE_FLAGS), max_size=3, unique=True)):
        args += [flag, draw(NUMBERS)]
    for key in draw(st.lists(st.sampled_from(SET_KEYS), max_size=2, unique=True)):
        args += ["--set", f"{key}={draw(NUMBERS)}"]
    if draw(st.booleans()):
        args.append("--json")
    return args


@_settings(150)
@given(estimate_args())
def test_estimate_arguments(args):
    check_cli(args)


@st.composite
def other_args(draw) -> list[str]:
    if draw(st.booleans()):
        args = ["topo", "--cluster", draw(st.sampled_from(["dgx-h100", "gb200-nvl72"]))]
        for flag in draw(st.lists(st.sampled_from(["--gpus", "--nic-gbps", "--oversubscription", "--switch-radix",
                                                   "--nics-per-node", "--leaves-per-rail"]), max_size=2, unique=True)):
            args += [flag, draw(NUMBERS)]
        return args
    op = draw(st.sampled_from(["gemm", "attn_fwd", "memory"]))
    shape = ",".join(draw(st.lists(NUMBERS, min_size=1, max_size=5)))
    return ["kernels", "predict", "--gpu", "h100-sxm", "--op", op, "--shape", shape, "--json"]


@_settings(40)
@given(other_args())
def test_topo_and_kernel_arguments(args):
    check_cli(args)


# --- files --------------------------------------------------------------------------------------------------

def _sample(name: str) -> bytes:
    return (SHARED / name).read_bytes()


@functools.lru_cache(maxsize=1)
def _valid_files() -> dict:
    """A valid input per reader (from the shared data or built here), the seed of each file mutation."""
    lines = _sample("simai/workload_analytical.txt").splitlines(keepends=True)
    return {
        "config": b"model: llama3-8b\ncluster: dgx-h100\ngpus: 8\ngbs: 16\n",
        "runs": b"\n".join(_sample("curated/training_runs_public.csv").splitlines()[:4]) + b"\n",
        "nccl": _sample("nccl-tests/a100_8gpu_allreduce_sxm4_80gb_g8.txt"),
        "simai": b"".join(lines[:2]).replace(b"1789", b"3") + b"".join(lines[2:5]),
        "aicb": b"\n".join(_sample("simai/aicb_A100_example.csv").splitlines()[:30]) + b"\n",
        "study": b"name: s\njob: {model: llama3-8b, cluster: dgx-h100, gpus: 8, gbs: 16}\n",
        "workload": json.dumps({"format": "flowsim-workload", "version": 2}).encode(),
        "trace": gzip.decompress(_sample("traces/hta_a100_2rank_ddp_nccl.json.gz"))[:300_000],
    }


COMMANDS = {
    "config": ["estimate", "{f}", "--json"],
    "runs": ["validate", "{f}", "--json"],
    "nccl": ["validate-nccl", "--cluster", "dgx-a100", "{f}"],
    "simai": ["simai", "run", "--simai-analytical", "{f}"],
    "aicb": ["simai", "aicb-log", "--cluster", "dgx-a100", "--tp", "1", "{f}"],
    "study": ["sweep", "{f}", "--jobs", "1", "--no-progress", "--db", "{db}"],
    "workload": ["estimate", "--workload", "{f}", "--cluster", "dgx-h100"],
    "trace": ["validate-trace", "{f}", "--cluster", "dgx-a100"],
}


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """``data`` after one hostile edit: truncation, random bytes, a BOM, Latin-1, NaN/inf cells, deep nesting,
    gzip (whole or cut), or an empty file."""
    kind = draw(st.sampled_from(["truncate", "bytes", "bom", "latin1", "nonfinite", "nest", "gzip", "gzip_cut",
                                 "empty", "flip", "same"]))
    if kind == "truncate":
        return data[:draw(st.integers(0, len(data)))]
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind == "latin1":
        at = draw(st.integers(0, len(data)))
        return data[:at] + "\xe9\xff".encode("latin-1") + data[at:]
    if kind == "nonfinite":
        word = draw(st.sampled_from([b"inf", b"nan", b"Infinity", b"NaN", b"-inf", b"1e999"]))
        return data.replace(b"8", word, draw(st.integers(1, 3)))
    if kind == "nest":
        return b"[" * draw(st.integers(100, 20000))
    if kind == "gzip":
        return gzip.compress(data)
    if kind == "gzip_cut":
        z = gzip.compress(data)
        return z[:draw(st.integers(2, max(2, len(z) - 1)))]
    if kind == "empty":
        return b""
    if kind == "flip":
        at = draw(st.integers(0, max(0, len(data) - 1)))
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    return data


def _file_case(reader: str, n: int = 20):
    seed = _valid_files()[reader]

    @_settings(n)
    @given(mutated(seed))
    def case(data):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            f = Path(tmp) / ("in.json" if reader in ("workload", "trace") else "in.yaml" if reader in ("config", "study")
                             else "in.csv" if reader in ("runs", "aicb") else "in.txt")
            f.write_bytes(data)
            check_cli([a.format(f=f, db=Path(tmp) / "r.sqlite") for a in COMMANDS[reader]])

    return case


test_config_files = _file_case("config")
test_runs_files = _file_case("runs")
test_nccl_logs = _file_case("nccl")
test_simai_workloads = _file_case("simai")
test_aicb_logs = _file_case("aicb")
test_study_files = _file_case("study")
test_captured_workloads = _file_case("workload")
test_kineto_traces = _file_case("trace", 10)
