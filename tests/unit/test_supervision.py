"""When a failed topic query is started again, and when --once gives it up (pure, on a fake clock)."""

from __future__ import annotations

from herald.engine.triggers.supervision import QuerySupervisor, short_error
from tests.support.clock import FakeClock


def test_restarts_back_off_1_2_4_up_to_60_s_and_start_again_from_1_s_after_a_recovery():
    clock = FakeClock()
    supervisor = QuerySupervisor(once=False, clock=clock)
    delays = []
    for _ in range(9):
        failure = supervisor.failed("t", "boom")
        delays.append(failure.retry_at - clock.now)
        assert not supervisor.due("t")
        clock.now = failure.retry_at
        assert supervisor.due("t")
        supervisor.restarted("t")
        assert supervisor.failing("t") is None
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    supervisor.recovered("t")
    assert supervisor.failed("t", "again").retry_at - clock.now == 1
    assert not supervisor.given_up(), "a running job never gives a topic up"


def test_once_gives_a_topic_up_after_three_failed_restarts_and_30_s_of_failing_and_names_it():
    """Failures at 0, 1, 3, 7, 15 and 31 s (backoff 1, 2, 4, 8, 16 s): the fourth is past ONCE_RESTARTS, but a
    topic is given up only once it has been failing for ONCE_PATIENCE_S (30 s): at the sixth."""
    clock = FakeClock()
    supervisor = QuerySupervisor(once=True, clock=clock)
    started = clock.now
    for attempt in range(1, 7):
        failure = supervisor.failed("orders", f"UnknownTopicError: attempt {attempt}")
        if attempt < 6:
            assert not failure.given_up, attempt
            clock.now = failure.retry_at
            assert supervisor.due("orders")
            supervisor.restarted("orders")
    assert clock.now - started == 31
    assert failure.given_up and not supervisor.due("orders")
    assert supervisor.given_up() == {"orders": "UnknownTopicError: attempt 6"}
    assert supervisor.not_running() == supervisor.given_up()
    supervisor.forget("orders")
    assert supervisor.given_up() == {}


def test_the_reason_is_the_root_cause_with_secrets_masked():
    error = RuntimeError("StreamingQueryException: query failed\n  at x\n"
                         "org.apache.kafka.common.errors.SaslAuthenticationException: bad login for "
                         "http://user:hunter2@broker:9092")
    text = short_error(error)
    assert text.startswith("org.apache.kafka.common.errors.SaslAuthenticationException")
    assert "hunter2" not in text
