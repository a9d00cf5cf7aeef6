"""A topic created again while a round that read its old log has not parked yet (review finding A).

The round's outcome is taken into the states (`apply`), then its rows are handed to the writer and only then its
parked messages to the retry driver. A reset found in between (by the shared read's checks, on another thread)
ends the subscription's parked messages of the old log when the moves are flushed; a flush by any other thread
in that gap used to run that end before the round had parked, and the round then parked old-log messages that
nothing ended: retried as if their offsets were still theirs, overwritten by the new log's message at the same
offset. No Spark: the real pipeline and retry driver, real Delta tables (delta-rs)."""

from __future__ import annotations

from herald.delivery.message import Record, RetryState
from herald.delivery.report import Parked
from herald.engine.context import now_ms
from herald.storage.tables import UNDELIVERED
from tests.integration.test_round_stamps import _pipeline, _record, _round_over


def test_a_reset_between_a_rounds_apply_and_its_parking_still_ends_what_it_parks(tmp_path):
    pipeline, state = _pipeline(tmp_path)
    state.topic_id = pipeline.topic_id = "id-old"
    at = now_ms()
    stamp, outcome = _round_over(pipeline, state, {0: 12, 1: 10}, parked=[Parked(
        Record(partition=0, offset=11, timestamp_ms=at, message_id="old-11", body=b'{"log": "old"}'),
        RetryState(attempts=1, first_read_ms=at - 1000, due_ms=at + 60_000, last_status=503))])

    pipeline.check_log({0: (0, 3), 1: (0, 3)}, "id-new")  # the topic, created again, has 3 messages a partition
    pipeline.flush_moves()  # another thread's flush, before the round has parked
    _record(pipeline, stamp, outcome, batch_id=1, park=pipeline.park)  # its rows, then its parked message
    pipeline.parking_ended([outcome])
    pipeline.flush_moves()  # the round's own flush
    pipeline.context.writer.close()

    assert pipeline.retries.parked_count(state.id) == 0, "the old log's message is not retried as the new one's"
    rows = [row for row in pipeline.context.store.read(UNDELIVERED, state.id).to_pylist() if row["offset"] == 11]
    assert [(row["status"], row["ended_by"]) for row in rows] == [("DISCARDED", "reset")], rows


def test_what_the_new_log_parks_meanwhile_stays_parked(tmp_path):
    """The reset's end waits for the round that read the old log, and only for it: a round of the new log that
    parks (and is recorded) while that one has still to park keeps its messages parked, the one at the old
    message's very offset included (the old one is never parked over it), and the old one ends."""
    pipeline, state = _pipeline(tmp_path)
    state.topic_id = pipeline.topic_id = "id-old"
    at = now_ms()

    def parked(offset: int, log: str, timestamp_ms: int) -> Parked:
        return Parked(Record(partition=0, offset=offset, timestamp_ms=timestamp_ms, message_id=f"{log}-{offset}",
                             body=b'{"log": "%s"}' % log.encode()),
                      RetryState(attempts=1, first_read_ms=at - 1000, due_ms=at + 60_000, last_status=503))

    old_stamp, old_round = _round_over(pipeline, state, {0: 12, 1: 10}, parked=[parked(11, "old", at - 5000)])
    pipeline.check_log({0: (0, 3), 1: (0, 3)}, "id-new")  # created again: 3 messages a partition, then 20
    new_stamp, new_round = _round_over(pipeline, state, {0: 12}, parked=[parked(1, "new", at), parked(11, "new", at)])
    _record(pipeline, new_stamp, new_round, batch_id=2, park=pipeline.park)
    pipeline.parking_ended([new_round])
    pipeline.flush_moves()  # the new log's round's own flush: the old one has still to park
    _record(pipeline, old_stamp, old_round, batch_id=1, park=pipeline.park)
    pipeline.parking_ended([old_round])
    pipeline.flush_moves()
    pipeline.context.writer.close()

    assert pipeline.retries.parked_count(state.id) == 2, "the new log's messages are still parked, 11 included"
    rows = pipeline.context.store.read(UNDELIVERED, state.id).to_pylist()
    assert sorted((row["offset"], row["status"], row["ended_by"], row["message"]) for row in rows
                  if row["status"] == "DISCARDED") == [(11, "DISCARDED", "reset", '{"log": "old"}')]
