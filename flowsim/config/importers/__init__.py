"""Configs from other frameworks' files: Megatron-LM arguments, NeMo 2 / Megatron-Bridge recipes, HF config.json.

Each importer returns an :class:`Imported` whose ``config`` is a source for :func:`flowsim.build_config`:

>>> from flowsim.config.importers import from_hf_config
>>> imp = from_hf_config("config.json")                                  # doctest: +SKIP
>>> cfg = flowsim.build_config(imp.config, cluster="dgx-h100", gpus=8, seq=8192)  # doctest: +SKIP
"""
from flowsim.config.importers.common import ARCHITECTURE_KEYS, Imported
from flowsim.config.importers.hf import from_hf_config
from flowsim.config.importers.megatron import from_megatron_args
from flowsim.config.importers.nemo import from_nemo

__all__ = ["ARCHITECTURE_KEYS", "Imported", "from_hf_config", "from_megatron_args", "from_nemo"]
