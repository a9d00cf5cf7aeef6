"""A Spark Connect session (Databricks' standard access mode, serverless) is refused at start with one clear line
and exit code 2, never a stack trace: Herald's delivery needs the driver's JVM (herald.session)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from herald.cli import main
from herald.session import (
    CLASSIC_SESSION_NEEDED,
    ClassicSessionRequired,
    is_spark_connect,
    require_classic_session,
    spark_connect_request,
)
from tests.support.spark_connect import ConnectSession, conf_dir


class ClassicSession:
    __module__ = "pyspark.sql.session"


def test_a_spark_connect_session_is_told_from_a_classic_one():
    assert is_spark_connect(ConnectSession())
    assert not is_spark_connect(ClassicSession())
    require_classic_session(ClassicSession())
    with pytest.raises(ClassicSessionRequired, match="a dedicated \\(single-user\\) access cluster"):
        require_classic_session(ConnectSession())


@pytest.mark.parametrize("variable, value", [("SPARK_REMOTE", "sc://workspace:443"),
                                             ("SPARK_CONNECT_MODE_ENABLED", "1"), ("SPARK_API_MODE", "connect")])
def test_what_would_build_a_spark_connect_session_is_named(monkeypatch, variable, value):
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_API_MODE"):
        monkeypatch.delenv(name, raising=False)
    assert spark_connect_request({}) is None
    assert spark_connect_request({"spark.api.mode": "classic"}) is None
    assert spark_connect_request({"spark.remote": "sc://host"}) == "spark.conf in herald.yaml names spark.remote"
    assert spark_connect_request({"spark.api.mode": "connect"}) == "spark.api.mode is connect"
    monkeypatch.setenv(variable, value)
    assert spark_connect_request({}) is not None


def test_herald_run_on_a_spark_connect_session_exits_2_naming_what_it_needs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("herald.engine.runner.get_or_create_session", lambda *args, **kwargs: ConnectSession())
    assert main(["run", "--conf", str(conf_dir(tmp_path)), "--once"]) == 2
    err = capsys.readouterr().err
    assert f"not started: {CLASSIC_SESSION_NEEDED}" in err
    assert "pyspark.sql.connect.session.ConnectSession" in err
    assert not (tmp_path / "storage").exists(), "nothing was written for a job that did not start"


def test_herald_run_with_spark_remote_set_exits_2_without_a_stack_trace(tmp_path):
    """SPARK_REMOTE makes pyspark build a Spark Connect session (what Databricks Connect and serverless set up):
    Herald refuses before building it, so no Spark Connect client is started (here it could not even import)."""
    env = {**os.environ, "SPARK_REMOTE": "sc://127.0.0.1:9"}
    result = subprocess.run([sys.executable, "-m", "herald", "run", "--conf", str(conf_dir(tmp_path)), "--once"],
                            capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"not started: {CLASSIC_SESSION_NEEDED} (SPARK_REMOTE is set)" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
