"""The config's pydantic front door and JSON Schema, and "did you mean" for unknown keys."""
import dataclasses

import jsonschema
import pytest

import flowsim
from flowsim.config import ClusterConfig, ModelConfig, TrainingConfig
from flowsim.config.model import ACTIVATIONS
from flowsim.config.schema import json_schema, validate
from flowsim.config.training import PRECISIONS, SCHEDULES
from flowsim.errors import ConfigError


def test_schema_has_every_dataclass_field_with_choices_and_bounds():
    defs = json_schema()["$defs"]
    for cls in (ModelConfig, ClusterConfig, TrainingConfig):
        props = defs[f"{cls.__name__}Section"]["properties"]
        assert {f.name for f in dataclasses.fields(cls)} <= set(props)
    t = defs["TrainingConfigSection"]["properties"]
    assert t["precision"]["anyOf"][0]["enum"] == list(PRECISIONS)
    assert t["pipeline_schedule"]["anyOf"][0]["enum"] == list(SCHEDULES)
    assert t["tensor_model_parallel_size"]["anyOf"][0]["minimum"] == 1
    assert "Parallel degrees" in t["tensor_model_parallel_size"]["description"]
    assert defs["ModelConfigSection"]["properties"]["activation"]["anyOf"][0]["enum"] == list(ACTIVATIONS)


def test_schema_validates_documents_like_the_loader():
    doc = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_gpus": 16},
           "training": {"tensor_model_parallel_size": 2, "precision": "fp8"}}
    jsonschema.validate(doc, json_schema())
    cfg = validate(doc)
    assert cfg == flowsim.build_config(doc)
    assert (cfg.training.tp, cfg.cluster.num_gpus, cfg.training.data_parallel_size) == (2, 16, 8)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**doc, "training": {"precision": "fp2"}}, json_schema())


@pytest.mark.parametrize("training, message", [
    ({"precision": "fp2"}, "training.precision: Input should be "
     + ", ".join(f"'{p}'" for p in PRECISIONS[:-1]) + f" or '{PRECISIONS[-1]}' (got fp2)"),
    ({"tensor_model_parallel_size": 0},
     "training.tensor_model_parallel_size: Input should be greater than or equal to 1 (got 0)"),
    ({"tensor_model_paralel_size": 2},
     "training.tensor_model_paralel_size: unknown key; did you mean tensor_model_parallel_size? (got 2)"),
])
def test_validate_errors_are_one_line_with_the_field(training, message):
    with pytest.raises(ConfigError) as e:
        validate({"model": "llama3-8b", "cluster": "dgx-h100", "training": training})
    assert str(e.value) == message


def test_cross_field_rules_are_the_loaders():
    doc = {"model": "llama3-8b", "cluster": "dgx-h100", "training": {"tensor_model_parallel_size": 3}}
    with pytest.raises(ConfigError) as ours:
        validate(doc)
    with pytest.raises(ConfigError) as loader:
        flowsim.build_config(doc)
    assert str(ours.value) == str(loader.value)


def test_loader_suggests_the_closest_key():
    with pytest.raises(ConfigError, match=r"^sequence_paralel: unknown key; did you mean sequence_parallel\?"):
        flowsim.build_config(model="llama3-8b", cluster="dgx-h100", sequence_paralel=True)
    with pytest.raises(ConfigError, match=r"^qwerty: unknown key \(see"):
        flowsim.build_config(model="llama3-8b", cluster="dgx-h100", qwerty=1)
