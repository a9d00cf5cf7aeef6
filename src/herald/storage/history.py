"""History retention: the rows that only record what happened are deleted once they are older than a retention;
the rows that say where things stand never are (docs/design.md §9).

Every round adds rows: a metrics row per subscription, tracking rows, a retries row per message it parked or
ended, and an offsets row per position it moved (a busy topic: subscriptions x partitions a round). Maintenance
(`maintenance.maintain_tables`) deletes, before it compacts a table:

- `offsets`: rows older than `storage.offsetsRetentionHours` (6) that are not the newest row of their
  (subscription, topic, partition): the newest is the position, however old. Nor, per topic, the rows of the
  newest micro-batch (highest batch_id) of the newest shared read (`stream:` writer) that wrote there: a restart
  whose checkpoint did not commit that batch asks them whether it was recorded (`TopicPipeline._recorded_before`),
  and without them it would record the batch again as an empty round, replacing its undelivered and retries
  rows. One batch's rows a topic: nothing grows with the reads that came before.
- `retries`: rows older than `storage.historyRetentionHours` (168) that are not the newest row of their
  (subscription, partition, offset) while that row is PARKED or HELD (a parked message, or a state a position
  stops at); a message whose newest row ended it (DELIVERED, DISCARDED, RELEASED) that long ago goes whole.
- `metrics` (by finished_at, else started_at; a row with neither stays) and `tracking` (by timestamp): rows older
  than `storage.historyRetentionHours`.

`undelivered` (the record of what was not delivered), `leases` and `advisories` (which the lease and the
priority groups read: `lease.forget_ended` has its own rule), `retransmissions` and `endpoints` keep every row.

What is deleted is named key by key, from what one read of the table found: only a row older than its key's
newest row, or older than the retention while its key's newest row is younger (or ended its message), ever
matches; a row written after that read, of a key it did not find, never does. "Older than" counts from the
newest row of the table when the pass's clock is later (a host whose clock is days ahead must not age a table),
and the retention is at least an hour in a running job (storage settings), so a row the job's table writer still
holds (it writes within storage.commitIntervalMs) is always younger than it. The rows deleted stay readable by
time travel for `storage.maintenanceRetentionHours`, until vacuum deletes their files.

Predicates are bounded (`MAX_TERMS`, `MAX_VALUES`): delta-rs parses one recursively, and a few thousand OR
terms overflowed its stack (a crash, not an error); more keys take more deletes.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from herald.storage.reads import sql_string
from herald.storage.store import TableStore
from herald.storage.tables import HELD, METRICS, OFFSETS, PARKED, RETRIES, TRACKING

log = logging.getLogger(__name__)

DEFAULT_OFFSETS_RETENTION_HOURS = 6.0
"""storage.offsetsRetentionHours' default: a maintenance interval's worth of positions that were passed."""
DEFAULT_HISTORY_RETENTION_HOURS = 168.0
"""storage.historyRetentionHours' default: a week of metrics, tracking and ended retries."""
MAX_TERMS = 200
"""Most OR terms of one delete's predicate."""
MAX_VALUES = 20_000
"""Most values of the IN lists of one delete's predicate (one list holds at most 1,000)."""
_LIST_VALUES = 1_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class HistoryRetention:
    """Hours each kind of history is kept (None: for ever): `offsets_hours` the positions a subscription's
    partitions were at before (storage.offsetsRetentionHours), `history_hours` metrics, tracking and retries rows
    (storage.historyRetentionHours)."""

    offsets_hours: float | None = DEFAULT_OFFSETS_RETENTION_HOURS
    history_hours: float | None = DEFAULT_HISTORY_RETENTION_HOURS

    def hours(self, table: str) -> float | None:
        """The retention of `table`'s history; None when it keeps every row (or its rows are not history)."""
        if table == OFFSETS:
            return self.offsets_hours
        return self.history_hours if table in (RETRIES, METRICS, TRACKING) else None


def prune(store: TableStore, table: str, retention: HistoryRetention, now_ms: int | None = None) -> int | None:
    """Delete `table`'s history older than its retention (see the module's docstring); the number of rows deleted,
    None when the table keeps every row. now_ms: the pass's clock (epoch ms; default: now)."""
    hours = retention.hours(table)
    if hours is None:
        return None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if table == OFFSETS:
        return _prune_keyed(store, OFFSETS, ("subscription", "topic", "partition"), "committed_at", hours, now_ms,
                            keep=_newest_micro_batches(store))
    if table == RETRIES:
        return _prune_keyed(store, RETRIES, ("subscription", "partition", "offset"), "recorded_at", hours, now_ms,
                            live=(PARKED, HELD))
    moment = "coalesce(finished_at, started_at)" if table == METRICS else store.quote("timestamp")
    cutoff = _cutoff_us(store, table, moment, hours, now_ms)
    if cutoff is None:
        return 0
    return store.delete(table, f"{moment} < {_at(cutoff)}")


def _cutoff_us(store: TableStore, table: str, moment: str, hours: float, now_ms: int) -> int | None:
    """The instant (epoch µs) before which `table`'s rows are older than `hours`: counted from `now_ms`, or from
    the table's newest `moment` when that is earlier. None: the table has no row."""
    found = store.select(table, f"SELECT max({moment}) AS newest FROM {table}")
    newest = _micros(found.column("newest"))[0] if found.num_rows else None
    if newest is None:
        return None
    return min(now_ms * 1000, newest) - int(hours * 3_600_000_000)


def _newest_micro_batches(store: TableStore) -> dict[str, str]:
    """Kafka topic -> a condition naming the offsets rows of the newest micro-batch (highest batch_id) of the
    newest shared read (`stream:` writer) that wrote the topic's positions. Older reads' checkpoints are gone:
    their batches are never replayed, and their rows go as any other."""
    q = store.quote
    found = store.select(OFFSETS, (
        f"SELECT {q('topic')} AS topic, {q('writer')} AS writer, max({q('batch_id')}) AS batch_id, "
        f"max({q('committed_at')}) AS last FROM {OFFSETS} WHERE {q('writer')} LIKE 'stream:%' "
        f"GROUP BY {q('topic')}, {q('writer')}"))
    newest: dict[str, tuple[str, int, int]] = {}
    if found.num_rows:
        lasts = _micros(found.column("last"))
        for topic, writer, batch_id, last in zip(found.column("topic").to_pylist(), found.column("writer").to_pylist(),
                                                 found.column("batch_id").to_pylist(), lasts):
            if topic is not None and (topic not in newest or last > newest[topic][2]):
                newest[topic] = (writer, batch_id, last)
    return {topic: f"({q('writer')} = {sql_string(writer)} AND {q('batch_id')} = {int(batch_id)})"
            for topic, (writer, batch_id, _) in newest.items()}


def _prune_keyed(store: TableStore, table: str, keys: tuple[str, str, str], moment: str, hours: float, now_ms: int,
                 live: tuple[str, ...] = (), keep: dict[str, str] | None = None) -> int:
    """Delete the rows older than the cutoff whose key's newest row (by `moment`, then batch_id) is younger, or is
    not in a `live` state (`state` column), and, of the keys whose newest row is older and live (or any older
    newest row without `live`), the rows older than that row. `keep`: second key's value -> a condition naming rows of
    those keys that stay whatever their age. Returns the rows deleted."""
    cutoff = _cutoff_us(store, table, store.quote(moment), hours, now_ms)
    if cutoff is None:
        return 0
    q = store.quote
    key_sql = ", ".join(q(key) for key in keys)
    state = f", {q('state')}" if live else ""
    found = store.select(table, (
        f"SELECT {key_sql}{state}, {q(moment)} AS newest, oldest FROM (SELECT {key_sql}{state}, {q(moment)}, "
        f"row_number() OVER (PARTITION BY {key_sql} ORDER BY {q(moment)} DESC, {q('batch_id')} DESC) AS herald_rank, "
        f"min({q(moment)}) OVER (PARTITION BY {key_sql}) AS oldest FROM {table}) "
        f"WHERE herald_rank = 1 AND {q(moment)} IS NOT NULL AND oldest < {_at(cutoff)}"))
    if not found.num_rows:
        return 0
    newest, oldest = _micros(found.column("newest")), _micros(found.column("oldest"))
    states = found.column("state").to_pylist() if live else [None] * found.num_rows
    columns = [found.column(key).to_pylist() for key in keys]
    groups: dict[tuple, list] = {}  # (first key, second key, bound) -> last keys: rows of those keys below bound
    for row, (first, second, last) in enumerate(zip(*columns)):
        if first is None or second is None or last is None:
            continue
        keep_newest = newest[row] < cutoff and (not live or states[row] in live)
        bound = newest[row] if keep_newest else cutoff  # a newest row to keep, else the retention
        if oldest[row] < bound:
            groups.setdefault((first, second, bound), []).append(last)
    deleted = 0
    for predicate in predicates(store, keys, moment, groups, keep or {}):
        deleted += store.delete(table, predicate)
    return deleted


def predicates(store: TableStore, keys: tuple[str, str, str], moment: str, groups: dict[tuple, list],
               keep: dict | None = None) -> list[str]:
    """The delete predicates for `groups`: (first key value, second key value, bound in epoch µs) -> the values of
    the last key whose rows older than the bound go, except the rows `keep` names (second key value -> a
    condition). Each term names its keys exactly (no row of another key matches it), each predicate has at most
    `MAX_TERMS` terms and `MAX_VALUES` values."""
    q = store.quote
    terms: list[tuple[str, int]] = []
    for (first, second, bound), values in sorted(groups.items(), key=lambda item: (str(item[0][:2]), item[0][2])):
        for chunk in _chunks(sorted(set(values)), _LIST_VALUES):
            listed = ", ".join(_literal(value) for value in chunk)
            kept = f" AND NOT {keep[second]}" if keep and second in keep else ""
            terms.append((f"({q(keys[0])} = {_literal(first)} AND {q(keys[1])} = {_literal(second)} AND "
                          f"{q(keys[2])} IN ({listed}) AND {q(moment)} < {_at(bound)}{kept})", len(chunk)))
    result, current, values = [], [], 0
    for term, count in terms:
        if current and (len(current) >= MAX_TERMS or values + count > MAX_VALUES):
            result.append(" OR ".join(current))
            current, values = [], 0
        current.append(term)
        values += count
    if current:
        result.append(" OR ".join(current))
    return result


def _chunks(values: list, size: int) -> Iterable[list]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _literal(value) -> str:
    return sql_string(value) if isinstance(value, str) else str(int(value))


def _at(micros: int) -> str:
    """A timestamp literal both engines compare with a timestamp column exactly (to the microsecond, UTC)."""
    return sql_string((_EPOCH + dt.timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def _micros(column) -> list[int | None]:
    """Epoch microseconds of a timestamp column (whatever unit and zone the engine gave it)."""
    return column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
