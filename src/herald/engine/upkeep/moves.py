"""Moving a subscription's position: retransmission (Hermes' "Retransmission") and its record.

A position is the newest `offsets` row of a (subscription, topic, partition), so moving one is writing rows:
first the record in the `retransmissions` table (who, when, from which offsets to which), then offsets rows
under the writer `move:<subscription>` whose batch_id is the move's id. A move is applied by the job, exactly
once, whenever it next runs: a running job sees the record (`MoveWatcher`, every `streaming.configPollMs`) and
moves the subscription in memory between two of its rounds; a job starting applies every move not applied yet
(one recorded while no job ran, or while a job was stopping: its last rounds' positions would otherwise pass
over the move's). Either way the job writes the move's positions again, so that they are the newest, then marks
the record `applied_at`. A suspended subscription is delivered from there on activation. Messages from the new
position on are read and delivered again as new: `Hermes-Retry-Count` from 0, their original
`Hermes-Message-Id`, filters applied.
"""

from __future__ import annotations

import datetime as dt
import getpass
import logging
import re
import threading
from dataclasses import dataclass

import pyarrow as pa

from herald.source.kafka_offsets import OffsetClient
from herald.storage import Slice, TableStore
from herald.storage.tables import (
    OFFSETS,
    OFFSETS_SCHEMA,
    RETRANSMISSIONS,
    RETRANSMISSIONS_SCHEMA,
    RETRIES,
    at_ms,
    epoch_ms,
)

log = logging.getLogger(__name__)

_RELATIVE = re.compile(r"^-(\d+)([mhd])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


class MoveError(ValueError):
    """A retransmission that makes no sense (a bad date, a date in the future); the message says why."""


def parse_date(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """An ISO-8601 date-time (UTC when it has no offset) or a relative `-6h` / `-30m` / `-2d`; never later
    than `now`."""
    now = now or dt.datetime.now(dt.timezone.utc)
    relative = _RELATIVE.match(text.strip())
    if relative:
        date = now - dt.timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    else:
        try:
            date = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise MoveError(f"--date {text!r} is neither an ISO-8601 date-time (2026-11-24T10:00:00, with or "
                            "without an offset) nor a relative -30m, -6h or -2d") from None
        if date.tzinfo is None:
            date = date.replace(tzinfo=dt.timezone.utc)
    if date > now:
        raise MoveError(f"--date {date.isoformat()} is in the future: there is nothing to retransmit from there")
    return date


@dataclass(frozen=True)
class Move:
    """A subscription's position moved to `to_offsets` (partition -> offset) from `from_offsets`."""

    subscription: str
    kafka_topic: str
    from_offsets: dict[int, int]
    to_offsets: dict[int, int]
    date: dt.datetime
    move_id: int  # epoch ms when it was asked
    requested_by: str = ""
    recorded_at: dt.datetime | None = None

    @property
    def writer(self) -> str:
        return f"move:{self.subscription}"


def plan_move(client_config: dict, subscription: str, kafka_topic: str, current: dict[int, int],
              date: dt.datetime) -> Move:
    """The move of `subscription` (now at `current`) to the first messages published at or after `date`."""
    with OffsetClient(client_config) as client:
        targets = client.offsets_for_time(kafka_topic, epoch_ms(date))
    now = dt.datetime.now(dt.timezone.utc)
    return Move(subscription, kafka_topic, dict(current), targets, date, epoch_ms(now), getpass.getuser())


def retransmit(store: TableStore, client_config: dict, subscription: str, kafka_topic: str, date: dt.datetime,
               dry_run: bool = False) -> tuple[dict[int, int], Move]:
    """`herald retransmit`: plan the move of `subscription` in `kafka_topic` to the first messages published at or
    after `date` from its stored positions and, unless `dry_run`, record it (a running job applies it within
    `configPollMs`). Returns (the positions it had, the move). Raises KafkaOffsetsError when Kafka cannot say."""
    from herald.engine.round.state import stored_positions

    current = stored_positions(store).get((subscription, kafka_topic), {})
    move = plan_move(client_config, subscription, kafka_topic, current, date)
    if not dry_run:
        record_move(store, move)
    return current, move


def record_move(store: TableStore, move: Move) -> None:
    """Write the move: its record first, then the positions (so a crash between them moves nothing)."""
    store.replace(RETRANSMISSIONS, record_rows(move, None), Slice(move.writer, move.move_id))
    write_positions(store, move)


def record_rows(move: Move, applied_at: dt.datetime | None) -> pa.Table:
    """The move's rows of the retransmissions table (`applied_at`: when a job applied it, or None)."""
    recorded_at = move.recorded_at or dt.datetime.now(dt.timezone.utc)
    rows = [{"subscription": move.subscription, "topic": move.kafka_topic, "partition": partition,
             "from_offset": move.from_offsets.get(partition), "to_offset": offset, "requested_date": move.date,
             "requested_by": move.requested_by, "recorded_at": recorded_at, "batch_id": move.move_id,
             "writer": move.writer, "applied_at": applied_at} for partition, offset in sorted(move.to_offsets.items())]
    return pa.Table.from_pylist(rows, schema=RETRANSMISSIONS_SCHEMA)


def applied_tables(move: Move, released: pa.Table, stamp_ms: int) -> list[tuple[str, pa.Table]]:
    """What a job writes once it applied `move`: the RELEASED rows of the carried states it dropped (`released`,
    retries rows), its positions again (the newest rows of the subscription, stamped `stamp_ms` as the job
    stamps its rounds' rows: `herald.engine.context.stamp_ms`), then its record marked applied. Written in that
    order, under the move's slice: a crash before the last applies it again at the next start,
    never not at all."""
    return [(RETRIES, released), (OFFSETS, position_rows(move, stamp_ms)),
            (RETRANSMISSIONS, record_rows(move, dt.datetime.now(dt.timezone.utc)))]


def position_rows(move: Move, stamp_ms: int | None = None) -> pa.Table:
    """The move's offsets rows, stamped now (so they are the newest rows of the subscription); a job stamps them
    as it stamps its rounds' rows (`stamp_ms`, epoch ms), so that they order with those."""
    now = at_ms(stamp_ms) if stamp_ms is not None else dt.datetime.now(dt.timezone.utc)
    rows = [{"subscription": move.subscription, "topic": move.kafka_topic, "partition": partition, "offset": offset,
             "batch_id": move.move_id, "committed_at": now, "writer": move.writer}
            for partition, offset in sorted(move.to_offsets.items())]
    return pa.Table.from_pylist(rows, schema=OFFSETS_SCHEMA)


def write_positions(store: TableStore, move: Move) -> None:
    store.replace(OFFSETS, position_rows(move), Slice(move.writer, move.move_id))


def unapplied_moves(store: TableStore) -> list[Move]:
    """Moves no job has applied yet, oldest first."""
    rows = store.sql(RETRANSMISSIONS, f"SELECT * FROM {RETRANSMISSIONS} WHERE applied_at IS NULL")
    grouped: dict[tuple[str, int], list[dict]] = {}
    for row in rows.to_pylist():
        grouped.setdefault((row["subscription"], row["batch_id"]), []).append(row)
    moves = [Move(sid, group[0]["topic"], {r["partition"]: r["from_offset"] for r in group
                                           if r["from_offset"] is not None},
                  {r["partition"]: r["to_offset"] for r in group}, group[0]["requested_date"], move_id,
                  group[0]["requested_by"] or "", group[0]["recorded_at"]) for (sid, move_id), group in grouped.items()]
    return sorted(moves, key=lambda move: move.move_id)


class MoveWatcher:
    """In a running job: every `poll_s`, hands each move not applied yet to `apply(move)`, once (its record is
    marked applied through the table writer, after the move's positions)."""

    def __init__(self, store: TableStore, apply, poll_s: float, handed: set[tuple[str, int]] | None = None) -> None:
        self.store = store
        self.apply = apply
        self.poll_s = poll_s
        self._handed: set[tuple[str, int]] = set(handed or ())  # (subscription, move id) applied by this job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="herald-move-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                for move in unapplied_moves(self.store):
                    if (move.subscription, move.move_id) not in self._handed and self.apply(move):
                        self._handed.add((move.subscription, move.move_id))
            except Exception:  # noqa: BLE001 - the job goes on; the move is tried again at the next look
                log.exception("applying a retransmission failed; trying again in %.1f s", self.poll_s)
