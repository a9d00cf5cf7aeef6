"""A stand-in for a Spark Connect session (no Spark Connect server here), and a conf directory a refused job
starts on: the tests of Herald's refusal (tests/unit/test_spark_connect.py, test_bundle.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.herald_env import write_conf


class ConnectSession:
    """Stands in for pyspark.sql.connect.session.SparkSession: only its class's module tells what it is, and it
    answers nothing (Herald must refuse it before asking it anything)."""

    __module__ = "pyspark.sql.connect.session"

    @property
    def conf(self):
        raise AssertionError("Herald asked the Spark Connect session for something before refusing it")


def conf_dir(tmp_path: Path) -> Path:
    """A valid conf directory whose Kafka and subscriber nobody listens for: a refused job asks neither."""
    return write_conf(tmp_path, "127.0.0.1:9", "demo.orders", {"billing": {"endpoint": "http://127.0.0.1:9/billing"}})
