"""BATCH delivery in the task's loop, on a fake clock and a fake transport: what closes a batch, the body and
headers of its attempts, order per partition, retries with a stable id, discards of every message, and a
batch carried across rounds (open, or in retry)."""

from __future__ import annotations

import json

from herald.delivery.batcher import batch_id
from herald.delivery.message import Record, RetryState, message_id
from herald.delivery.outcome import FailureKind, TransportFailure
from herald.delivery.policy import EndedBy
from herald.delivery.spec import BatchSpec
from herald.delivery.transport import HttpAnswer
from tests.support.delivery import TOPIC, batch, lane, lane_report, record, retry_policy, run
from tests.support.fake_transport import FakeClock, ok

SUBSCRIPTION = "g.t.s"


def batch_lane(size: int = 10, time_s: float = 30.0, volume: int = 64_000, **overrides):
    return lane(batch=BatchSpec(size=size, time_s=time_s, volume_bytes=volume), **overrides)


def rows(partition: int, offsets, **fields) -> list:
    return [(record(partition, o, **fields), (0,)) for o in offsets]


def sent_offsets(sent) -> list[int]:
    return [item["o"] for item in json.loads(sent.request.body)]


def test_a_batch_closes_at_batch_size_and_its_body_is_the_json_array_of_the_messages_as_published():
    report, transport, _ = run({0: batch_lane(size=10)}, [batch(rows(0, range(25)))], ok(), flush_batches=True)
    assert [sent_offsets(s) for s in transport.sent] == [list(range(10)), list(range(10, 20)), list(range(20, 25))]
    first = transport.sent[0]
    assert first.request.body == b"[" + b",".join(record(0, o).body for o in range(10)) + b"]"
    assert first.header("Content-Type") == "application/json"
    assert first.header("Hermes-Batch-Id") == batch_id(SUBSCRIPTION, 0, 0, 9)
    assert first.header("Hermes-Retry-Count") == "0" and first.message_id is None
    counters = lane_report(report).counters
    assert (counters.delivered, counters.batches_delivered, counters.attempts) == (25, 3, 3)
    assert lane_report(report).stops == {} and lane_report(report).carried == []


def test_a_batch_closes_before_the_next_message_would_pass_batch_volume_and_a_big_message_goes_alone():
    small = [(record(0, o, body={"o": o, "pad": "x" * 20}), (0,)) for o in range(6)]  # 30-31 bytes each
    big = [(record(0, 6, body={"o": 6, "pad": "y" * 200}), (0,))]
    tail = [(record(0, 7, body={"o": 7}), (0,))]
    _, transport, _ = run({0: batch_lane(size=100, volume=121)}, [batch(small + big + tail)], ok(),
                          flush_batches=True)
    assert [sent_offsets(s) for s in transport.sent] == [[0, 1, 2], [3, 4, 5], [6], [7]]
    assert [len(s.request.body) for s in transport.sent][:2] == [121, 121], "39 bytes a message, 3 fit"


def test_batches_of_a_partition_go_one_at_a_time_in_order_while_partitions_overlap():
    input_rows = [row for o in range(20) for row in rows(o % 2, [o])]
    _, transport, _ = run({0: batch_lane(size=3)}, [batch(input_rows)], ok(latency_s=0.5), flush_batches=True)
    for partition in (0, 1):
        mine = [s for s in transport.sent if json.loads(s.request.body)[0]["p"] == partition]
        assert [o for s in mine for o in sent_offsets(s)] == [o for o in range(20) if o % 2 == partition]
        assert all(later.started >= earlier.ended for earlier, later in zip(mine, mine[1:])), "one at a time"
    starts = sorted(s.started for s in transport.sent)
    assert starts[1] - starts[0] < 0.01, "the two partitions' first batches go out together"


def test_a_retried_batch_keeps_its_id_counts_its_retries_and_honours_retry_after():
    def respond(request, attempt):
        return ([HttpAnswer(500), HttpAnswer(503, retry_after="2"), HttpAnswer(200)][min(attempt, 2)], 0.01)

    report, transport, _ = run({0: batch_lane(size=5, retry=retry_policy(message_ttl_s=60, backoff_s=0.1))},
                               [batch(rows(0, range(5)))], respond, park_after_s=10)
    assert [s.header("Hermes-Batch-Id") for s in transport.sent] == [batch_id(SUBSCRIPTION, 0, 0, 4)] * 3
    assert [s.header("Hermes-Retry-Count") for s in transport.sent] == ["0", "1", "2"]
    first, second, third = transport.sent
    assert second.started - first.ended >= 0.1 and third.started - second.ended >= 2.0
    assert lane_report(report).counters.delivered == 5


def test_a_discarded_batch_writes_every_message_with_the_batch_id_and_the_next_batch_goes_on():
    def respond(request, attempt):
        return (HttpAnswer(400) if sent_offsets_of(request)[0] == 0 else HttpAnswer(200)), 0.01

    report, transport, _ = run({0: batch_lane(size=3)}, [batch(rows(0, range(6)))], respond, flush_batches=True)
    discarded = lane_report(report).discarded
    assert [(d.offset, d.http_status, d.ended_by, d.attempts) for d in discarded] == \
        [(o, 400, EndedBy.STATUS, 1) for o in range(3)]
    assert {d.batch_id for d in discarded} == {batch_id(SUBSCRIPTION, 0, 0, 2)}
    assert [d.message_id for d in discarded] == [message_id(TOPIC, 0, o, None) for o in range(3)]
    assert all(d.reason == "Message sending failed with status code:400" for d in discarded)
    counters = lane_report(report).counters
    assert (counters.discarded, counters.batches_discarded, counters.delivered, counters.batches_delivered) == \
        (3, 1, 3, 1)
    assert [sent_offsets(s) for s in transport.sent] == [[0, 1, 2], [3, 4, 5]]


def sent_offsets_of(request) -> list[int]:
    return [item["o"] for item in json.loads(request.body)]


def test_a_message_that_is_not_json_is_discarded_alone_and_the_others_are_batched():
    bad = Record(partition=0, offset=1, timestamp_ms=1_800_000_000_000, message_id=message_id(TOPIC, 0, 1, None),
                 body=b"not json")
    report, transport, _ = run({0: batch_lane(size=10)}, [batch(rows(0, [0]) + [(bad, (0,))] + rows(0, [2]))], ok(),
                               flush_batches=True)
    assert [sent_offsets(s) for s in transport.sent] == [[0, 2]]
    [discarded] = lane_report(report).discarded
    assert discarded.offset == 1 and discarded.reason.startswith("BATCH delivery sends a JSON array")

    # read beside a batch that is carried to the next round, it is read again then: not discarded twice
    report, transport, _ = run({0: batch_lane(size=10)}, [batch(rows(0, [0]) + [(bad, (0,))] + rows(0, [2]))], ok())
    assert transport.sent == [] and lane_report(report).discarded == []
    assert lane_report(report).stops == {0: 0}


def test_an_open_batch_is_carried_to_the_next_round_and_closes_when_its_time_from_the_first_read_is_up():
    clock = FakeClock()
    plan = batch_lane(size=100, time_s=3.0)
    report, transport, _ = run({0: plan}, [batch(rows(0, range(4)))], ok(), clock=clock)
    assert transport.sent == [], "nothing closes it yet"
    [carried] = lane_report(report).carried
    assert (carried.partition, carried.offset, carried.state.attempts, carried.state.batch_last_offset) == \
        (0, 0, 0, None)
    first_read_ms = carried.state.first_read_ms
    assert carried.state.due_ms == first_read_ms + 3000
    assert lane_report(report).stops == {0: 0}, "the position stops at its first message"

    clock.sleep(1.0)  # the next round reads the batch's messages again, and new ones
    resumed = batch_lane(size=100, time_s=3.0, resume={(0, 0): carried.state}, starts={0: 0})
    report, transport, _ = run({0: resumed}, [batch(rows(0, range(7)))], ok(), clock=clock)
    assert transport.sent == [] and lane_report(report).carried[0].state.first_read_ms == first_read_ms

    clock.sleep(2.5)  # past 3 s from the first read: the round closes it at once
    report, transport, _ = run({0: resumed}, [batch(rows(0, range(9)))], ok(), clock=clock)
    assert [sent_offsets(s) for s in transport.sent] == [list(range(9))]
    assert transport.sent[0].started - clock.now <= 0 and lane_report(report).carried == []


def test_a_batch_in_retry_at_the_deadline_is_carried_closed_and_resumed_with_the_same_id_and_count():
    clock = FakeClock()
    failing = lambda request, attempt: (HttpAnswer(500), 0.01)  # noqa: E731
    plan = batch_lane(size=3, retry=retry_policy(message_ttl_s=600, backoff_s=1.0), inflight=1)
    report, transport, _ = run({0: plan}, [batch(rows(0, range(5)))], failing, clock=clock, deadline_s=2.5,
                               park_after_s=60)
    assert [sent_offsets(s) for s in transport.sent] == [[0, 1, 2]] * 3
    carried = {item.offset: item.state for item in lane_report(report).carried}
    assert carried[0].attempts == 3 and carried[0].batch_last_offset == 2
    assert carried[3].attempts == 0 and carried[3].batch_last_offset is None, "the next one was still open"
    assert lane_report(report).stops == {0: 0}

    clock.sleep(1.0)  # a message was added in between: the carried batch still ends at offset 2
    resumed = batch_lane(size=3, resume={(0, offset): state for offset, state in carried.items()}, starts={0: 0})
    report, transport, _ = run({0: resumed}, [batch(rows(0, range(7)))], ok(), clock=clock, flush_batches=True)
    assert [sent_offsets(s) for s in transport.sent] == [[0, 1, 2], [3, 4, 5], [6]]
    assert transport.sent[0].header("Hermes-Batch-Id") == batch_id(SUBSCRIPTION, 0, 0, 2)
    assert transport.sent[0].header("Hermes-Retry-Count") == "3"


def test_a_batch_whose_ttl_ends_is_discarded_with_the_last_reason():
    def respond(request, attempt):
        return TransportFailure(FailureKind.TIMEOUT, "timed out"), 0.2

    report, transport, _ = run({0: batch_lane(size=2, retry=retry_policy(message_ttl_s=1, backoff_s=0.3))},
                               [batch(rows(0, range(2)))], respond, flush_batches=True, park_after_s=10)
    discarded = lane_report(report).discarded
    assert [d.offset for d in discarded] == [0, 1] and {d.ended_by for d in discarded} == {EndedBy.TTL}
    assert len(transport.sent) >= 2


def test_ids_are_rfc_4122_uuid5_texts_as_the_uuid_module_makes_them():
    import uuid

    from herald.delivery.batcher import BATCH_ID_NAMESPACE
    from herald.delivery.message import MESSAGE_ID_NAMESPACE

    for partition, offset in [(0, 0), (3, 17), (11, 2**40 + 5)]:
        assert message_id("g.topic-ü", partition, offset, None) == str(
            uuid.uuid5(MESSAGE_ID_NAMESPACE, f"g.topic-ü/{partition}/{offset}"))
        assert batch_id(SUBSCRIPTION, partition, offset, offset + 99) == str(
            uuid.uuid5(BATCH_ID_NAMESPACE, f"{SUBSCRIPTION}/{partition}/{offset}/{offset + 99}"))
    assert message_id("g.t", 0, 1, [("id", b"from-the-publisher")]) == "from-the-publisher"


def test_a_batch_being_rebuilt_waits_for_its_last_offset_and_is_carried_unchanged_when_the_round_ends_first():
    clock = FakeClock()
    state = RetryState(attempts=3, first_read_ms=clock.wall_ms() - 100_000, due_ms=clock.wall_ms(), backoff_s=1.0,
                       last_status=500, last_reason="Message sending failed with status code:500",
                       batch_last_offset=2)
    plan = batch_lane(size=3, time_s=1.0, resume={(0, 0): state}, starts={0: 0})
    report, transport, _ = run({0: plan}, [batch(rows(0, range(2)))], ok(), clock=clock, flush_batches=True)
    assert transport.sent == [], "neither its time nor the end of the input closes it short of offset 2"
    [carried] = lane_report(report).carried
    assert (carried.offset, carried.state) == (0, state) and lane_report(report).stops == {0: 0}


def test_a_batch_carried_closed_closes_at_its_last_offset_even_when_that_message_no_longer_comes():
    """Its last message (offset 4) is passed over by the subscription's filters now (edited since): the batch
    still closes once the read passes offset 4, with the messages that still come, and keeps its id."""
    carried = RetryState(attempts=2, first_read_ms=FakeClock().wall_ms() - 1000, due_ms=0, batch_last_offset=4)
    resumed = batch_lane(size=5, resume={(0, 0): carried}, starts={0: 0})
    matching = rows(0, [0, 1, 2, 3])
    report, transport, _ = run({0: resumed}, [batch(matching, extra_offsets={0: [4, 5, 6]})], ok())
    assert [sent_offsets(s) for s in transport.sent] == [[0, 1, 2, 3]]
    assert transport.sent[0].header("Hermes-Batch-Id") == batch_id(SUBSCRIPTION, 0, 0, 4)
    assert transport.sent[0].header("Hermes-Retry-Count") == "2"
    assert lane_report(report).carried == [] and lane_report(report).counters.delivered == 4
