"""The --json output contract: schema_version and flowsim_version in every JSON output, units in key names, and the
shipped JSON Schema of estimate --json checked against real output."""
import json
from importlib.resources import files

import jsonschema
import pytest
from click.testing import CliRunner

import flowsim
from flowsim.cli import main


def _schema():
    return json.loads(files("flowsim.cli").joinpath("estimate.schema.json").read_text())


@pytest.mark.parametrize("args", [
    ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "2"],
    ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--sp", "--ep", "8", "--pp", "2",
     "--recompute", "full", "--breakdown"],
])
def test_estimate_json_matches_the_shipped_schema(args):
    res = CliRunner().invoke(main, ["estimate", *args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    jsonschema.validate(out, _schema())
    assert out["schema_version"] == "1" and out["flowsim_version"] == flowsim.__version__
    assert out["memory_bytes_per_gpu"] == pytest.approx(out["memory_gb_per_gpu"] * 1e9)
    assert out["memory_capacity_bytes"] == pytest.approx(out["memory_capacity_gb"] * 1e9)


def test_schema_rejects_output_without_version():
    out = json.loads(CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                                               "--gpus", "8", "--json"]).stdout)
    del out["schema_version"]
    with pytest.raises(jsonschema.ValidationError, match="schema_version"):
        jsonschema.validate(out, _schema())


@pytest.mark.parametrize("argv", [["gpus", "--json"], ["topo", "--cluster", "dgx-h100", "--gpus", "16", "--json"]])
def test_every_json_output_carries_the_versions(argv):
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["schema_version"] == "1" and out["flowsim_version"] == flowsim.__version__
