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
