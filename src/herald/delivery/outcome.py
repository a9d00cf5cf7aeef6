"""Classification of one delivery attempt: delivered, retry or discard, and whether it slows the flow.

This is docs/design.md §4's back-pressure table, in one tested place:

| answer                                                      | retried               | slows the flow |
|-------------------------------------------------------------|-----------------------|----------------|
| 2xx                                                         | no, delivered         | no             |
| 3xx (never followed), 5xx except 503, timeout, conn. or TLS error | yes           | yes            |
| 503 without Retry-After                                     | yes                   | yes            |
| 503 with Retry-After                                        | yes, after that delay | no             |
| 429, retryClientErrors=false                                | no, discarded         | yes            |
| 429, retryClientErrors=true, no Retry-After                 | yes                   | yes            |
| 429, retryClientErrors=true, Retry-After                    | yes, after that delay | no             |
| other 4xx, retryClientErrors=false                          | no, discarded         | no             |
| other 4xx, retryClientErrors=true                           | yes                   | yes            |
| 401 on a subscription with an OAuth policy                  | yes                   | yes            |

Retry-After is read on 503 and 429 only, as integer seconds or an HTTP-date.
"""

from __future__ import annotations

import email.utils
import enum
import time
from dataclasses import dataclass


class Verdict(enum.Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    DISCARD = "discard"


class Category(enum.Enum):
    """What an attempt ended in, for the metrics counters."""

    CODE_2XX = "codes_2xx"
    CODE_3XX = "codes_3xx"
    CODE_4XX = "codes_4xx"
    CODE_5XX = "codes_5xx"
    TIMEOUT = "timeouts"
    OTHER_ERROR = "other_errors"


class FailureKind(enum.Enum):
    """Transport failures, translated from the HTTP client's exceptions at one boundary."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"
    TLS = "tls"  # the handshake failed: a certificate that does not verify, a client certificate refused, ...


@dataclass(frozen=True)
class TransportFailure:
    kind: FailureKind
    detail: str


@dataclass(frozen=True)
class Outcome:
    """The classified result of one attempt.

    retry_after_s: the subscriber's Retry-After in seconds when it is honoured (the backoff formula is skipped).
    slows: counts as a failure for the adaptive rate controller.
    """

    verdict: Verdict
    slows: bool
    category: Category
    reason: str
    status: int | None = None
    retry_after_s: float | None = None

    @property
    def retry(self) -> bool:
        return self.verdict is Verdict.RETRY


def parse_retry_after(value: str | None, now_epoch_s: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After value: integer seconds or an HTTP-date; None when absent or invalid."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    now = time.time() if now_epoch_s is None else now_epoch_s
    return max(0.0, when.timestamp() - now)


def status_reason(status: int) -> str:
    """Hermes' reason text for an answer that failed (no space after the colon, as Hermes writes it)."""
    return f"Message sending failed with status code:{status}"


def classify(
    status: int | None = None,
    retry_after: str | None = None,
    failure: TransportFailure | None = None,
    *,
    retry_client_errors: bool = False,
    oauth: bool = False,
    now_epoch_s: float | None = None,
) -> Outcome:
    """Classify an HTTP answer (`status`, its Retry-After header) or a transport `failure`."""
    if failure is not None:
        category = Category.TIMEOUT if failure.kind is FailureKind.TIMEOUT else Category.OTHER_ERROR
        return Outcome(Verdict.RETRY, slows=True, category=category, reason=failure.detail)
    if status is None:
        raise ValueError("classify needs a status or a transport failure")
    reason = status_reason(status)
    if 200 <= status < 300:
        return Outcome(Verdict.DELIVERED, slows=False, category=Category.CODE_2XX, reason="", status=status)
    if 400 <= status < 500:
        return _client_error(status, retry_after, reason, retry_client_errors, oauth, now_epoch_s)
    category = Category.CODE_3XX if 300 <= status < 400 else Category.CODE_5XX
    if status == 503:
        delay_s = parse_retry_after(retry_after, now_epoch_s)
        if delay_s is not None:
            return Outcome(Verdict.RETRY, slows=False, category=category, reason=reason, status=status,
                           retry_after_s=delay_s)
    return Outcome(Verdict.RETRY, slows=True, category=category, reason=reason, status=status)


def _client_error(
    status: int, retry_after: str | None, reason: str, retry_client_errors: bool, oauth: bool, now_epoch_s: float | None
) -> Outcome:
    category = Category.CODE_4XX
    if status == 401 and oauth:
        return Outcome(Verdict.RETRY, slows=True, category=category, reason=reason, status=status)
    if status == 429:
        if not retry_client_errors:
            return Outcome(Verdict.DISCARD, slows=True, category=category, reason=reason, status=status)
        delay_s = parse_retry_after(retry_after, now_epoch_s)
        if delay_s is not None:
            return Outcome(Verdict.RETRY, slows=False, category=category, reason=reason, status=status,
                           retry_after_s=delay_s)
        return Outcome(Verdict.RETRY, slows=True, category=category, reason=reason, status=status)
    if retry_client_errors:
        return Outcome(Verdict.RETRY, slows=True, category=category, reason=reason, status=status)
    return Outcome(Verdict.DISCARD, slows=False, category=category, reason=reason, status=status)
