"""Configuration: model, cluster and training settings, presets and validation."""
from flowsim.config.cluster import ClusterConfig
from flowsim.config.loader import ALIASES, build_config, list_presets, load_preset, read_config_file
from flowsim.config.model import ModelConfig
from flowsim.config.sim import SimConfig
from flowsim.config.training import TrainingConfig

__all__ = ["ALIASES", "ClusterConfig", "ModelConfig", "SimConfig", "TrainingConfig", "build_config",
           "list_presets", "load_preset", "read_config_file"]
