"""kill -9 while a subscription added behind the topic's query catches up, with a message being retried (perhaps
parked), and restart: it gets everything, the other subscription nothing twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.herald_env import produce, wait_until, write_conf, write_subscription
from tests.support.subscriber import Reply, ScriptedSubscriber, scripted_reply

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def herald(*args: str) -> list[str]:
    return [sys.executable, "-m", "herald", *args]


def test_kill_during_catch_up_with_parked_retries_and_restart_loses_nothing(broker, topic_name, tmp_path):
    """A subscription added with `earliest` behind the topic's query catches up on its own; kill -9 while it
    does (one message being retried, perhaps parked), restart: it gets everything, the other one nothing twice."""
    broker.create_topics({topic_name: 2})
    documents = [{"i": i, **({"replies": [[500], [500], [500], [200]]} if i == 5 else {})} for i in range(60)]
    produce(broker.bootstrap_servers, topic_name, documents)
    def respond(request):  # message 5 fails three times at each endpoint; the late subscriber is slow
        reply = scripted_reply(request)
        return Reply(delay_ms=30) if request.path == "/late" and reply.status == 200 else reply

    with ScriptedSubscriber(respond) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"first": {"endpoint": sub.url + "/first"}},
                          settings={"streaming": {"maxOffsetsPerTrigger": 12, "parkAfterMs": 300}})
        first = subprocess.run(herald("run", "--conf", str(conf), "--once"), capture_output=True, text=True,
                               timeout=300)
        assert first.returncode == 0, first.stderr[-3000:]
        write_subscription(conf, topic_name, "late", {"endpoint": sub.url + "/late", "subscriptionPolicy": {
            "inflightSize": 2, "messageBackoff": 400}})

        def late() -> list:
            return [r for r in list(sub.requests) if r.path == "/late"]

        job = subprocess.Popen(herald("run", "--conf", str(conf)), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert wait_until(lambda: len(late()) >= 15, timeout_s=180), job.stderr.read1().decode()
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        assert len({r.json()["i"] for r in late()}) < 60, "killed while catching up"
        restart = subprocess.run(herald("run", "--conf", str(conf), "--once"), capture_output=True, text=True,
                                 timeout=300)
        assert restart.returncode == 0, restart.stderr[-3000:]
        # A run ends with message 5 parked when its next retry is not due yet, and each run tries it again once
        # due: more runs until none is parked. How many depends on the machine's speed, not on Herald; message 5
        # needs at most four attempts at /late, so six more runs are plenty.
        runs = 1
        while "parked for retry" in restart.stdout:
            assert runs < 7, f"still parked after {runs} runs: {restart.stdout[-2000:]}"
            time.sleep(1.5)
            restart = subprocess.run(herald("run", "--conf", str(conf), "--once"), capture_output=True, text=True,
                                     timeout=300)
            assert restart.returncode == 0, restart.stderr[-3000:]
            runs += 1
    delivered = {}
    for request, ok in zip(sub.requests, sub._ok):
        if ok:
            delivered.setdefault(request.path, []).append(request.json()["i"])
    assert set(delivered["/late"]) == set(range(60))
    assert sorted(delivered["/first"]) == list(range(60)), "the first subscription got nothing twice"
