"""Retransmission dates, as `herald retransmit --date` reads them."""

from __future__ import annotations

import datetime as dt

import pytest

from herald.cli.parser import join_relative_dates
from herald.engine.upkeep.moves import MoveError, parse_date

NOW = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("text, expected", [
    ("-30m", NOW - dt.timedelta(minutes=30)),
    ("-6h", NOW - dt.timedelta(hours=6)),
    ("-2d", NOW - dt.timedelta(days=2)),
    ("2026-11-24T10:00:00", dt.datetime(2026, 11, 24, 10, tzinfo=dt.timezone.utc)),  # no offset: UTC
    ("2026-11-24T10:00:00Z", dt.datetime(2026, 11, 24, 10, tzinfo=dt.timezone.utc)),
    ("2026-11-24T11:00:00+01:00", dt.datetime(2026, 11, 24, 10, tzinfo=dt.timezone.utc)),
    ("2026-11-24", dt.datetime(2026, 11, 24, tzinfo=dt.timezone.utc)),
])
def test_dates(text, expected):
    assert parse_date(text, NOW) == expected


@pytest.mark.parametrize("text, message", [
    ("yesterday", "neither an ISO-8601"),
    ("-6w", "neither an ISO-8601"),
    ("2026-11-24T13:00:00", "in the future"),
])
def test_dates_that_make_no_sense(text, message):
    with pytest.raises(MoveError, match=message):
        parse_date(text, NOW)


def test_a_relative_date_after_date_is_its_value_not_an_option():
    assert join_relative_dates(["retransmit", "x.y.z", "--date", "-6h", "--json"]) == \
        ["retransmit", "x.y.z", "--date=-6h", "--json"]
    assert join_relative_dates(["--date", "2026-11-24"]) == ["--date", "2026-11-24"]
