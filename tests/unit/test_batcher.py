"""The Batcher on its own (no lane, no transport, the clock passed in) and the endpoint-choice strategies: what
closes a batch, how many a partition holds, a carried batch rebuilt to its last offset, and which endpoint each
attempt goes to."""

from __future__ import annotations

from herald.delivery.batcher import Batcher
from herald.delivery.choice import EveryEndpoint, OneEndpoint, Overflow, RoundRobin, endpoint_choice
from herald.delivery.clock import Instant
from herald.delivery.message import Record, RetryState, TargetState
from herald.delivery.plan import Target
from herald.delivery.spec import BatchSpec
from herald.delivery.unit import MessageUnit

NOW, NOW_MS = 100.0, 1_700_000_000_000


def rec(partition: int, offset: int, body: bytes = b'{"n":1}') -> Record:
    return Record(partition=partition, offset=offset, timestamp_ms=NOW_MS, message_id=f"m{offset}", body=body)


def add(batcher: Batcher, record: Record, now: float = NOW) -> tuple[bool, list]:
    return batcher.add(record, record.body, Instant(now, NOW_MS))


def test_a_batch_closes_at_size_and_its_partition_holds_two_batches_at_most():
    batcher = Batcher(BatchSpec(size=2, time_s=30, volume_bytes=10_000), {})
    assert add(batcher, rec(0, 0)) == (True, [])
    taken, closed = add(batcher, rec(0, 1))
    assert taken and [b.last_offset for b in closed] == [1]
    add(batcher, rec(0, 2))
    taken, closed = add(batcher, rec(0, 3))
    assert taken and [b.last_offset for b in closed] == [3]
    taken, closed = add(batcher, rec(0, 4))
    assert not taken and closed == [], "two closed batches wait: the partition takes no more"
    assert (batcher.batches, batcher.held) == (2, 4)
    assert add(batcher, rec(1, 0))[0], "another partition has room"
    following = batcher.end(batcher.first(0))
    assert following is not None and following.first_offset == 2, "the next closed batch of the partition may go"
    assert add(batcher, rec(0, 4))[0]


def test_volume_closes_a_batch_before_the_next_message_would_pass_it_and_a_big_message_goes_alone():
    batcher = Batcher(BatchSpec(size=100, time_s=30, volume_bytes=20), {})
    small, big = b'{"a":12345}', b'{"a":"' + b"x" * 40 + b'"}'
    add(batcher, rec(0, 0, small))
    taken, closed = add(batcher, rec(0, 1, small))
    assert taken and [b.records[-1].offset for b in closed] == [0], "two of them would pass 20 bytes"
    batcher.end(batcher.first(0))
    taken, closed = add(batcher, rec(0, 2, big))
    assert taken and [[r.offset for r in b.records] for b in closed] == [[1], [2]], \
        "the batch without room for it closes, and the big message alone closes at once"
    assert batcher.next_close() is None, "nothing is left filling"


def test_time_closes_a_filling_batch_counted_from_its_first_read_carried_across_rounds():
    carried = RetryState(attempts=0, first_read_ms=NOW_MS - 25_000, due_ms=NOW_MS + 5_000)
    batcher = Batcher(BatchSpec(size=100, time_s=30, volume_bytes=10_000), {(0, 7): carried})
    add(batcher, rec(0, 7))
    add(batcher, rec(1, 0))
    assert batcher.next_close() == NOW + 5, "the carried batch was first read 25 s ago"
    assert batcher.close_due(NOW + 4.9) == []
    assert [b.partition for b in batcher.close_due(NOW + 5)] == [0]
    assert batcher.next_close() == NOW + 30


def test_a_batch_carried_closed_is_rebuilt_to_its_last_offset_even_when_that_message_no_longer_comes():
    carried = RetryState(attempts=2, first_read_ms=NOW_MS - 1000, due_ms=NOW_MS, batch_last_offset=13)
    batcher = Batcher(BatchSpec(size=2, time_s=0.1, volume_bytes=10), {(0, 10): carried})
    for offset in (10, 11, 12):
        taken, closed = add(batcher, rec(0, offset))
        assert taken and closed == [], "neither size, volume nor time closes a batch being rebuilt"
    assert batcher.close_due(NOW + 60) == [] and batcher.next_close() is None
    assert not batcher.read_through(0, 13) and batcher.close_passed() == []
    assert batcher.read_through(0, 15), "the read passed offset 13 (filtered out since, or compacted away)"
    closed = batcher.close_passed()
    assert [(b.first_offset, b.last_offset, len(b.records)) for b in closed] == [(10, 13, 3)]


ENDPOINTS = (Target("http://a/"), Target("http://b/"), Target("http://c/"))


def NO_LOAD() -> tuple[int, int]:  # noqa: N802 - a constant-like callable
    return 0, 0


def test_overflow_serves_conditional_endpoints_only_while_the_backlog_or_the_flight_reaches_them():
    load = {"pending": 10, "in_flight": 0}
    targets = (Target("http://east/"), Target("http://west/", min_pending=1000, min_inflight=50),
               Target("http://south/", min_inflight=5))
    choice = endpoint_choice(targets, broadcast=False, load=lambda: (load["pending"], load["in_flight"]))
    assert isinstance(choice, Overflow) and choice.width == 1
    units = [MessageUnit(rec(0, n), NOW, NOW) for n in range(4)]
    assert [choice.pick(unit) for unit in units] == [0, 0, 0, 0], "a small backlog: the first endpoint only"
    units[0].attempts = 1
    assert choice.pick(units[0]) == 0, "a retry stays among the endpoints served"
    load["pending"] = 1000
    assert sorted(choice.pick(MessageUnit(rec(0, n), NOW, NOW)) for n in range(10, 14)) == [0, 0, 1, 1], \
        "a backlog of minPending: west takes turns with east"
    load["in_flight"] = 5
    assert sorted({choice.pick(MessageUnit(rec(0, n), NOW, NOW)) for n in range(20, 26)}) == [0, 1, 2]
    retried = MessageUnit(rec(0, 30), NOW, NOW)
    retried.target, retried.attempts = 2, 1
    assert choice.pick(retried) == 0, "a retry goes to the next endpoint served after its last, wrapping round"
    load["pending"], load["in_flight"] = 999, 4
    assert {choice.pick(MessageUnit(rec(0, n), NOW, NOW)) for n in range(40, 46)} == {0}, "the backlog fell back"


def test_round_robin_sends_first_attempts_to_the_next_endpoint_and_each_retry_to_the_one_after_its_last():
    choice = endpoint_choice(ENDPOINTS, broadcast=False, load=NO_LOAD)
    assert isinstance(choice, RoundRobin) and choice.width == 1
    units = [MessageUnit(rec(0, n), NOW, NOW) for n in range(4)]
    assert [choice.pick(unit) for unit in units] == [0, 1, 2, 0]
    units[1].attempts = 1
    assert choice.pick(units[1]) == 2
    resumed = MessageUnit(rec(0, 9), NOW, NOW)
    resumed.attempts = 2  # continues from an earlier round: its first attempt here is its third
    assert choice.pick(resumed) == 1 and choice.pick(MessageUnit(rec(0, 10), NOW, NOW)) == 2
    assert isinstance(endpoint_choice(ENDPOINTS[:1], broadcast=False, load=NO_LOAD), OneEndpoint)


def test_broadcast_spreads_a_message_over_every_endpoint_or_those_its_state_has_not_reached():
    choice = endpoint_choice(ENDPOINTS, broadcast=True, load=NO_LOAD)
    assert isinstance(choice, EveryEndpoint) and choice.width == 3
    assert [index for index, _ in choice.spread(None)] == [0, 1, 2]
    state = RetryState(attempts=4, first_read_ms=NOW_MS, due_ms=NOW_MS,
                       targets=(TargetState(2, 4, NOW_MS + 1000, 8.0, 503, "busy"),))
    [(index, member)] = choice.spread(state)
    assert index == 2 and (member.attempts, member.due_ms, member.last_status) == (4, NOW_MS + 1000, 503)
