"""The adaptive flow controller with the settings users get (no `rateControl` in herald.yaml), end to end."""

from __future__ import annotations

import json
import threading
import time

import pytest
from confluent_kafka import Producer

from herald.delivery.flow import FlowMode
from tests.support.herald_env import wait_until, write_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


class SteadyProducer:
    """Publishes {"i": n} to `topic` about `per_s` times a second on a thread, until stopped; `published` is n."""

    def __init__(self, bootstrap_servers: str, topic: str, per_s: int) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap_servers})
        self._topic, self._per_s = topic, per_s
        self._stop = threading.Event()
        self.published = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0 / self._per_s):
            self._producer.produce(self._topic, value=json.dumps({"i": self.published}).encode())
            self._producer.poll(0)
            self.published += 1

    def __enter__(self) -> SteadyProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush(30)


def requests_per_s(requests, path: str, start: float, end: float) -> float:
    return sum(1 for r in requests if r.path == path and start <= r.at < end) / (end - start)


def test_with_the_default_window_a_failing_subscriber_is_slowed_and_the_others_keep_receiving(
        broker, spark, topic_name, tmp_path):
    """herald.yaml has no `rateControl`: the controller's window is the default 30 s, longer than a round (here
    `batchDeadlineMs` is 3 s, and a failing subscription's rounds end sooner still). A subscriber answering 503 to
    everything is slowed all the same once a window has passed: the requests it sees fall to a small fraction of
    the first window's, and a healthy subscription of the same topic keeps receiving."""
    broker.create_topics({topic_name: 2})

    def respond(request) -> Reply:
        return Reply(503) if request.path == "/failing" else Reply()

    with ScriptedSubscriber(respond) as sub, SteadyProducer(broker.bootstrap_servers, topic_name, per_s=20) as flow:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "failing": {"endpoint": f"{sub.url}/failing"}, "healthy": {"endpoint": f"{sub.url}/healthy"}},
            settings={"rateControl": None, "streaming": {"batchDeadlineMs": 3000}})
        assert "rateControl" not in (conf / "herald.yaml").read_text()
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: any(r.path == "/failing" for r in sub.requests), 120)
            first_at = next(r.at for r in sub.requests if r.path == "/failing")

            def mode() -> FlowMode:
                lock, state = running.runner.topics.live_state(f"{topic_name}.failing")
                with lock:
                    return state.flow.mode

            assert wait_until(lambda: mode() is not FlowMode.NORMAL, 180), "still NORMAL after 180 s of 503s"
            slowed_at = time.monotonic()
            slowed_published = flow.published
            time.sleep(3 + 10)  # rounds planned before the slow-down end within batchDeadlineMs; then 10 s
            assert wait_until(lambda: any(r.path == "/healthy" and r.json()["i"] >= slowed_published
                                          for r in list(sub.requests)), 60)
    requests = list(sub.requests)
    first_window = requests_per_s(requests, "/failing", first_at, first_at + 10)
    slowed = requests_per_s(requests, "/failing", slowed_at + 3, slowed_at + 13)
    print(f"/failing: {first_window:.1f} requests/s in its first 10 s, {slowed:.1f}/s once slowed "
          f"({slowed_at - first_at:.1f} s after its first request)")
    assert first_window > 50, "the subscriber was not under load in the first window"
    assert slowed * 10 < first_window, (first_window, slowed)
    healthy = {r.json()["i"] for r in requests if r.path == "/healthy"}
    assert set(range(slowed_published)) <= healthy, "the healthy subscription missed messages"
