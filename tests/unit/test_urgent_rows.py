"""Which rounds the table writer writes within `storage.urgentCommitMs` instead of the commit interval: those with
rows an operator looks for soon after the event (a discard, a loss, a message parked for the first time), and
`steps.record` says so when it hands them over."""

from __future__ import annotations

import types

import pytest

from herald.config.model import Subscription
from herald.delivery.message import Record, RetryState
from herald.delivery.report import Parked
from herald.engine.round import steps
from herald.engine.round.result import CATCHUP, RETRY, STREAM, RoundResult, SubscriptionOutcome, stub, urgent
from herald.storage.tables import DELIVERED, DISCARDED
from tests.unit.test_dead_letters import discarded

SUBSCRIPTION = Subscription(topicName="g.t", name="s", endpoint="http://127.0.0.1:9/")


def _parked(offset: int) -> Parked:
    return Parked(Record(partition=0, offset=offset, timestamp_ms=0, message_id=f"m{offset}", body=b"{}"),
                  RetryState(attempts=3, first_read_ms=0, due_ms=500))


def _round(kind: str, **outcome) -> RoundResult:
    routine = SubscriptionOutcome(SUBSCRIPTION, positions={0: 10})
    return RoundResult(kind, f"{kind}:q", 7, "g_t", "c", [routine, SubscriptionOutcome(SUBSCRIPTION, **outcome)])


@pytest.mark.parametrize("kind, outcome, expected", [
    (STREAM, {}, False),  # positions and metrics only
    (STREAM, {"discarded": [discarded(5)]}, True),
    (RETRY, {"discarded": [discarded(5)]}, True),
    (CATCHUP, {"lost": [(0, 0, 4)]}, True),
    (STREAM, {"parked": [_parked(5)]}, True),  # its first PARKED row
    (CATCHUP, {"parked": [_parked(5)]}, True),
    (RETRY, {"parked": [_parked(5)]}, False),  # parked again: its PARKED row is in the table already
    (RETRY, {"resolved": {(0, 5): (stub(0, 5), DELIVERED)}}, False),
    (STREAM, {"resolved": {(0, 5): (stub(0, 5), DISCARDED)}}, True),
])
def test_discards_losses_and_first_parkings_are_urgent_routine_rows_and_parking_again_are_not(kind, outcome,
                                                                                              expected):
    assert urgent(_round(kind, **outcome)) is expected


def test_record_hands_a_round_over_urgent_when_it_has_a_discard():
    handed: list[bool] = []

    class Writer:
        def submit(self, part, tables, hurry=False, new=False, urgent=False):
            handed.append(urgent)
            return True

    context = types.SimpleNamespace(writer=Writer(), recorded=lambda result, duration_s: None)
    steps.record(context, _round(STREAM), 0.1, 1_800_000_000_000)
    steps.record(context, _round(STREAM, discarded=[discarded(5)]), 0.1, 1_800_000_000_000)
    assert handed == [False, True]
