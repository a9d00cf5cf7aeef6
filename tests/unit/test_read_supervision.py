"""How `Topics` keeps the job's shared read going (docs/design.md §2): which topic a failure is blamed on, when the
read starts again, and that no failure record outlives the read it was about. The state machine of
`herald.engine.triggers.topics` on a fake clock: the reads (`SharedRead`), Kafka's metadata and the checkpoints are
stand-ins that say what the real ones would; Spark and Kafka themselves run in tests/integration
(test_topic_failures.py, test_many_topics.py).
"""

from __future__ import annotations

import types

import pytest

import herald.engine.triggers.topics as topics_module
from herald.engine.triggers.supervision import ONCE_RESTARTS, QuerySupervisor
from herald.source.kafka_offsets import UnknownTopicError
from tests.support.clock import FakeClock


class Kafka:
    """The Kafka topics that exist now."""

    def __init__(self, *names: str) -> None:
        self.topics = set(names)

    def watermarks(self, client_config, names, timeout_s=None):
        missing = [name for name in names if name not in self.topics]
        if missing:
            raise UnknownTopicError(missing)
        return {name: {0: (0, 10)} for name in names}


class FakeRead:
    """A read as `Topics` sees it: it starts (or raises as the real one does for a missing topic), fails, is
    healthy, and stops."""

    started: list[FakeRead] = []

    def __init__(self, context, pipelines, resume):
        self.pipelines = dict(pipelines)
        self.kafka_topics = sorted(pipelines)
        self.resume = resume
        self.checkpoint = "checkpoints/read/" + ",".join(self.kafka_topics)
        self.gone: dict[str, str] = {}
        self.failure_handled = False
        self.start_error = None
        self.failed = None
        self.healthy = False
        self.closing = False
        self.stopped = False
        self.query = None
        self.kafka = context.kafka

    def start(self):
        self.kafka.watermarks({}, self.kafka_topics)
        self.query = object()
        FakeRead.started.append(self)

    def failure(self):
        return self.start_error or self.failed

    def wait_idle(self, timeout_s):
        return True

    def stop(self):
        self.stopped = True


class FakePipeline:
    def __init__(self, name: str) -> None:
        self.kafka_topic = name
        self.states: dict = {}
        self.catchup = types.SimpleNamespace(stop=lambda: None)
        self.failed_rounds = 0
        self.round_error = None
        self.stopped = False

    def frontier_copy(self) -> dict[int, int]:
        return {}

    def stop(self) -> None:
        self.stopped = True


class SimulatedTopics(topics_module.Topics):
    """`start_topic` asks the fake Kafka, as the real one asks for the topic's partitions."""

    def start_topic(self, topic_name, subscriptions):
        if topic_name not in self.context.kafka.topics:
            self._unstarted[topic_name] = subscriptions
            self.topic_failed(topic_name, UnknownTopicError([topic_name]))
            return None
        self._unstarted.pop(topic_name, None)
        pipeline = FakePipeline(topic_name)
        self.pipelines[topic_name] = pipeline
        return pipeline


@pytest.fixture
def world(monkeypatch):
    kafka = Kafka()
    FakeRead.started = []
    monkeypatch.setattr(topics_module, "SharedRead", FakeRead)
    monkeypatch.setattr(topics_module, "partition_watermarks", kafka.watermarks)
    monkeypatch.setattr(topics_module, "checkpoints",
                        types.SimpleNamespace(children=lambda spark, root: [], remove=lambda spark, path: None))

    def make(*names: str, once: bool = False):
        kafka.topics = set(names)
        clock = FakeClock()
        settings = types.SimpleNamespace(streaming=types.SimpleNamespace(batch_deadline_s=1.0))
        context = types.SimpleNamespace(client_config={}, spark=None, once=once, kafka=kafka,
                                        config=types.SimpleNamespace(storage_path="storage", settings=settings))
        supervisor = QuerySupervisor(once, clock=clock)
        book = types.SimpleNamespace(rest=lambda state: None)
        topics = SimulatedTopics(context, None, None, book, supervisor, None)
        with topics.lock:
            for name in names:
                topics.start_topic(name, [])
            topics.regroup()
        return topics, clock, supervisor

    make.kafka = kafka
    return make


def run(topics, clock, seconds: float) -> None:
    for _ in range(int(seconds / 0.2)):
        topics.supervise()
        clock.now += 0.2


def test_one_read_for_every_topic_and_the_same_read_while_the_set_is_the_same(world):
    topics, clock, _ = world("a", "b", "c")
    assert topics.read.kafka_topics == ["a", "b", "c"] and topics.read.resume, "the job's first read resumes"
    run(topics, clock, 5)
    assert len(FakeRead.started) == 1


def test_a_read_that_cannot_start_for_a_missing_topic_leaves_it_out_and_starts_the_others_at_once(world):
    """A topic deleted before the read (re)starts: the read's start fails; that topic, and only it, waits."""
    topics, clock, supervisor = world("a", "b", "c")
    world.kafka.topics.discard("b")
    with topics.lock:
        topics.regroup(again=True)  # as after a failure
    assert topics.read.failure() is not None
    run(topics, clock, 0.4)
    assert topics.read.kafka_topics == ["a", "c"] and topics.read.failure() is None
    assert "do not exist" in supervisor.failing("b").error and "b" in topics.unstarted()
    assert supervisor.failing("a") is None and supervisor.failing("c") is None
    world.kafka.topics.add("b")
    run(topics, clock, 5)
    assert topics.read.kafka_topics == ["a", "b", "c"] and not topics.unstarted()
    assert supervisor.not_running() == {}


def test_a_read_failing_for_no_topic_starts_again_from_its_checkpoint_after_the_backoff(world):
    topics, clock, supervisor = world("a", "b")
    first = topics.read
    first.failed = "StreamingQueryException: Python worker failed to connect back"
    topics.supervise()
    assert set(supervisor.not_running()) == {"a", "b"}, "each topic of the read is failing"
    assert topics.read is first, "not before the backoff (1 s)"
    run(topics, clock, 1.4)
    assert topics.read is not first and topics.read.resume, "the same set: from its checkpoint"
    assert topics.read.kafka_topics == ["a", "b"] and first.stopped
    assert supervisor.not_running() == {}


def test_a_failure_record_never_outlives_the_read_it_was_about(world):
    """The read fails for no topic of its own; during the backoff a topic joins, so another read starts. That
    read runs: nothing is reported failing any more, and when it fails in turn it is dealt with again."""
    topics, clock, supervisor = world("a", "b", "d")
    world.kafka.topics.discard("d")
    with topics.lock:
        topics._leave("d", "Kafka topic(s) do not exist: d")
    run(topics, clock, 0.4)
    topics.read.failed = "StreamingQueryException: Python worker failed to connect back"
    topics.supervise()  # a and b back off until 1001.4; d is tried again at 1001.0
    world.kafka.topics.add("d")
    run(topics, clock, 0.8)
    assert clock.now < 1001.4 + 0.2
    assert topics.read.kafka_topics == ["a", "b", "d"] and topics.read.failure() is None
    assert supervisor.not_running() == {}, "the new read runs: no topic is failing"
    failed_again = topics.read
    failed_again.failed = "StreamingQueryException: lost the broker"
    run(topics, clock, 3)
    assert topics.read is not failed_again and topics.read.failure() is None, "started again after its backoff"


def test_an_error_that_names_some_of_the_reads_topics_blames_those(world):
    """Kafka knows every topic, but the read's error names one (no permission to read it, say): it leaves."""
    topics, clock, supervisor = world("orders", "orders.eu", "payments")
    topics.read.failed = ("StreamingQueryException: org.apache.kafka.common.errors.TopicAuthorizationException: "
                          "Not authorized to access topics: [orders.eu]")
    run(topics, clock, 0.4)
    assert topics.read.kafka_topics == ["orders", "payments"]
    assert "orders.eu" in topics.unstarted() and "Not authorized" in supervisor.failing("orders.eu").error


def test_a_topic_gone_from_the_reads_offsets_leaves_and_the_others_go_on(world):
    topics, clock, supervisor = world("a", "b")
    world.kafka.topics.discard("b")
    topics.read.gone["b"] = "Kafka topic(s) do not exist: b (no longer in the source's offsets)"
    run(topics, clock, 0.4)
    assert topics.read.kafka_topics == ["a"] and "b" in topics.unstarted()
    assert supervisor.failing("a") is None and supervisor.failing("b").failures >= 1


def test_once_gives_up_a_topic_whose_rounds_keep_failing_and_reads_the_others(world):
    topics, clock, supervisor = world("a", "b", once=True)
    topics.pipelines["b"].failed_rounds = ONCE_RESTARTS
    topics.pipelines["b"].round_error = "ArrowException: the decoder failed"
    run(topics, clock, 0.4)
    assert supervisor.given_up() == {}, "not before more than ONCE_RESTARTS rounds in a row failed"
    topics.pipelines["b"].failed_rounds += 1
    run(topics, clock, 0.4)
    assert supervisor.given_up() == {"b": "ArrowException: the decoder failed"}
    assert topics.read.kafka_topics == ["a"]


def test_a_regroup_waiting_for_a_stuck_micro_batch_lets_the_shutdown_take_the_lock(world):
    """A micro-batch held by storage that is down never ends; a regroup waits for it under the topics' lock. The
    shutdown (a first Ctrl-C) sets `stopping` and must then get the lock: the regroup gives up waiting and
    leaves the read to the shutdown, starting no new one."""
    import threading

    topics, clock, _ = world("a", "b")
    stuck = topics.read
    stuck.wait_idle = lambda timeout_s: threading.Event().wait(min(timeout_s, 0.05)) and False
    del topics.pipelines["b"]  # the set changes: the read is to be replaced
    regrouping = threading.Thread(target=lambda: topics.lock.acquire() and (topics.regroup(), topics.lock.release()),
                                  daemon=True)
    regrouping.start()
    regrouping.join(0.5)
    assert regrouping.is_alive(), "it waits for the micro-batch in progress"
    topics.stopping.set()
    assert topics.lock.acquire(timeout=10), "the shutdown gets the lock"
    try:
        assert topics.read is stuck and not stuck.stopped, "the shutdown stops it, within its grace"
        assert len(FakeRead.started) == 1, "no new read beside the micro-batch still running"
    finally:
        topics.lock.release()
    regrouping.join(5)


def test_a_topic_whose_id_changed_while_running_is_checked_once_per_poll(world, monkeypatch):
    """Deleted and created again between two micro-batches, its new log past where the read was: only Kafka's topic
    id says so. `check_topic_ids` asks every configPollMs (without the topics' lock) and hands the new log to the
    pipeline whose id changed, the others untouched."""
    topics, clock, _ = world("a", "b")
    topics.context.config.settings.streaming.config_poll_s = 2.0
    checked = []
    for name, pipeline in topics.pipelines.items():
        pipeline.topic_id = f"id-{name}"
        pipeline.check_log = lambda marks, topic_id, name=name, **_: checked.append((name, marks, topic_id))
    ids = {"a": "id-a", "b": "id-b-new"}
    asked = []
    monkeypatch.setattr(topics_module, "topic_ids", lambda config, names: asked.append(sorted(names)) or
                        {name: ids[name] for name in names})
    topics.check_topic_ids()
    assert checked == [("b", {0: (0, 10)}, "id-b-new")]
    topics.check_topic_ids()
    assert len(asked) == 1, "once per configPollMs"


def test_a_topic_whose_id_was_not_known_at_start_is_checked_when_kafka_gives_it(world, monkeypatch):
    """Kafka gave no id for `b` when the job started (a lookup that failed): the periodic check still asks, and
    hands the id to the pipeline, whose subscriptions' rows may name the id their positions are in (a topic
    created again meanwhile is found then). A topic Kafka gives no id for is left alone."""
    topics, clock, _ = world("a", "b")
    topics.context.config.settings.streaming.config_poll_s = 2.0
    checked = []
    for name, pipeline in topics.pipelines.items():
        pipeline.topic_id = None
        pipeline.check_log = lambda marks, topic_id, name=name, **_: checked.append((name, topic_id))
    monkeypatch.setattr(topics_module, "topic_ids", lambda config, names: {"b": "id-b"} if "b" in names else {})
    topics.check_topic_ids()
    assert checked == [("b", "id-b")]
