"""Typed config: schema (dataclasses) and loading/validation (YAML + overrides)."""

from pipeline.config.load import ConfigError, load_config, to_dict, to_yaml
from pipeline.config.schema import Config

__all__ = ["Config", "ConfigError", "load_config", "to_dict", "to_yaml"]
