"""Conf directories written from YAML text, for the configuration's unit tests (tests/support/herald_env.py
writes whole running setups instead)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from herald.config import ConfigError, load_config

SETTINGS = """
kafka:
  bootstrapServers: 127.0.0.1:9092
storage:
  path: ../state
"""
TOPIC = """
name: shop.orders
contentType: JSON
"""
SUBSCRIPTION = """
topicName: shop.orders
name: billing
endpoint: http://127.0.0.1:8080/orders
description: orders for billing
owner: {source: Plaintext, id: Billing}
"""


def write_conf(root: Path, settings: str = SETTINGS, topics: dict | None = None,
               subscriptions: dict | None = None) -> Path:
    conf = root / "conf"
    (conf / "topics").mkdir(parents=True)
    (conf / "subscriptions").mkdir()
    (conf / "herald.yaml").write_text(textwrap.dedent(settings))
    for name, text in (topics if topics is not None else {"orders": TOPIC}).items():
        (conf / "topics" / f"{name}.yaml").write_text(textwrap.dedent(text))
    for name, text in (subscriptions if subscriptions is not None else {"billing": SUBSCRIPTION}).items():
        (conf / "subscriptions" / f"{name}.yaml").write_text(textwrap.dedent(text))
    return conf


def problems_of(conf: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(conf)
    return [str(problem) for problem in caught.value.problems]
