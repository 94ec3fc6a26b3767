"""GPU datasheets: every built-in key loads in SI units, user spec files work, bad files are rejected."""
import json
import math

import pytest
import yaml
from click.testing import CliRunner

from flowsim.errors import ConfigError
from flowsim.gpu_specs import get_gpu, gpu_keys, is_builtin, list_gpus, load_spec_file
from flowsim.gpu_specs.catalog import DATA_DIR

# The keys of the runs schema v1 (shared/data/curated/README.md, "GPU keys") plus h100-sxm-hbm2e.
RUNS_SCHEMA_KEYS = (
    "v100-sxm2-32gb a100-sxm4-40gb a100-sxm4-80gb a100-pcie-80gb h100-sxm h100-sxm-hbm2e h100-pcie h800 h20 "
    "h200 b200 b300 gb200 gb300 mi300x mi325x mi355x l40s rtx4090"
).split()


def test_every_runs_schema_key_loads():
    assert sorted(RUNS_SCHEMA_KEYS) == gpu_keys()
    for key in RUNS_SCHEMA_KEYS:
        gpu = get_gpu(key)
        assert gpu.key == key
        assert gpu.sources and all(gpu.sources)
        assert gpu.hbm_Bps > 0 and gpu.hbm_bytes > 0 and gpu.sm_count > 0
        assert "bf16" in gpu.peak_flop_per_s or key == "v100-sxm2-32gb"  # Volta has no bf16
    assert [g.key for g in list_gpus()] == gpu_keys()


def test_units_are_converted_to_si_once():
    h100 = get_gpu("H100-SXM")  # keys are case-insensitive
    assert h100.peak("bf16") == pytest.approx(989.4e12)  # 989.4 TFLOPS
    assert h100.peak("fp8") == pytest.approx(1978.9e12)
    assert h100.hbm_bytes == pytest.approx(80e9)  # 80 GB, decimal
    assert h100.hbm_Bps == pytest.approx(3.35e12)  # 3.35 TB/s
    assert h100.scaleup_Bps == pytest.approx(450e9)  # 450 GB/s per direction
    assert h100.clock_hz == pytest.approx(1.83e9)
    assert h100.l2_bytes == 50 * 2**20  # cache "MB" are MiB
    assert math.isnan(get_gpu("h20").clock_hz)  # not published


def test_grand_teton_h100_differs_from_standard_h100_in_memory_and_power():
    std, meta = get_gpu("h100-sxm"), get_gpu("h100-sxm-hbm2e")
    assert meta.peak_flop_per_s == std.peak_flop_per_s
    assert (meta.hbm_bytes, meta.hbm_Bps, meta.tdp_w) == (96e9, 2.4e12, 500.0)


def test_missing_dtype_peak_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^precision: a100-sxm4-80gb has no fp8 peak in its spec \(got fp8\)$"):
        get_gpu("a100-sxm4-80gb").peak("fp8")


def test_unknown_key_lists_known_keys():
    with pytest.raises(ConfigError, match=r"^gpu: unknown GPU; known: a100-pcie-80gb, .*\(got x999\)$"):
        get_gpu("x999")


def _user_spec(tmp_path, **changes):
    raw = yaml.safe_load((DATA_DIR / "h100-sxm.yaml").read_text())
    raw.update(key="x100", name="Hypothetical X100", peak_TFLOPS={"bf16": 2000, "fp8": 4000}, hbm_TBps=6)
    raw.update(changes)
    for k in [k for k, v in changes.items() if v is None and k not in ("clock_MHz", "l2_MiB")]:
        del raw[k]
    path = tmp_path / "x100.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_user_spec_file(tmp_path):
    path = _user_spec(tmp_path)
    gpu = get_gpu(str(path))
    assert gpu.key == "x100" and gpu.peak("bf16") == 2e15 and gpu.hbm_Bps == 6e12
    assert load_spec_file(path) == gpu
    assert not is_builtin(gpu) and is_builtin(get_gpu("h100-sxm"))


def test_spec_without_sources_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match=r"^x100.yaml: sources: required field is missing$"):
        load_spec_file(_user_spec(tmp_path, sources=None))
    with pytest.raises(ConfigError, match=r"^x100.yaml: sources: must be a non-empty list of citations \(got \[\]\)$"):
        load_spec_file(_user_spec(tmp_path, sources=[]))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"hbm_TBps": None}, r"x100.yaml: hbm_TBps: required field is missing"),
        ({"hbm_TBps": -1}, r"x100.yaml: hbm_TBps: must be a number > 0 \(got -1\)"),
        ({"sm_count": 1.5}, r"x100.yaml: sm_count: must be a non-negative integer \(got 1.5\)"),
        ({"arch": "kepler"}, r"x100.yaml: arch: must be one of volta, .* \(got kepler\)"),
        ({"peak_TFLOPS": {"int4": 1}}, r"x100.yaml: peak_TFLOPS.int4: unknown dtype"),
        ({"hbm_tbps": 1}, r"x100.yaml: hbm_tbps: unknown field"),
    ],
)
def test_bad_spec_fields_are_named(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        load_spec_file(_user_spec(tmp_path, **changes))


def test_cli_table_and_json():
    from flowsim.cli import main

    res = CliRunner().invoke(main, ["gpus"])
    assert res.exit_code == 0, res.output
    header, rule, *rows = res.output.splitlines()
    assert "bf16 TFLOP/s" in header and "HBM TB/s" in header and "scale-up GB/s/dir" in header
    assert len(rows) == len(RUNS_SCHEMA_KEYS)
    h100 = next(r for r in rows if r.startswith("h100-sxm "))
    assert "989.4" in h100 and "1978.9" in h100 and "3.350" in h100 and "nvswitch" in h100

    res = CliRunner().invoke(main, ["gpus", "mi300x", "--json"])
    assert res.exit_code == 0
    (rec,) = json.loads(res.output)["gpus"]
    assert rec["peak_flop_per_s"]["bf16"] == pytest.approx(1307.4e12) and rec["sources"]


def test_cli_shows_a_user_spec_file(tmp_path):
    from flowsim.cli import main

    res = CliRunner().invoke(main, ["gpus", str(_user_spec(tmp_path))])
    assert res.exit_code == 0
    assert res.output.splitlines()[2].split()[:2] == ["x100", "Hypothetical"]


def test_cli_unknown_gpu_is_one_line_exit_2():
    from flowsim.cli import main

    res = CliRunner().invoke(main, ["gpus", "x999"])
    assert res.exit_code == 2
    assert res.output.startswith("Error: gpu: unknown GPU; known: ") and res.output.count("\n") == 1


def test_libyaml_reads_the_same_records_as_pyyamls_safe_load():
    from flowsim.gpu_specs.loader import spec_from_dict

    for key in gpu_keys():
        path = DATA_DIR / f"{key}.yaml"
        assert repr(load_spec_file(path)) == repr(spec_from_dict(yaml.safe_load(path.read_text()), origin=path.name))
