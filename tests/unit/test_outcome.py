"""Every row of docs/design.md §4's classification table, plus Retry-After parsing."""

import email.utils

import pytest

from herald.delivery.outcome import (
    Category,
    FailureKind,
    TransportFailure,
    Verdict,
    classify,
    parse_retry_after,
)

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    "status, retry_after, retry_client_errors, oauth, verdict, slows, retry_after_s",
    [
        (200, None, False, False, Verdict.DELIVERED, False, None),
        (204, None, False, False, Verdict.DELIVERED, False, None),
        (301, None, False, False, Verdict.RETRY, True, None),
        (307, "5", False, False, Verdict.RETRY, True, None),  # Retry-After only counts on 503/429
        (500, None, False, False, Verdict.RETRY, True, None),
        (502, "5", False, False, Verdict.RETRY, True, None),
        (503, None, False, False, Verdict.RETRY, True, None),
        (503, "7", False, False, Verdict.RETRY, False, 7.0),
        (503, "soon", False, False, Verdict.RETRY, True, None),  # unparseable: as if absent
        (429, None, False, False, Verdict.DISCARD, True, None),
        (429, "3", False, False, Verdict.DISCARD, True, None),
        (429, None, True, False, Verdict.RETRY, True, None),
        (429, "3", True, False, Verdict.RETRY, False, 3.0),
        (400, None, False, False, Verdict.DISCARD, False, None),
        (404, None, False, False, Verdict.DISCARD, False, None),
        (400, None, True, False, Verdict.RETRY, True, None),
        (401, None, False, False, Verdict.DISCARD, False, None),
        (401, None, False, True, Verdict.RETRY, True, None),
    ],
)
def test_status_classification(status, retry_after, retry_client_errors, oauth, verdict, slows, retry_after_s):
    outcome = classify(status, retry_after, retry_client_errors=retry_client_errors, oauth=oauth, now_epoch_s=NOW)
    assert (outcome.verdict, outcome.slows, outcome.retry_after_s) == (verdict, slows, retry_after_s)
    assert outcome.status == status


def test_discard_reason_names_the_status():
    assert classify(400).reason == "Message sending failed with status code:400"  # as Hermes writes it


@pytest.mark.parametrize("kind, category", [(FailureKind.TIMEOUT, Category.TIMEOUT),
                                            (FailureKind.CONNECTION, Category.OTHER_ERROR)])
def test_transport_failures_are_retried_and_slow_the_flow(kind, category):
    outcome = classify(failure=TransportFailure(kind, "boom"))
    assert (outcome.verdict, outcome.slows, outcome.category, outcome.reason) == (Verdict.RETRY, True, category, "boom")


def test_status_categories_feed_the_right_counters():
    assert [classify(code).category for code in (200, 302, 404, 500)] == [
        Category.CODE_2XX, Category.CODE_3XX, Category.CODE_4XX, Category.CODE_5XX]


def test_retry_after_as_seconds_and_http_date():
    assert parse_retry_after("120", NOW) == 120.0
    in_ten_seconds = email.utils.formatdate(NOW + 10, usegmt=True)
    assert parse_retry_after(in_ten_seconds, NOW) == pytest.approx(10.0)
    past = email.utils.formatdate(NOW - 10, usegmt=True)
    assert parse_retry_after(past, NOW) == 0.0


@pytest.mark.parametrize("value", [None, "", "-5", "1.5", "tomorrow", "Wed, 99 Foo 2024"])
def test_invalid_retry_after_is_ignored(value):
    assert parse_retry_after(value, NOW) is None


def test_503_with_http_date_retry_after():
    when = email.utils.formatdate(NOW + 4, usegmt=True)
    outcome = classify(503, when, now_epoch_s=NOW)
    assert outcome.retry_after_s == pytest.approx(4.0) and not outcome.slows
