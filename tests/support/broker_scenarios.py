"""What Kafka does to a running Herald, as scenarios the tests run against noida-db (Herald's Python source) and
against Apache Kafka itself (Spark's Kafka source): records deleted under a subscription's position, partitions
added, a topic deleted, the broker restarted. Each takes the broker (anything with `bootstrap_servers` and
`create_topics`), the SparkSession and the connector, and asserts what must hold with either.

Records deleted below a position: the caller creates the topics and says how offsets 0..9 of partition 0 go
(delete-records, or retention); records 0..9 carry timestamps an hour old so that retention can take them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from herald import readout
from herald.config import load_config
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from herald.storage.tables import METRICS, UNDELIVERED
from tests.support.herald_env import produce, wait_until, write_conf, write_subscription, write_topics_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber

HOUR_AGO_MS = int(time.time() * 1000) - 3_600_000


def received(sub: ScriptedSubscriber, path: str) -> list[int]:
    """The "i" of every request that reached `path`, sorted (duplicates kept)."""
    return sorted(r.json()["i"] for r in sub.requests if r.path == path)


def produce_to(bootstrap: str, topic: str, documents: list[tuple[int, dict]], timestamp_ms: int = 0) -> None:
    """Produce (partition, JSON document) pairs; `timestamp_ms` 0 lets the producer stamp them now."""
    producer = Producer({"bootstrap.servers": bootstrap})
    errors: list = []
    for partition, document in documents:
        producer.produce(topic, value=json.dumps(document).encode(), partition=partition, timestamp=timestamp_ms,
                         on_delivery=lambda error, _: errors.append(error) if error else None)
    assert producer.flush(30) == 0
    assert not errors, errors


def add_partitions(bootstrap: str, topic: str, total: int, timeout_s: float = 30.0) -> None:
    """Grow `topic` to `total` partitions and wait until the broker gives each a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, total)]).values():
        future.result()
    assert wait_until(lambda: sum(p.leader >= 0 for p in admin.list_topics(topic, timeout=5).topics[topic]
                                  .partitions.values()) == total, timeout_s), f"{topic} did not grow to {total}"


def delete_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result()
    assert wait_until(lambda: topic not in admin.list_topics(timeout=5).topics, timeout_s), f"{topic} still listed"


# -- records deleted below a subscription's position ---------------------------------------------------------------
def lost_range_is_recorded_and_delivery_goes_on(broker, spark, topic: str, other: str, tmp_path, caplog,
                                                connector: str, delete_first_ten: Callable[[], None]) -> None:
    """a and b get 0..4; b is suspended; 5..14 and the other topic's 0..2 are published and 0..9 deleted
    (`delete_first_ten`) before the next run reads them: a goes on from 10 and the loss 5..9 is logged and recorded
    for a, then for b when it catches up alone; the other topic is not held back."""
    store = DeltaRsStore(str(tmp_path / "storage"))
    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {
            topic: {"a": {"endpoint": f"{sub.url}/a"}, "b": {"endpoint": f"{sub.url}/b"}},
            other: {"c": {"endpoint": f"{sub.url}/c"}}}, settings={"kafka": {"connector": connector}})
        produce_to(broker.bootstrap_servers, topic, [(0, {"i": i}) for i in range(5)], HOUR_AGO_MS)
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert received(sub, "/a") == received(sub, "/b") == list(range(5))

        write_subscription(conf, topic, "b", {"endpoint": f"{sub.url}/b", "state": "SUSPENDED"}, prefixed=True)
        produce_to(broker.bootstrap_servers, topic, [(0, {"i": i}) for i in range(5, 10)], HOUR_AGO_MS)
        produce_to(broker.bootstrap_servers, topic, [(0, {"i": i}) for i in range(10, 15)])
        produce(broker.bootstrap_servers, other, [{"i": i} for i in range(3)])
        delete_first_ten()
        with caplog.at_level(logging.WARNING, logger="herald"):
            assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert received(sub, "/a") == [*range(5), *range(10, 15)], "the query went on from what Kafka holds"
        assert received(sub, "/c") == [0, 1, 2], "the other topic was not held back"
        assert any("5..9" in record.getMessage() and record.levelno == logging.WARNING for record in caplog.records)

        write_subscription(conf, topic, "b", {"endpoint": f"{sub.url}/b"}, prefixed=True)
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert received(sub, "/b") == [*range(5), *range(10, 15)], "b caught up alone from its position (5)"

    lost = {row["subscription"]: row for row in store.read(UNDELIVERED).to_pylist() if row["status"] == "LOST"}
    assert lost.keys() == {f"{topic}.a", f"{topic}.b"}, "recorded once for each subscription it concerned"
    for row in lost.values():
        assert (row["partition"], row["offset"], row["ended_by"]) == (0, 5, "retention")
        assert "offsets 5..9" in row["reason"] and row["message"] is None
    metrics = store.read(METRICS).to_pylist()
    assert {sid: sum(r["lost"] or 0 for r in metrics if r["subscription"] == sid)
            for sid in lost} == {sid: 5 for sid in lost}
    assert {r["kind"] for r in metrics if (r["lost"] or 0) > 0} == {"stream", "catchup"}
    config = load_config(conf)
    for name in ("a", "b"):
        positions = readout.offsets(config, config.subscription(f"{topic}.{name}"))
        assert [(p["partition"], p["offset"]) for p in positions] == [(0, 15)]


# -- partitions added while running --------------------------------------------------------------------------------
def new_partitions_are_delivered(broker, spark, topic: str, tmp_path, connector: str) -> None:
    """A topic of one partition grows to three while `herald run` runs: what the new partitions receive is
    delivered from their start to a, and to b, suspended meanwhile, once it is active again."""
    broker.create_topics({topic: 1})
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic, {
            "a": {"endpoint": f"{sub.url}/a"}, "b": {"endpoint": f"{sub.url}/b"}},
            settings={"streaming": {"maxOffsetsPerTrigger": 7}, "kafka": {"connector": connector}})
        produce_to(broker.bootstrap_servers, topic, [(0, {"i": i}) for i in range(3)])
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: received(sub, "/a") == [0, 1, 2] and received(sub, "/b") == [0, 1, 2], 60)
            write_subscription(conf, topic, "b", {"endpoint": f"{sub.url}/b", "state": "SUSPENDED"})
            pipeline = running.runner.pipelines[topic]
            assert wait_until(lambda: f"{topic}.b" not in pipeline.states, 30)

            add_partitions(broker.bootstrap_servers, topic, 3)
            # first in a new partition only (more than one micro-batch holds), then in all three at once
            produce_to(broker.bootstrap_servers, topic, [(2, {"i": i}) for i in range(100, 120)])
            assert wait_until(lambda: received(sub, "/a") == [0, 1, 2, *range(100, 120)], 60), received(sub, "/a")
            produce_to(broker.bootstrap_servers, topic, [(i % 3, {"i": i}) for i in range(200, 230)])
            expected = [0, 1, 2, *range(100, 120), *range(200, 230)]
            assert wait_until(lambda: received(sub, "/a") == expected, 60), received(sub, "/a")

            write_subscription(conf, topic, "b", {"endpoint": f"{sub.url}/b"})
            assert wait_until(lambda: received(sub, "/b") == expected, 90), \
                "activated again, it gets what the new partitions received while it was suspended"
            assert pipeline.states[f"{topic}.b"].positions.keys() == {0, 1, 2}


# -- a topic deleted while running ---------------------------------------------------------------------------------
def deleted_topic_is_retried_alone(broker, spark, tmp_path, connector: str) -> None:
    """A topic deleted while `herald run` runs: its query fails and is started again with backoff, failing with
    an error that names the missing topic, while the other topic is delivered; once the topic is back, it is read
    again, and its subscription goes on from the new topic's first offset (below its old position), the reset
    recorded."""
    stamp = time.time_ns() % 10**8
    doomed, other = f"fail.doomed_{stamp}", f"fail.other_{stamp}"
    broker.create_topics({doomed: 1, other: 1})
    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {
            doomed: {"s": {"endpoint": f"{sub.url}/doomed"}}, other: {"s": {"endpoint": f"{sub.url}/other"}}},
            settings={"kafka": {"connector": connector}})
        produce(broker.bootstrap_servers, doomed, [{"i": 0}])
        produce(broker.bootstrap_servers, other, [{"i": 0}])
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: received(sub, "/doomed") == [0] and received(sub, "/other") == [0], 60)
            delete_topic(broker.bootstrap_servers, doomed)
            supervisor = running.runner.supervisor
            assert wait_until(lambda: supervisor.failing(doomed) is not None
                              and supervisor.failing(doomed).failures >= 2, 90), \
                "the failed query is noticed and started again (and fails again: its topic is gone)"
            assert "do not exist" in supervisor.failing(doomed).error and doomed in supervisor.failing(doomed).error
            produce(broker.bootstrap_servers, other, [{"i": i} for i in range(1, 6)])
            assert wait_until(lambda: received(sub, "/other") == list(range(6)), 60), "the other topic goes on"
            broker.create_topics({doomed: 1})

            def read_again() -> bool:  # joined a read (`failing` is None also while a restart is being tried)
                pipeline = running.runner.pipelines.get(doomed)
                read = running.runner.topics.read
                return pipeline is not None and read is not None and read.pipelines.get(doomed) is pipeline \
                    and pipeline.frontier is not None
            assert wait_until(read_again, 90), "the topic created again is read again"
            # the new topic's offsets start at 0 again, below the subscription's position (1): it goes on from 0
            produce(broker.bootstrap_servers, doomed, [{"i": i} for i in range(10, 16)])
            assert wait_until(lambda: received(sub, "/doomed") == [0, 10, 11, 12, 13, 14, 15], 90), \
                received(sub, "/doomed")
        assert running.exit_code == 0, "every topic runs at the end"
    resets = [row for row in DeltaRsStore(str(tmp_path / "storage")).read(UNDELIVERED).to_pylist()
              if row["ended_by"] == "reset"]
    assert [(row["subscription"], row["status"], row["offset"]) for row in resets] == [(f"{doomed}.s", "RESET", 1)], \
        "the reset is recorded: it had lost nothing of the old topic"


# -- the broker restarted ------------------------------------------------------------------------------------------
def broker_restart_loses_nothing(broker, restart: Callable[[], None], spark, topic: str, tmp_path,
                                 connector: str) -> None:
    """The broker goes down while the job runs and comes back (`restart`): every message is delivered."""
    broker.create_topics({topic: 2})
    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {topic: {"s": {"endpoint": sub.url}}},
                                 settings={"kafka": {"connector": connector}})
        produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(10)])
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: len(sub.requests) >= 10, 60)
            restart()
            produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(10, 20)])
            assert wait_until(lambda: received(sub, "/") == list(range(20)), 120), received(sub, "/")
            assert wait_until(lambda: not running.runner.supervisor.not_running(), 60)
    assert sorted({r.json()["i"] for r in sub.requests}) == list(range(20))
