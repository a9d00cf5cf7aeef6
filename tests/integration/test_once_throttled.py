"""`herald run --once` beside a subscriber that keeps failing: flow control slows it to one probe a minute
(HEARTBEAT), and the run must not wait for its whole backlog at that pace (163 of 10,000 after an hour, before):
it ends, exit 0, and says how many messages the held subscription has left; nothing is lost, the next run goes
on from its positions. A healthy subscription of the same topic is delivered in full. Real broker, Spark, HTTP
and Delta tables."""

from __future__ import annotations

import re
import threading

import pytest

from herald.config import load_config
from herald.engine.round.state import stored_positions
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def test_once_ends_with_a_throttled_subscription_held_and_says_what_it_has_left(broker, spark, topic_name, tmp_path,
                                                                                 capsys):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(2000)])
    with ScriptedSubscriber(lambda request: Reply(500)) as failing, ScriptedSubscriber() as healthy:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "failing": {"endpoint": failing.url}, "healthy": {"endpoint": healthy.url}},
            settings={"rateControl": {"adjustIntervalMs": 500, "heartbeatIntervalMs": 60_000}})
        runner = Runner(load_config(conf), spark=spark)
        exit_codes: list[int] = []
        run = threading.Thread(target=lambda: exit_codes.append(runner.run(once=True)), daemon=True)
        run.start()
        run.join(240)
        if run.is_alive():
            runner.stop()
            run.join(120)
            pytest.fail("--once was still running after 240 s: it waits for a subscriber probed once a minute")
    assert exit_codes == [0]
    assert len({r.json()["i"] for r in healthy.requests}) == 2000, "the healthy subscription is delivered in full"
    said = capsys.readouterr().out
    held = re.search(rf"{re.escape(topic_name)}\.failing is held at \{{0: (\d+)\}} with (\d+) message\(s\) left, by "
                     r"flow control: .* \(HEARTBEAT\)", said)
    assert held, said
    position, left = int(held.group(1)), int(held.group(2))
    assert position + left == 2000 and left > 0
    stored = stored_positions(DeltaRsStore(str(tmp_path / "storage")))[(f"{topic_name}.failing", topic_name)]
    assert stored == {0: position}, "the next run goes on from where it was held"
