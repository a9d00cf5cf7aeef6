"""Kill the delivery job mid-batch and restart it: every message is delivered at least once. (The restart tests
are one file each, so that pytest's workers can run them side by side: test_restart_catch_up.py,
test_restart_ctrl_c.py; the spark-submit entry point is test_spark_submit_entry.py.)"""

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


def test_kill_mid_batch_and_restart_loses_nothing(broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 3})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(60)])
    with ScriptedSubscriber(lambda request: Reply(delay_ms=40)) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name,
                          {"k": {"endpoint": sub.url, "subscriptionPolicy": {"inflightSize": 3}}},
                          settings={"streaming": {"maxOffsetsPerTrigger": 12}})
        job = subprocess.Popen(herald("run", "--conf", str(conf)), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert wait_until(lambda: len(sub.requests) >= 20, timeout_s=180), job.stderr.read1().decode()
        finally:
            os.killpg(job.pid, signal.SIGKILL)  # the driver, its JVM and Python workers, at once
            job.wait()
        delivered_before_kill = len(sub.requests)
        assert delivered_before_kill < 60, "killed while work was left"

        restart = subprocess.run(herald("run", "--conf", str(conf), "--once"), capture_output=True, text=True,
                                 timeout=300)
        assert restart.returncode == 0, restart.stderr[-3000:]
    assert sub.delivered_ids() == set(range(60))
