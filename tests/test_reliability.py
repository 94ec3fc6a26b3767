"""Issue 21's reproducers: every bad input ends in one line naming the field and the rule, never a traceback,
a hang or a wrong number (config bounds, cross-field rules, file encodings, output paths, invariants)."""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

import flowsim
from flowsim.cli import main
from flowsim.config import build_config
from flowsim.errors import ConfigError
from flowsim.step.invariants import InvariantError, check_result, violations

BASE = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "gbs": 64}
MIXTRAL = {"model": "mixtral-8x7b", "cluster": "dgx-h100", "gpus": 64, "pp": 4, "ep": 2}


def _err(**kw) -> str:
    with pytest.raises(ConfigError) as e:
        build_config({**BASE, **kw})
    return str(e.value)


@pytest.mark.parametrize("kw, message", [
    (dict(num_layers=10**9), "num_layers: must be <= 10,000 (~60x the deepest published model) (got 1000000000)"),
    (dict(seq=1099511627776), "seq_length: must be <= 16,777,216 (16x the longest published training context) "
                              "(got 1099511627776)"),
    (dict(num_attention_heads=10**9), "num_attention_heads: must be <= 4,096 (25x the most heads of a published "
                                      "model) (got 1000000000)"),
    (dict(gbs=10**12), "global_batch_size: must be <= 16,777,216 (1,000x the largest published global batch) "
                       "(got 1000000000000)"),
    (dict(nic_gbps=1e-9), "nic_gbps: must be a finite number in [1, 100000] Gb/s (1 GbE to 125x today's fastest "
                          "NIC) (got 1e-09)"),
    (dict(nic_gbps=math.inf), "nic_gbps: must be a finite number in [1, 100000] Gb/s (1 GbE to 125x today's "
                              "fastest NIC) (got inf)"),
    (dict(nic_gbps=math.nan), "nic_gbps: must be a finite number in [1, 100000] Gb/s (1 GbE to 125x today's "
                              "fastest NIC) (got nan)"),
    (dict(oversubscription=math.inf), "oversubscription: must be a finite number in [1, 100] (1 = non-blocking) "
                                      "(got inf)"),
    (dict(nic_latency_s=math.inf), "nic_latency_s: must be a finite number in [0, 1] s (got inf)"),
    (dict(bucket_size_bytes=1), "bucket_size_bytes: must leave at most 65,536 gradient buckets (>= 490,128 bytes "
                                "for this model) (got 1.0)"),
    (dict(bucket_size_bytes=math.inf), "bucket_size_bytes: must be a finite number >= 0 (0 = the framework's "
                                       "default) (got inf)"),
    (dict(gpus=2**21, gbs=2**21), "num_gpus: must be <= 1,048,576 (5x the largest announced cluster) "
                                  "(got 2097152)"),
    (dict(num_moe_experts=8, tp=2), "sequence_parallel: a MoE model with tensor_model_parallel_size > 1 needs "
                                    "sequence_parallel (megatron-core's MoE layer requires it) (got tp=2, sp=false)"),
    (dict(tp=2, tensor_model_parallel_size=1), "tensor_model_parallel_size: given twice in one source; keep one "
                                               "(got 'tp' and 'tensor_model_parallel_size')"),
    (dict(gpus=8, pp=8, num_layers=64, gbs=2**19),
     "global_batch_size: pipeline_model_parallel_size * virtual_pipeline_model_parallel_size * micro-batches must "
     "be <= 2,097,152 (16x a large real job; the schedule's size) (got 8*1*524288=4,194,304)"),
    # the 10,000-config fuzz run's one example over 10 s (25 s: 45M default gradient buckets)
    (dict(model="llama3-70b", num_moe_experts=16288, hidden_size=16288),
     "model: must have at most 3.52e+13 parameters (~20x the largest published model; keeps the gradient buckets "
     "bounded) (got 1.83e+15)"),
    (dict(gpus=32768, comm_engine="flow", switch_radix=512, gbs=32768),
     "comm_engine: flow is bounded to 16,384 GPUs (one estimate would take minutes); use analytic (got 32768 GPUs)"),
])
def test_bounds_name_the_field_and_the_limit(kw, message):
    assert _err(**kw) == message


def test_duplicate_keys_across_flat_and_nested_sections():
    assert _err(training={"tensor_model_parallel_size": 1}, tp=2).startswith(
        "tensor_model_parallel_size: given twice in one source")
    # later sources still override earlier ones
    assert build_config(BASE, {"tp": 2}, tensor_model_parallel_size=4).training.tp == 4


def test_limits_still_admit_the_largest_published_jobs():
    cfg = build_config({"model": "gpt3-175b", "cluster": "dgx-h100", "gpus": 1024, "tp": 8, "pp": 8,
                        "gbs": 1536, "sp": True, "distributed_optimizer": True})
    assert cfg.cluster.num_gpus == 1024
    build_config({"model": "deepseek-v3", "cluster": "dgx-h100", "gpus": 2048, "pp": 16, "ep": 64, "gbs": 15360,
                  "pipeline_layer_split": "balanced"})


def test_invariants_hold_and_refuse_a_wrong_result():
    r = flowsim.simulate(BASE)
    assert violations(r) == []
    check_result(r)
    bad = dataclasses.replace(r, hfu=r.mfu / 2)  # HFU below MFU: impossible
    with pytest.raises(InvariantError) as e:
        check_result(bad)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("internal error: 0 < MFU <= HFU <= 1 must hold")
    assert "name=llama3-8b" in msg and "num_gpus=8" in msg
    nan = dataclasses.replace(r, step_time_s=float("nan"))
    assert violations(nan) == ["step_time_s must be finite and > 0 (got nan)"]
    long_stage = dataclasses.replace(r.stages[0], bubble_s=2 * r.step_time_s)
    assert "stage 0 bubble_s must be finite" in violations(dataclasses.replace(r, stages=(long_stage,)))[0]


def test_moe_layouts_of_the_issue_give_mfu_below_hfu():
    for cfg in ({**MIXTRAL, "tp": 1, "etp": 4},
                {"model": "llama2-7b", "cluster": "dgx-h100", "gpus": 8, "num_moe_experts": 8, "etp": 4}):
        r = flowsim.simulate(cfg)
        assert violations(r) == [], cfg


# --- files --------------------------------------------------------------------------------------------------

def _run(*args):
    r = CliRunner().invoke(main, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def _one_line_error(r, code=2) -> str:
    assert r.exit_code == code, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    return lines[0]


@pytest.mark.parametrize("name, data, message", [
    ("latin1.yaml", "model: llama3-8b\nname: caf\xe9\n".encode("latin-1"),
     "Error: config: not UTF-8 text (byte 0xe9 at offset 26); save it as UTF-8"),
    ("binary.yaml", bytes(range(256)), "Error: config: not UTF-8 text (byte 0x80 at offset 128); save it as UTF-8"),
    ("nul.yaml", b"model: llama3-8b\x00\n", "Error: config: is a binary file, not text (NUL byte at offset 16)"),
    ("deep.yaml", b"[" * 50000, "Error: config: YAML nested deeper than 32 levels"),
    ("inf.json", b'{"model": "llama3-8b", "nic_gbps": Infinity}',
     "Error: config: not valid JSON: Infinity is not a number JSON allows"),
    ("nan.json", b'{"model": "llama3-8b", "nic_gbps": NaN}',
     "Error: config: not valid JSON: NaN is not a number JSON allows"),
    ("dup.json", b'{"model": "llama3-8b", "tp": 1, "tp": 2}', "Error: config: not valid JSON: key 'tp' given twice"),
    ("dup.yaml", b"model: llama3-8b\ntp: 1\ntp: 2\n", "Error: config: not valid YAML: key 'tp' given twice"),
    ("alias.yaml", b"model: llama3-8b\ncluster: dgx-h100\ntp: 2\ntensor_model_parallel_size: 1\n",
     "Error: tensor_model_parallel_size: given twice in one source; keep one (got 'tp' and "
     "'tensor_model_parallel_size')"),
])
def test_config_files_that_are_not_clean_utf8_are_one_line_errors(tmp_path, name, data, message):
    p = tmp_path / name
    p.write_bytes(data)
    line = _one_line_error(_run("estimate", str(p)))
    assert line.startswith(message), line


def test_a_bom_is_accepted(tmp_path):
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({**BASE, "gbs": 8}).encode())
    r = _run("estimate", str(p), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["config"]["training"]["global_batch_size"] == 8


def test_cli_bounds_are_one_line_errors():
    base = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"]
    assert _one_line_error(_run(*base, "--seq", "1099511627776")).startswith("Error: seq_length: must be <=")
    assert _one_line_error(_run(*base, "--set", "num_layers=1000000000")).startswith("Error: num_layers: must be")
    assert _one_line_error(_run(*base, "--nic-gbps", "inf")).startswith("Error: nic_gbps: must be a finite")
    assert _one_line_error(_run(*base, "--set", "oversubscription=inf")).startswith("Error: oversubscription:")


def test_output_paths_are_checked_before_the_simulation(tmp_path, monkeypatch):
    import flowsim.step.simulate as sim

    def boom(*a, **k):  # the simulation must not start
        raise AssertionError("simulated before checking the output path")

    monkeypatch.setattr(sim, "simulate", boom)
    base = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"]
    line = _one_line_error(_run(*base, "--trace", str(tmp_path / "nonexistent" / "t.json")))
    assert line == (f"Error: --trace: folder does not exist (flowsim creates no folders you did not name) "
                    f"(got {tmp_path / 'nonexistent' / 't.json'})")
    line = _one_line_error(_run(*base, "--chakra", str(tmp_path / "a" / "b")))
    assert line.startswith("Error: --chakra: parent folder does not exist")
    assert not (tmp_path / "nonexistent").exists() and not (tmp_path / "a").exists()


def test_truncated_gzip_is_a_one_line_error(tmp_path):
    from flowsim.io_text import read_text

    p = tmp_path / "trace.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": []}' * 100)[:40])
    with pytest.raises(ConfigError) as e:
        read_text(p, "trace")
    assert str(e.value).startswith("trace: not a complete gzip file")


# --- readers ------------------------------------------------------------------------------------------------

def test_runs_csv_with_a_bom_keeps_its_id_column(tmp_path, shared_data):
    from flowsim.validation.runs import read_runs

    src = (shared_data / "curated" / "training_runs_public.csv").read_bytes()
    p = tmp_path / "runs.csv"
    p.write_bytes(b"\xef\xbb\xbf" + src)
    frame, skipped = read_runs(p)
    plain, _ = read_runs(shared_data / "curated" / "training_runs_public.csv")
    assert list(frame["id"]) == list(plain["id"]) and len(frame) > 10


@pytest.mark.parametrize("args, message", [
    (["validate", "{f}"], "Error: runs: not UTF-8 text (byte 0x80 at offset 128); save it as UTF-8"),
    (["validate-nccl", "--cluster", "dgx-a100", "{f}"], "Error: log: not UTF-8 text (byte 0x80 at offset 128)"),
    (["simai", "aicb-log", "--cluster", "dgx-a100", "--tp", "1", "{f}"], "Error: aicb log: not UTF-8 text"),
    (["simai", "run", "--simai-analytical", "{f}"], "Error: workload: not UTF-8 text (byte 0x80 at offset 128)"),
    (["estimate", "--workload", "{f}", "--cluster", "dgx-h100"], "Error: workload: not UTF-8 text"),
    (["sweep", "{f}"], "Error: config: not UTF-8 text (byte 0x80 at offset 128)"),
])
def test_binary_files_to_every_reader_are_one_line_errors(tmp_path, args, message):
    f = tmp_path / "binary.bin"
    f.write_bytes(bytes(range(256)))
    line = _one_line_error(_run(*[a.format(f=f) for a in args]))
    assert line.startswith(message), line


def test_header_only_simai_workload_is_an_error(tmp_path, shared_data):
    header = (shared_data / "simai" / "workload_analytical.txt").read_text().splitlines()[:2]
    f = tmp_path / "header_only.txt"
    f.write_text("\n".join(header) + "\n")
    line = _one_line_error(_run("simai", "run", "--simai-analytical", str(f)))
    assert line == ("Error: header_only.txt line 3: a workload needs at least one layer line (this file holds only "
                    "its header) (got 1789 declared)")


def test_infinite_cells_in_an_nccl_tests_log_are_skipped_with_a_reason(tmp_path, shared_data):
    from flowsim.validation.nccl_tests import read_nccl_tests

    lines = (shared_data / "nccl-tests" / "a100_8gpu_allreduce_sxm4_80gb_g8.txt").read_text().splitlines()
    first = next(i for i, x in enumerate(lines) if x.split()[:1] == ["128"])
    toks = lines[first].split()
    lines[first] = "  ".join(["1e400"] + toks[1:])  # a size that overflows to inf
    toks = lines[first + 1].split()
    lines[first + 1] = "  ".join(toks[:5] + ["inf"] + toks[6:])  # an infinite time
    f = tmp_path / "log.txt"
    f.write_text("\n".join(lines) + "\n")
    log = read_nccl_tests(f)
    reasons = dict(log.skipped)
    assert reasons[first + 1] == "expected 'size count type ...'"
    assert reasons[first + 2] == "non-numeric time or bandwidth"
    assert np_isfinite_all(log)


def np_isfinite_all(log) -> bool:
    import numpy as np

    frame = log.rows if hasattr(log, "rows") else log.frame
    return bool(np.isfinite(frame.select_dtypes("number").to_numpy(dtype=float)).all())


# --- validate at scale --------------------------------------------------------------------------------------

def test_validate_jobs_gives_the_single_process_answer(shared_data):
    csv = str(shared_data / "curated" / "training_runs_public.csv")
    ids = "1,2,3,4,5,6,7,8,9,10,11,12"
    one = _run("validate", csv, "--only-ids", ids, "--json", "--no-progress")
    two = _run("validate", csv, "--only-ids", ids, "--json", "--no-progress", "--jobs", "2")
    assert one.exit_code == two.exit_code == 0, two.output
    a, b = json.loads(one.output), json.loads(two.output)
    assert a["rows"] == b["rows"] and a["skipped"] == b["skipped"] and len(a["rows"]) >= 5


def test_validate_skips_a_row_past_the_time_limit(shared_data):
    import time

    from flowsim.validation.runs import validate_runs

    def slow(cfg):
        time.sleep(30)  # interrupted by the limit

    report = validate_runs(shared_data / "curated" / "training_runs_public.csv", slow, only_ids=[1],
                           time_limit_s=0.2)
    assert report.rows == ()
    assert [s.reason for s in report.skipped] == ["simulation took longer than the 0.2 s limit"]


def test_validate_draws_progress_when_asked(shared_data):
    csv = str(shared_data / "curated" / "training_runs_public.csv")
    r = _run("validate", csv, "--only-ids", "1,2", "--progress")
    assert r.exit_code == 0 and "validate" in r.stderr and "run" in r.stderr


# --- numba cache --------------------------------------------------------------------------------------------

def test_numba_cache_goes_to_a_per_user_folder_unless_set(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    from flowsim import _numba_cache

    code = "import flowsim, numba, os; print(os.environ['NUMBA_CACHE_DIR'], numba.config.CACHE_DIR)"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "XDG_CACHE_HOME": str(tmp_path)},
                         capture_output=True, text=True, check=True).stdout.split()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    expected = _numba_cache.cache_dir()
    assert out == [str(expected)] * 2 and expected.parent.parent == tmp_path / "flowsim" / "numba"
    mine = str(tmp_path / "mine")
    out = subprocess.run([sys.executable, "-c", code], env={**env, "NUMBA_CACHE_DIR": mine},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [mine, mine]


def test_numba_cache_folder_follows_every_kernel_source(tmp_path):
    """numba checks a cached kernel against its own file only; the folder's key covers the files it compiles in."""
    import os

    from flowsim import _numba_cache

    pkg = tmp_path / "flowsim"
    for rel in ("_jit.py", "network/netsim.py", "network/maxmin_kernels.py", "step/sums.py", "cli/estimate.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("x = 1\n")
    first = _numba_cache.sources_digest(pkg)
    assert _numba_cache.sources_digest(pkg) == first
    (pkg / "cli" / "estimate.py").write_text("x = 22\n")  # no kernel there: same kernels, same folder
    assert _numba_cache.sources_digest(pkg) == first
    for rel in ("network/maxmin_kernels.py", "step/sums.py", "_jit.py"):
        before = _numba_cache.sources_digest(pkg)
        st = (pkg / rel).stat()
        os.utime(pkg / rel, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # edited, same size
        assert _numba_cache.sources_digest(pkg) != before, rel
    assert _numba_cache.cache_dir(pkg) != _numba_cache.cache_dir(tmp_path / "elsewhere" / "flowsim")


def test_every_numba_kernel_lies_in_the_cache_key_packages():
    """A kernel outside JIT_PACKAGES would escape the cache folder's key, and could run stale code."""
    import re
    from pathlib import Path

    from flowsim import _numba_cache

    root = Path(_numba_cache.__file__).resolve().parent
    covered = {root / "_jit.py"} | {p for sub in _numba_cache.JIT_PACKAGES for p in (root / sub).glob("*.py")}
    outside = [p.relative_to(root) for p in root.rglob("*.py")
               if p not in covered and re.search(r"^@(numba\.)?njit", p.read_text(encoding="utf-8"), re.M)]
    assert outside == []


def test_numba_cache_removes_only_stale_folders_of_earlier_sources(tmp_path):
    import os
    import time

    from flowsim import _numba_cache

    now = time.time()
    current, recent, stale = (tmp_path / name for name in ("current", "recent", "stale"))
    for folder in (current, recent, stale):
        (folder / "network_abc").mkdir(parents=True)
    old = now - 2 * _numba_cache.STALE_S
    for p in (stale / "network_abc", stale):
        os.utime(p, (old, old))
    os.utime(recent, (old, old))  # written one level down only a moment ago: a process still compiling into it
    _numba_cache._remove_stale(current)
    assert current.is_dir() and recent.is_dir() and not stale.exists()


def test_truncated_gzip_trace_is_a_one_line_error(tmp_path, shared_data):
    src = (shared_data / "traces" / "hta_a100_2rank_ddp_nccl.json.gz").read_bytes()
    f = tmp_path / "cut.json.gz"
    f.write_bytes(src[:len(src) // 50])
    line = _one_line_error(_run("validate-trace", str(f), "--cluster", "dgx-a100"))
    assert line.startswith("Error: trace: "), line


@pytest.mark.parametrize("args, message", [
    (["kernels", "predict", "--gpu", "h100-sxm", "--op", "memory", "--shape", "nan"],
     "Error: shape: memory takes bytes: each finite and <= 1,099,511,627,776 (got nan)"),
    (["kernels", "predict", "--gpu", "h100-sxm", "--op", "gemm", "--shape", "nan,1,1"],
     "Error: shape: gemm takes m,n,k[,batch] (numbers) (got nan,1,1)"),
    (["topo", "--gpus", "1000000000"],
     "Error: num_gpus: must be <= 1,048,576 (5x the largest announced cluster) (got 1000000000)"),
    (["topo", "--oversubscription", "inf"],
     "Error: oversubscription: must be a finite number in [1, 100] (1 = non-blocking) (got inf)"),
    (["topo", "--leaves-per-rail", "2"], "Error: leaves_per_rail: must not exceed the hosts of the job (every "
                                         "leaf needs a host) (got 2 leaves, 1 hosts)"),
])
def test_other_commands_refuse_the_issues_inputs(args, message):
    assert _one_line_error(_run(*args)) == message


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_unwritable_output_paths_fail_before_the_simulation():
    base = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"]
    assert _one_line_error(_run(*base, "--chakra", "/proc/nope")).startswith("Error: --chakra: cannot be written")
    assert _one_line_error(_run(*base, "--trace", "/proc/nope.json")).startswith("Error: --trace: cannot be")


def test_short_aicb_row_and_deep_json_trace_are_one_line_errors(tmp_path, shared_data):
    header = (shared_data / "simai" / "aicb_A100_example.csv").read_text().splitlines()[0]
    log = tmp_path / "aicb.csv"
    log.write_text(header + "\nC\n")
    line = _one_line_error(_run("simai", "aicb-log", "--cluster", "dgx-a100", "--tp", "1", str(log)))
    assert line == "Error: aicb.csv line 2: has fewer fields than the header (got C)"
    trace = tmp_path / "deep.json"
    trace.write_text("[" * 100000)
    line = _one_line_error(_run("validate-trace", str(trace), "--cluster", "dgx-a100"))
    assert line == "Error: trace: deep.json is not a Kineto trace (JSON nested too deeply)"
