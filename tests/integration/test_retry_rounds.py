"""The retry driver records only what happened to a parked message (issue: nothing lost, nothing stuck).

The driver runs its rounds on the driver process with the tasks' sender, so these tests need no Spark: real
Delta tables (delta-rs), a real HTTP subscriber on 127.0.0.1. The last test runs `herald run --once` end to end.
"""

from __future__ import annotations

import time

import pytest

from herald.config import load_config
from herald.delivery.message import Record, RetryState
from herald.delivery.report import Parked
from herald.engine.context import EngineContext, now_ms, stamp_ms
from herald.engine.round.state import stored_positions
from herald.engine.runner import Runner
from herald.engine.triggers.retry_driver import RetryDriver
from herald.storage import DeltaRsStore, TableWriter
from herald.storage.tables import RETRIES
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import Reply, ScriptedSubscriber


def _driver(tmp_path, url: str, policy: dict | None = None) -> tuple[RetryDriver, object]:
    conf = write_conf(tmp_path, "127.0.0.1:9", "retry.topic", {"s": {
        "endpoint": url, "subscriptionPolicy": {"messageBackoff": 100, **(policy or {})}}},
        settings={"streaming": {"parkAfterMs": 0}})
    config = load_config(conf)
    store = DeltaRsStore(str(tmp_path / "storage"))
    context = EngineContext(spark=None, config=config, connector="python", store=store, writer=TableWriter(store))
    driver = RetryDriver(context)
    driver.set_active(config.subscriptions)
    return driver, config.subscriptions[0]


def _park(driver: RetryDriver, subscription, count: int) -> None:
    now = now_ms()
    parked = [Parked(Record(partition=0, offset=offset, timestamp_ms=now, message_id=f"m{offset}",
                            body=b'{"n": %d}' % offset),
                     RetryState(attempts=1, first_read_ms=now - 1000, due_ms=now - 10, backoff_s=0.1,
                                last_status=500, last_reason="Message sending failed with status code:500"))
              for offset in range(count)]
    driver.park(subscription, "retry.topic", parked)


def _rows(tmp_path) -> list[dict]:
    return DeltaRsStore(str(tmp_path / "storage")).read(RETRIES).to_pylist()


def test_a_round_stopped_before_its_sender_took_anything_records_nothing_and_keeps_every_message_parked(tmp_path):
    """The stop flag is set after the due messages were picked and before the sender took them (the end of a
    --once run, SIGINT, SIGTERM): no DELIVERED row, nothing sent, every message still parked as it was."""
    with ScriptedSubscriber() as sub:
        driver, subscription = _driver(tmp_path, sub.url)
        _park(driver, subscription, 40)
        due = driver.due_now()
        assert sum(len(messages) for messages in due.values()) == 40
        driver.stop()
        result = driver.run_round(due)
        driver.context.writer.close()
    assert sub.requests == []
    assert driver.parked_count(subscription.id) == 40
    outcome = result.outcomes[0]
    assert outcome.resolved == {} and outcome.parked == []
    assert _rows(tmp_path) == [], "a message that was not attempted costs no row"
    assert driver.summary()[0] == 40


def test_a_round_records_delivered_discarded_and_retrying_messages_each_once(tmp_path):
    """What the sender did is what the round records: a row per message that changed, of the right state."""
    def respond(request) -> Reply:
        n = request.json()["n"]
        return Reply(200 if n % 3 == 0 else 400 if n % 3 == 1 else 500)

    with ScriptedSubscriber(respond) as sub:
        driver, subscription = _driver(tmp_path, sub.url)
        _park(driver, subscription, 9)
        driver.run_round(driver.due_now())
        driver.context.writer.close()
    states = {row["offset"]: row["state"] for row in _rows(tmp_path)}
    assert states == {n: ["DELIVERED", "DISCARDED", "PARKED"][n % 3] for n in range(9)}
    assert len(_rows(tmp_path)) == 9
    assert driver.parked_count(subscription.id) == 3
    retrying = [row for row in _rows(tmp_path) if row["state"] == "PARKED"]
    assert all(row["attempts"] >= 2 for row in retrying), "attempts count on from the parked state"


def test_parked_messages_reach_the_retry_driver_only_after_their_parked_rows(tmp_path):
    """A round's parked messages go to the retry driver once its rows are handed to the writer, and a retry
    round's rows are stamped later: however fast the retry, a message's newest row is its latest state."""
    from herald.engine.round import steps
    from herald.engine.round.fanout import Participant
    from herald.engine.round.pipeline import TopicPipeline
    from herald.engine.round.planner import lane_plan
    from herald.engine.round.result import STREAM, RoundResult, SubscriptionOutcome
    from herald.engine.round.state import SubscriptionState

    with ScriptedSubscriber() as sub:
        driver, subscription = _driver(tmp_path, sub.url)
        context = driver.context
        state = SubscriptionState(subscription, positions={0: 0})
        pipeline = TopicPipeline(context, context.config.topic_of(subscription), [state], driver)
        now = now_ms()
        record = Record(partition=0, offset=0, timestamp_ms=now, message_id="m0", body=b'{"n": 0}')
        parked = Parked(record, RetryState(attempts=1, first_read_ms=now, due_ms=now - 1, last_status=503))
        outcome = SubscriptionOutcome(subscription, parked=[parked], positions={0: 1})
        stamp = pipeline.apply([Participant(0, state, lane_plan(state, context.flow_settings, 0))], [outcome])
        assert driver.parked_count(subscription.id) == 0, "not before the round's PARKED row is handed over"
        steps.record(context, RoundResult(STREAM, "stream:q", 7, "retry.topic", "test", [outcome]), 0.0, stamp,
                     park=driver.park)
        assert driver.parked_count(subscription.id) == 1
        driver.run_round(driver.due_now())  # delivered at once: 200
        context.writer.close()
    newest = DeltaRsStore(str(tmp_path / "storage")).latest(RETRIES, ("subscription", "partition", "offset"),
                                                             "recorded_at DESC, batch_id DESC").to_pylist()
    assert [row["state"] for row in newest] == ["DELIVERED"]
    stamps = [stamp_ms() for _ in range(1000)]
    assert stamps == sorted(set(stamps)), "row stamps never repeat and never go back"


@pytest.mark.spark
@pytest.mark.broker
def test_once_ends_while_a_subscriber_fails_everything_and_costs_a_row_per_message_per_run(
        broker, spark, topic_name, tmp_path):
    """40 messages, every attempt answered 500, messageBackoff 100 ms, parkAfterMs 0: each --once run ends by
    itself, parks what it tried, and retries each message in one round at most: a run parks each message it
    tried and may retry it once, each later run retries it once (a row per message and round, not thousands).
    Flow control soon slows the subscriber to probes: what a run did not try yet waits behind the position, held,
    for the next run (`test_once_throttled.py`); every message is parked or behind the position, none lost."""
    broker.create_topics({topic_name: 2})
    with ScriptedSubscriber(lambda request: Reply(500)) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {
            "endpoint": sub.url, "subscriptionPolicy": {"messageBackoff": 100}}},
            settings={"streaming": {"parkAfterMs": 0}})
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(40)])
        for run in range(1, 4):
            runner = Runner(load_config(conf), spark=spark)
            assert runner.run(once=True) == 0
            assert runner.context.writer.pending == 0, "a stop leaves no round unwritten"
            positions = stored_positions(runner.context.store)[(f"{topic_name}.s", topic_name)]
            assert runner.retries.summary()[0] + 40 - sum(positions.values()) == 40, "parked, or behind the position"
            rows = _rows(tmp_path)
            per_message: dict[int, int] = {}
            for row in rows:
                per_message[(row["partition"], row["offset"])] = per_message.get((row["partition"], row["offset"]),
                                                                                 0) + 1
            assert len(per_message) == sum(positions.values()) and max(per_message.values()) <= run + 1, per_message
            assert {row["state"] for row in rows} == {"PARKED"}, "nothing recorded as delivered"
            time.sleep(0.2)  # every parked message is due before the next run
    assert len({r.json()["i"] for r in sub.requests}) == 40, "every message was tried"


def test_a_carried_state_the_position_passes_ends_with_what_really_happened_to_it(tmp_path):
    """A message carried behind the position (HELD) is passed by the next round's position: its terminal row
    says DELIVERED only when the lane delivered it, DISCARDED when it gave it up, nothing when it was parked
    (its PARKED row is its state), and RELEASED when the round never attempted it (its filter no longer passes
    it, Kafka deleted it)."""
    from herald.delivery.report import DISCARDED as DISCARDED_STEP
    from herald.delivery.report import SUCCESS
    from herald.engine.round.fanout import Participant
    from herald.engine.round.pipeline import TopicPipeline
    from herald.engine.round.planner import lane_plan
    from herald.engine.round.result import SubscriptionOutcome
    from herald.engine.round.state import SubscriptionState

    with ScriptedSubscriber() as sub:
        driver, subscription = _driver(tmp_path, sub.url)
        context = driver.context
        now = now_ms()
        held = RetryState(attempts=2, first_read_ms=now, due_ms=now)
        state = SubscriptionState(subscription, positions={0: 1}, carried={(0, k): held for k in (1, 2, 3, 4)})
        pipeline = TopicPipeline(context, context.config.topic_of(subscription), [state], driver)
        record = Record(partition=0, offset=3, timestamp_ms=now, message_id="m3", body=b"{}")
        outcome = SubscriptionOutcome(subscription, positions={0: 5}, parked=[Parked(record, held)],
                                      ended_carried=[(0, 1, SUCCESS), (0, 2, DISCARDED_STEP)])
        pipeline.apply([Participant(0, state, lane_plan(state, context.flow_settings, 0))], [outcome])
        context.writer.close()
    assert {key: status for key, (_, status) in outcome.resolved.items()} == {
        (0, 1): "DELIVERED", (0, 2): "DISCARDED", (0, 4): "RELEASED"}, "(0, 3) was parked: its PARKED row stands"
    assert state.carried == {}


@pytest.mark.spark
@pytest.mark.broker
def test_a_replayed_micro_batch_recorded_before_the_crash_keeps_its_parked_and_undelivered_rows(
        broker, spark, topic_name, tmp_path):
    """A crash after a micro-batch's rows were written and before Spark committed it (simulated: its commit file
    removed) makes the next run replay it. Its subscriptions are already past it, so the replay must not replace
    the batch's rows with an empty round's: the undelivered row and the PARKED row stay, nothing is sent twice."""
    import os

    from herald.storage.tables import UNDELIVERED

    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": 0, "replies": [[400]]}, {"i": 1, "replies": [[500]]},
                                                   {"i": 2}])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {
            "endpoint": sub.url, "subscriptionPolicy": {"messageBackoff": 600000}}},  # outlasts both runs on any stack
            settings={"streaming": {"parkAfterMs": 200}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        from pathlib import Path

        from herald.engine.triggers.shared_read import read_checkpoint

        commits = Path(read_checkpoint(str(tmp_path / "storage"), [topic_name])) / "commits"
        last = max(int(name) for name in os.listdir(commits) if name.isdigit())
        (commits / str(last)).unlink()
        (commits / f".{last}.crc").unlink(missing_ok=True)  # a real crash leaves no checksum without its file
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert sorted(r.json()["i"] for r in sub.requests) == [0, 1, 2], "nothing sent twice"
    store = DeltaRsStore(str(tmp_path / "storage"))
    assert [row["offset"] for row in store.read(UNDELIVERED).to_pylist()] == [0]
    newest = store.latest(RETRIES, ("subscription", "partition", "offset"), "recorded_at DESC, batch_id DESC")
    assert [(row["offset"], row["state"]) for row in newest.to_pylist()] == [(1, "PARKED")]


def test_parked_messages_not_due_cost_no_round_and_no_row(tmp_path):
    """Issue 15 counted 34,497 PARKED rows for 40 messages over three --once runs (before 14da971): a parked
    message is recorded again only when a round attempted it, so a driver whose messages are not due writes
    nothing, however long it runs."""
    with ScriptedSubscriber() as sub:
        driver, subscription = _driver(tmp_path, sub.url)
        now = now_ms()
        driver.park(subscription, "retry.topic", [
            Parked(Record(partition=0, offset=n, timestamp_ms=now, message_id=f"m{n}", body=b'{"n": %d}' % n),
                   RetryState(attempts=1, first_read_ms=now, due_ms=now + 3_600_000, backoff_s=60.0, last_status=503))
            for n in range(40)])
        driver.start()
        time.sleep(1.5)
        driver.stop()
        driver.context.writer.close()
    assert sub.requests == []
    assert driver.parked_count(subscription.id) == 40
    storage = DeltaRsStore(str(tmp_path / "storage"))
    assert storage.read(RETRIES).num_rows == 0 and storage.read("metrics").num_rows == 0


def test_parked_messages_of_a_topics_old_log_end_discarded_before_a_new_message_takes_their_offset(tmp_path):
    """The topic was created again (herald.engine.round.resets): offsets from 2 on belong to new messages. The reset
    takes the old parked messages there out and gets their DISCARDED outcome (bodies kept) and a stamp; a new
    message parked at offset 3 afterwards is newer, so after a restart it is the one parked there; 0 and 1 stay."""
    from herald.engine.round import steps
    from herald.engine.round.result import RETRY, RoundResult, SubscriptionOutcome
    from herald.storage.tables import UNDELIVERED

    with ScriptedSubscriber() as sub:
        driver, subscription = _driver(tmp_path, sub.url)
        _park(driver, subscription, 5)
        ended, stamp = driver.end_old_log("retry.topic", {0: 2}, "the topic was created again", subscription)
        assert sorted(d.offset for d in ended.discarded) == [2, 3, 4] and driver.parked_count(subscription.id) == 2
        steps.record(driver.context, RoundResult(RETRY, "reset:test", 1, "retry.topic", "test", [ended]), 0.0, stamp)
        now = now_ms()
        new_round = SubscriptionOutcome(subscription, parked=[Parked(  # a round of the new log parks offset 3
            Record(partition=0, offset=3, timestamp_ms=now, message_id="new3", body=b'{"n": 103}'),
            RetryState(attempts=1, first_read_ms=now, due_ms=now + 60_000, backoff_s=0.1))])
        steps.record(driver.context, RoundResult("catchup", "catchup:test", 1, "retry.topic", "test", [new_round]),
                     0.0, stamp_ms(), park=driver.park)
        driver.context.writer.close()
    store = DeltaRsStore(str(tmp_path / "storage"))
    discarded = sorted((r["offset"], r["message_id"], r["message"], r["ended_by"], r["reason"])
                       for r in store.read(UNDELIVERED).to_pylist())
    assert discarded == [(offset, f"m{offset}", f'{{"n": {offset}}}', "reset", "the topic was created again")
                         for offset in (2, 3, 4)]
    assert driver.parked_count(subscription.id) == 3, "0 and 1 of the old log, and the new message at 3"
    newest = {r["offset"]: r for r in store.latest(RETRIES, ("subscription", "partition", "offset"),
                                                    "recorded_at DESC, batch_id DESC").to_pylist()}
    assert newest[3]["state"] == "PARKED" and newest[3]["message_id"] == "new3", "the new message, not the old"
    assert newest[4]["state"] == "DISCARDED"


def test_a_subscriber_that_holds_its_retry_round_holds_no_other_subscriptions_retries(tmp_path):
    """`slow` answers after 8 s (its round lasts that long); `quick` answers 503 to a message's first retry and
    200 to its second. Each subscription's retries go in rounds of their own: quick's second retry (a round
    after its first) is delivered while slow's first round is still open, not after it."""
    import threading

    slow_started = threading.Event()

    def slow(request) -> Reply:
        slow_started.set()
        return Reply(200, delay_ms=8000)

    seen: dict[str, int] = {}

    def quick(request) -> Reply:
        seen[request.json()["n"]] = seen.get(request.json()["n"], 0) + 1
        return Reply(503 if seen[request.json()["n"]] == 1 else 200)

    with ScriptedSubscriber(slow) as slow_sub, ScriptedSubscriber(quick) as quick_sub:
        conf = write_conf(tmp_path, "127.0.0.1:9", "retry.topic", {
            "slow": {"endpoint": slow_sub.url, "subscriptionPolicy": {"requestTimeout": 30_000}},
            "quick": {"endpoint": quick_sub.url, "subscriptionPolicy": {"messageBackoff": 100}}},
            settings={"streaming": {"parkAfterMs": 0}})
        config = load_config(conf)
        store = DeltaRsStore(str(tmp_path / "storage"))
        context = EngineContext(spark=None, config=config, connector="python", store=store, writer=TableWriter(store))
        driver = RetryDriver(context)
        driver.set_active(config.subscriptions)
        by_name = {s.name: s for s in config.subscriptions}
        now = now_ms()
        for name in ("slow", "quick"):
            driver.park(by_name[name], "retry.topic", [Parked(
                Record(partition=0, offset=0, timestamp_ms=now, message_id=f"{name}0", body=b'{"n": 0}'),
                RetryState(attempts=1, first_read_ms=now, due_ms=now, backoff_s=0.1))])
        driver.start()
        try:
            assert slow_started.wait(10), "slow's round started"
            started = time.monotonic()
            while driver.parked_count(by_name["quick"].id) and time.monotonic() - started < 30:
                time.sleep(0.05)
            quick_done_while_slow_open = slow_sub._open == 1  # its request is still unanswered
        finally:
            driver.stop()
            driver.close()
            context.writer.close()
    assert seen == {0: 2}, "quick's message: 503, then 200"
    assert quick_done_while_slow_open, "quick's retries waited for slow's round"
