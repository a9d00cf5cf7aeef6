"""Backoff, jitter, TTL and max-attempts arithmetic (no Spark, no sleeping)."""

import random

import pytest

from herald.delivery.outcome import classify
from herald.delivery.policy import EndedBy, GiveUp, Retry, RetryPolicy
from tests.support.delivery import retry_policy

FAIL = classify(500)


def backoff_sequence(policy: RetryPolicy, n: int) -> list[float]:
    delays, previous = [], None
    for _ in range(n):
        previous = policy.next_backoff(previous)
        delays.append(previous)
    return delays


def test_constant_backoff():
    assert backoff_sequence(retry_policy(backoff_s=0.1), 4) == [0.1, 0.1, 0.1, 0.1]


def test_exponential_backoff_is_capped():
    policy = retry_policy(backoff_s=1, backoff_multiplier=3, max_backoff_s=10)
    assert backoff_sequence(policy, 5) == [1, 3, 9, 10, 10]


def test_first_backoff_never_exceeds_the_maximum():
    assert retry_policy(backoff_s=20, max_backoff_s=5).next_backoff(None) == 5


def test_jitter_stays_within_bounds_and_varies():
    policy = retry_policy(backoff_jitter=0.2)
    rng = random.Random(7)
    draws = [policy.jittered(10.0, rng) for _ in range(2000)]
    assert min(draws) >= 8.0 and max(draws) <= 12.0
    assert max(draws) - min(draws) > 3.0  # actually spread, not constant
    assert retry_policy().jittered(10.0, rng) == 10.0


def test_retry_is_scheduled_after_the_backoff():
    policy = retry_policy(backoff_s=0.5, backoff_multiplier=2)
    step = policy.after_failure(FAIL, attempts=1, first_read_at=0, previous_backoff_s=None, now=10)
    assert step == Retry(due_at=10.5, backoff_s=0.5)
    step = policy.after_failure(FAIL, attempts=2, first_read_at=0, previous_backoff_s=0.5, now=11)
    assert step == Retry(due_at=12.0, backoff_s=1.0)


def test_retry_after_replaces_the_backoff_and_keeps_the_sequence():
    outcome = classify(503, "3")
    step = retry_policy(backoff_s=0.1).after_failure(outcome, 1, 0, previous_backoff_s=0.4, now=1)
    assert step == Retry(due_at=4.0, backoff_s=0.4)


def test_ttl_counts_from_first_read_and_gives_up_when_the_next_attempt_would_be_late():
    policy = retry_policy(message_ttl_s=10, backoff_s=2)
    assert isinstance(policy.after_failure(FAIL, 1, first_read_at=100, previous_backoff_s=None, now=108), Retry)
    step = policy.after_failure(FAIL, 1, first_read_at=100, previous_backoff_s=None, now=108.5)
    assert step == GiveUp("Message sending failed with status code:500", EndedBy.TTL)


def test_retry_after_beyond_ttl_discards_at_once():
    step = retry_policy(message_ttl_s=5).after_failure(classify(503, "60"), 1, 0, None, now=1)
    assert step == GiveUp("Message sending failed with status code:503", EndedBy.TTL)


def test_a_zero_ttl_gives_up_after_the_first_attempt():
    step = retry_policy(message_ttl_s=0, backoff_s=0.001).after_failure(FAIL, 1, first_read_at=0,
                                                                         previous_backoff_s=None,
                                                                      now=0)
    assert step == GiveUp("Message sending failed with status code:500", EndedBy.TTL)


def test_max_attempts_ends_it():
    policy = retry_policy(max_attempts=3)
    assert isinstance(policy.after_failure(FAIL, 2, 0, None, now=0), Retry)
    step = policy.after_failure(FAIL, 3, 0, None, now=0)
    assert step == GiveUp("Message sending failed with status code:500", EndedBy.MAX_ATTEMPTS)


def test_non_retryable_answer_gives_up_with_its_reason():
    assert retry_policy().after_failure(classify(400), 1, 0, None, 0) == GiveUp(
        "Message sending failed with status code:400", EndedBy.STATUS)


@pytest.mark.parametrize("ttl, backoff, expected_attempts", [(1.0, 0.1, 11), (1.0, 0.25, 5)])
def test_hermes_rough_retry_count_formula(ttl, backoff, expected_attempts):
    """retries ~= ttl / backoff for constant backoff (seeds/000): attempts at 0, b, 2b, ... <= ttl."""
    policy, now, attempts, previous = retry_policy(message_ttl_s=ttl, backoff_s=backoff), 0.0, 1, None
    while isinstance(step := policy.after_failure(FAIL, attempts, 0.0, previous, now), Retry):
        now, previous, attempts = step.due_at, step.backoff_s, attempts + 1
    assert attempts == expected_attempts
