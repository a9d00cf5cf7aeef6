"""`herald demo` writes its tables with delta-rs unless herald.yaml names an engine: with the jars make install
fetches, `auto` would pick delta-spark, whose commits take seconds each on a small machine."""

from __future__ import annotations

from pathlib import Path

from herald.config import load_config
from herald.demo import _with_quick_tables
from tests.support.config_files import SETTINGS, write_conf

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_the_demo_takes_delta_rs_where_the_engine_is_left_to_auto():
    config = load_config(CONF)
    assert config.settings.storage.engine == "auto"
    demo = _with_quick_tables(config)
    assert demo.settings.storage.engine == "deltalake"
    assert demo.settings.kafka == config.settings.kafka, "the Kafka source stays as configured"
    assert demo.storage_path == config.storage_path and demo.subscriptions == config.subscriptions


def test_an_engine_named_in_herald_yaml_is_kept(tmp_path):
    config = load_config(write_conf(tmp_path, SETTINGS + "  engine: spark\n"))
    assert _with_quick_tables(config).settings.storage.engine == "spark"
