"""Configuration: herald.yaml, topics/*.yaml and subscriptions/*.yaml (Hermes' field names)."""

from herald.config.loader import ConfigError, HeraldConfig, Problem, filter_rules, load_config
from herald.config.model import HeraldSettings, Subscription, Topic

__all__ = ["ConfigError", "HeraldConfig", "HeraldSettings", "Problem", "Subscription", "Topic", "filter_rules",
           "load_config"]
