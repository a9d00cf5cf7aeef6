"""Where a subscription's state is found again after a restart (herald.engine.round.state.StateBook), over real delta-rs
tables: the states held at its positions belong to the Kafka topic they were held in."""

from __future__ import annotations

from herald.config import load_config
from herald.delivery.message import RetryState
from herald.delivery.report import Carried
from herald.engine.round.result import CATCHUP, RoundResult, SubscriptionOutcome, table_rows
from herald.engine.round.state import StateBook
from herald.storage import Slice, TableWriter, open_store
from tests.support.config_files import write_conf


def test_a_state_held_in_one_kafka_topic_is_never_taken_up_in_another(tmp_path):
    """An ordered subscription held a message at offset 5 of Kafka topic A (a HELD row), then its topic's
    `kafkaTopic` went to B and back: B's positions never take A's state (it could discard B's message at offset 5,
    never sent, for A's spent TTL), and A's positions take it up again."""
    subscription = load_config(write_conf(tmp_path)).subscriptions[0]
    store = open_store("deltalake", str(tmp_path / "state"))
    writer = TableWriter(store)
    held = RetryState(attempts=7, first_read_ms=1, due_ms=2, backoff_s=1.0, last_status=500, last_reason="500")
    for batch_id, (kafka_topic, outcome) in enumerate([
            ("topic.a", SubscriptionOutcome(subscription, positions={0: 5}, carried=[Carried(0, 5, held)])),
            ("topic.b", SubscriptionOutcome(subscription, positions={0: 3}))]):
        result = RoundResult(CATCHUP, f"catchup:{kafka_topic}", batch_id, kafka_topic, "c", [outcome])
        writer.submit(Slice(result.writer, batch_id), table_rows(result, 1000 + batch_id), new=True)
    assert writer.close(30)

    book = StateBook(store, TableWriter(store))
    in_b = book.state_for(subscription, "topic.b", {0: (0, 10)})
    assert in_b.positions == {0: 3} and in_b.carried == {}, "A's state in B"
    in_a = book.state_for(subscription, "topic.a", {0: (0, 10)})
    assert in_a.positions == {0: 5} and in_a.carried == {(0, 5): held}


def test_the_stored_topic_id_is_the_newest_rows_one(tmp_path):
    """A partition the topic created again no longer has keeps its last row, in the old topic's id, while the
    others' newer rows name the new id: a start takes the newest row's id, whatever order the rows come in, or
    it would find the same reset again at every start (positions sent back, delivered messages sent again)."""
    import datetime as dt

    from herald.engine.round.result import position_rows
    from herald.engine.round.state import stored_offsets
    from herald.storage import DeltaRsStore
    from herald.storage.tables import OFFSETS

    store = DeltaRsStore(str(tmp_path / "storage"))
    old, new = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)
    for writer, batch, positions, at, topic_id in (("stream:t", 7, {0: 20, 1: 10}, old, "old-id"),
                                                   ("reset:t.a", 1, {0: 0}, new, "new-id"),
                                                   ("stream:t", 8, {0: 5}, new + dt.timedelta(seconds=1), "new-id")):
        store.append(OFFSETS, position_rows("t.a", "t", positions, writer, batch, at, topic_id))
    positions, ids = stored_offsets(store)
    assert positions[("t.a", "t")] == {0: 5, 1: 10}
    assert ids[("t.a", "t")] == "new-id"
