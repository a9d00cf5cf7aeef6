"""The parked messages on the driver's disk (herald.engine.triggers.parked): what is due when, counts, versions that
tell a round whether the message it took is still the one parked, and the messages a topic's new log takes out."""

from __future__ import annotations

import os

import pytest

from herald.delivery.message import Record, RetryState
from herald.engine.triggers.parked import ParkedRegistry


def _parked(offset: int, due_ms: int, partition: int = 0) -> tuple[Record, RetryState]:
    return (Record(partition=partition, offset=offset, timestamp_ms=1, message_id=f"m{offset}",
                   body=b'{"n": %d}' % offset, key=b"k"),
            RetryState(attempts=1, first_read_ms=1, due_ms=due_ms, backoff_s=0.1, last_status=500))


@pytest.fixture
def registry(tmp_path):
    parked = ParkedRegistry(str(tmp_path))
    yield parked
    parked.close()


def test_due_messages_come_earliest_first_with_their_bodies_and_counts_follow_puts(registry):
    registry.put("a", "t", [_parked(offset, 1000 - offset) for offset in range(5)])
    registry.put("a", "t", [_parked(4, 2000)])  # parked again at the same offset: replaced, not one more
    registry.put("b", "t", [_parked(0, 10)])
    assert (registry.count("a"), registry.count("b"), registry.total()) == (5, 1, 6)
    due = registry.due("a", horizon_ms=998, limit=10, untried_only=False)
    assert [m.record.offset for m in due] == [3, 2], "due by the horizon, earliest first"
    assert due[0].record.body == b'{"n": 3}' and due[0].record.key == b"k" and due[0].kafka_topic == "t"
    assert registry.due("a", 10_000, limit=2, untried_only=False)[1].record.offset == 2, "at most `limit`"
    assert registry.next_due("a", False) == 997 and registry.earliest() == 10, "offset 4 is due at 2000 now"
    assert sorted(registry.subscriptions()) == ["a", "b"]


def test_a_round_updates_or_removes_only_the_message_it_took(registry):
    registry.put("a", "t", [_parked(0, 1), _parked(1, 1)])
    first, second = registry.due("a", 10, 10, untried_only=False)
    later = RetryState(attempts=2, first_read_ms=1, due_ms=500, backoff_s=0.1)
    assert registry.update("a", first, later, tried=True)
    assert not registry.same("a", first), "a new version"
    assert [m.record.offset for m in registry.due("a", 1000, 10, untried_only=True)] == [1], "tried: not again"
    registry.put("a", "t", [_parked(1, 5)])  # a stream round parked offset 1 again meanwhile
    assert not registry.remove("a", second), "the round's message is not the one parked now"
    assert registry.count("a") == 2
    assert registry.untried_due_by("a", 10) and not registry.untried_due_by("b", 10)


def test_a_new_log_takes_out_the_old_messages_at_and_past_its_offsets(registry):
    registry.put("a", "t", [_parked(offset, 1) for offset in range(4)] + [_parked(7, 1, partition=1)])
    registry.put("a", "other", [_parked(9, 1, partition=1)])
    taken = registry.take_where("t", {0: 2, 1: 0}, ["a"])
    assert sorted((m.record.partition, m.record.offset) for m in taken["a"]) == [(0, 2), (0, 3), (1, 7)]
    assert registry.count("a") == 3, "0, 1 and the other topic's stay"
    registry.postpone("a", registry.due("a", 10, 10, False), 5000)
    assert registry.next_due("a", False) == 5000


def test_a_killed_jobs_directory_is_deleted_by_the_next_registry_and_a_running_ones_kept(tmp_path):
    """kill -9 leaves a registry's directory (its parked bodies) behind: the next registry in the same place
    deletes those no process holds any more, never one still open (this process's, or another's)."""
    import subprocess
    import sys

    script = ("import sys; from herald.engine.triggers.parked import ParkedRegistry; r = ParkedRegistry(sys.argv[1]);"
              " print(r._directory, flush=True); sys.stdin.read()")
    killed = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    killed_dir = killed.stdout.readline().strip()
    alive = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    alive_dir = alive.stdout.readline().strip()
    killed.kill()
    killed.wait()
    (tmp_path / "herald-parked-not-ours").mkdir()  # no lock file: left alone
    try:
        running = ParkedRegistry(str(tmp_path))
        ParkedRegistry(str(tmp_path)).close()
        assert not os.path.exists(killed_dir), "the killed job's parked bodies are deleted"
        assert os.path.isdir(alive_dir) and os.path.isdir(running._directory), "open registries keep theirs"
        assert (tmp_path / "herald-parked-not-ours").exists()
        running.close()
    finally:
        alive.stdin.close()
        alive.wait(10)
