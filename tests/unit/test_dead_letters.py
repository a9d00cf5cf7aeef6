"""Dead letters: what a round's discards become (key, value, headers), and the publisher keeping what failed
for the round after. The producer here is a stand-in (the real broker is in tests/integration)."""

from __future__ import annotations

from herald.config.model import Subscription
from herald.delivery.report import Discarded
from herald.engine.round.result import RoundResult, SubscriptionOutcome
from herald.engine.upkeep.dead_letters import DeadLetterPublisher, dead_letters


def discarded(offset: int, **fields) -> Discarded:
    values = dict(partition=1, offset=offset, message_id=f"m{offset}", reason="Message sending failed with status "
                  "code:400", ended_by="status", http_status=400, attempts=1, message=b'{"i": 1}', published_ms=0,
                  discarded_ms=0, key=b"k1")
    values.update(fields)
    return Discarded(**values)


def round_of(*outcomes) -> RoundResult:
    return RoundResult("stream", "w", 3, "g.t", "c", list(outcomes))


def subscription(name: str, topic: str | None) -> Subscription:
    return Subscription(topicName="g.t", name=name, endpoint="http://127.0.0.1:9/",
                        onDiscard={"topic": topic} if topic else None)


def test_a_discard_becomes_a_dead_letter_with_its_key_value_and_why():
    result = round_of(SubscriptionOutcome(subscription("a", "dlq.a"), discarded=[discarded(5)]),
                      SubscriptionOutcome(subscription("b", None), discarded=[discarded(6)]),
                      SubscriptionOutcome(subscription("c", "dlq.c"), discarded=[
                          discarded(7, raw_value=b"\x00\x00\x00\x00\x01avro", http_status=None, ended_by="decode",
                                    endpoint="http://u:*****@h/", batch_id="b-1")]))
    first, second = dead_letters(result)
    assert (first.topic, first.key, first.value) == ("dlq.a", b"k1", b'{"i": 1}')
    assert dict(first.headers) == {"herald.reason": b"Message sending failed with status code:400",
                                   "herald.http.status": b"400", "herald.ended.by": b"status",
                                   "herald.subscription": b"g.t.a", "herald.original.topic": b"g.t",
                                   "herald.original.partition": b"1", "herald.original.offset": b"5", "id": b"m5"}
    assert second.value == b"\x00\x00\x00\x00\x01avro", "the original bytes, not the JSON rendering"
    assert dict(second.headers)["herald.endpoint"] == b"http://u:*****@h/"
    assert dict(second.headers)["herald.batch.id"] == b"b-1" and "herald.batch.id" not in dict(first.headers)
    assert "herald.http.status" not in dict(second.headers)


class FlakyProducer:
    """Fails every produce while `down`; records what it published."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.down = True
        self.published: list[tuple] = []
        self._callbacks: list = []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        self._callbacks.append((on_delivery, (topic, key, value, dict(headers)["herald.original.offset"])))

    def poll(self, timeout):
        return 0

    def flush(self, timeout):
        for callback, letter in self._callbacks:
            if self.down:
                callback("broker down", None)
            else:
                self.published.append(letter)
                callback(None, None)
        self._callbacks = []
        return 0


def test_a_failed_publish_is_counted_kept_and_tried_again_after_the_next_round():
    producers = []
    publisher = DeadLetterPublisher({"bootstrap.servers": "x"}, lambda config: producers.append(
        FlakyProducer(config)) or producers[-1])
    producer = producers[0]
    assert producer.config["enable.idempotence"] is True and producer.config["retry.backoff.ms"] == 1000
    try:
        publisher.observe(round_of(SubscriptionOutcome(subscription("a", "dlq"), discarded=[discarded(1),
                                                                                              discarded(2)])), 0.1)
        assert not publisher.drain(5)
        assert publisher.failed_total == 2 and publisher.pending == 2 and producer.published == []
        producer.down = False
        publisher.observe(round_of(SubscriptionOutcome(subscription("a", "dlq"), discarded=[discarded(3)])), 0.1)
        assert publisher.drain(5)
        assert [offset for _, _, _, offset in producer.published] == [b"1", b"2", b"3"], "the kept ones first"
        assert publisher.published_total == 3 and publisher.failed_total == 2
    finally:
        publisher.close(5)


class SlowProducer(FlakyProducer):
    """The first flush gives up with every letter still in flight; their reports (failures) come with the next
    flush; after that it publishes."""

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.flushes = 0

    def flush(self, timeout):
        self.flushes += 1
        if self.flushes == 1:
            return len(self._callbacks)  # in flight: no report yet
        if self.flushes == 2:
            self.down = True
            late, self._callbacks = self._callbacks[:2], self._callbacks[2:]
            for callback, _ in late:
                callback("timed out", None)
            self.down = False
        return super().flush(timeout)


def test_letters_still_in_flight_when_a_flush_gives_up_come_back_with_their_reports():
    producers = []
    publisher = DeadLetterPublisher({"bootstrap.servers": "x"}, lambda config: producers.append(
        SlowProducer(config)) or producers[-1], flush_timeout_s=0.1)
    try:
        publisher.observe(round_of(SubscriptionOutcome(subscription("a", "dlq"), discarded=[discarded(1),
                                                                                              discarded(2)])), 0.1)
        publisher.drain(2)
        publisher.observe(round_of(SubscriptionOutcome(subscription("a", "dlq"), discarded=[discarded(3)])), 0.1)
        publisher.drain(2)
        publisher.observe(round_of(SubscriptionOutcome(subscription("a", "dlq"), discarded=[])), 0.1)
        assert publisher.drain(5)
        assert sorted(offset for _, _, _, offset in producers[0].published) == [b"1", b"2", b"3"], \
            "the letters whose reports came late were published again"
        assert publisher.failed_total == 2
    finally:
        publisher.close(5)


def test_while_kafka_is_down_at_most_max_pending_letters_wait(monkeypatch, caplog):
    from herald.engine.upkeep import dead_letters as dead_letters_module

    monkeypatch.setattr(dead_letters_module, "MAX_PENDING", 5)
    producers = []
    publisher = DeadLetterPublisher({"bootstrap.servers": "x"}, lambda config: producers.append(
        FlakyProducer(config)) or producers[-1])
    try:
        for first in range(0, 12, 3):
            publisher.observe(round_of(SubscriptionOutcome(subscription("a", "dlq"), discarded=[
                discarded(offset) for offset in range(first, first + 3)])), 0.1)
            publisher.drain(5)
        assert publisher.pending == 5 and publisher.dropped_total == 7
        assert "dead letter(s) dropped" in caplog.text
        producers[0].down = False
        publisher.observe(round_of(SubscriptionOutcome(subscription("a", "dlq"), discarded=[])), 0.1)
        assert publisher.drain(5)
        assert [offset for _, _, _, offset in producers[0].published] == [b"7", b"8", b"9", b"10", b"11"], \
            "the newest are kept"
    finally:
        publisher.close(5)
