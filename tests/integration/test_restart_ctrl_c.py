"""Ctrl-C stops `herald run` cleanly (exit 0, no traceback) and the next run delivers the rest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.herald_env import produce, wait_until, write_conf
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def herald(*args: str) -> list[str]:
    return [sys.executable, "-m", "herald", *args]


def test_ctrl_c_stops_cleanly_and_the_rest_follows_on_restart(broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(30)])
    with ScriptedSubscriber(lambda request: Reply(delay_ms=50)) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name,
                          {"c": {"endpoint": sub.url, "subscriptionPolicy": {"inflightSize": 2}}},
                          settings={"streaming": {"maxOffsetsPerTrigger": 6}})
        job = subprocess.Popen(herald("run", "--conf", str(conf)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
        try:  # generous deadlines: a loaded machine is slow, not wrong
            assert wait_until(lambda: len(sub.requests) >= 5, timeout_s=300)
            job.send_signal(signal.SIGINT)  # to herald alone, as a terminal's Ctrl-C reaches it first
            output, _ = job.communicate(timeout=300)
        finally:
            if job.poll() is None:  # a failed test leaves no job behind (its JVM and Python workers too)
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        assert job.returncode == 0, output[-3000:]
        assert "Traceback" not in output
        restart = subprocess.run(herald("run", "--conf", str(conf), "--once"), capture_output=True, text=True,
                                 timeout=300)
        assert restart.returncode == 0, restart.stderr[-3000:]
    assert sub.delivered_ids() == set(range(30))
