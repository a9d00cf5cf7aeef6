"""Configuration: herald.yaml, topics/*.yaml and subscriptions/*.yaml (Hermes' field names)."""

from herald.config.loader import (
    ConfigError,
    HeraldConfig,
    LoadResult,
    Problem,
    conf_fingerprint,
    filter_rules,
    load_config,
    load_config_lenient,
)
from herald.config.model import Subscription, Topic
from herald.config.settings import HeraldSettings

__all__ = ["ConfigError", "HeraldConfig", "HeraldSettings", "LoadResult", "Problem", "Subscription", "Topic",
           "conf_fingerprint", "filter_rules", "load_config", "load_config_lenient"]
