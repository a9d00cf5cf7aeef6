"""Moving a subscription's position: retransmission (Hermes' "Retransmission") and its record.

A position is the newest `offsets` row of a (subscription, topic, partition), so moving one is writing rows:
first the record in the `retransmissions` table (who, when, from which offsets to which), then offsets rows
under the writer `move:<subscription>` whose batch_id is the move's id. A job that is not running starts from
there; a suspended subscription is delivered from there on activation; a running job sees the record
(`MoveWatcher`, every `streaming.configPollMs`) and moves the subscription in memory between two of its
rounds, writing the rows again so that they stay the newest. Messages from the new position on are read and
delivered again as new: `Hermes-Retry-Count` from 0, their original `Hermes-Message-Id`, filters applied.
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
from herald.storage.tables import OFFSETS, OFFSETS_SCHEMA, RETRANSMISSIONS, RETRANSMISSIONS_SCHEMA, epoch_ms

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


def record_move(store: TableStore, move: Move) -> None:
    """Write the move: its record first, then the positions (so a crash between them moves nothing)."""
    now = dt.datetime.now(dt.timezone.utc)
    record = [{"subscription": move.subscription, "topic": move.kafka_topic, "partition": partition,
               "from_offset": move.from_offsets.get(partition), "to_offset": offset, "requested_date": move.date,
               "requested_by": move.requested_by, "recorded_at": now, "batch_id": move.move_id,
               "writer": move.writer} for partition, offset in sorted(move.to_offsets.items())]
    part = Slice(move.writer, move.move_id)
    store.replace(RETRANSMISSIONS, pa.Table.from_pylist(record, schema=RETRANSMISSIONS_SCHEMA), part)
    write_positions(store, move)


def position_rows(move: Move) -> pa.Table:
    """The move's offsets rows, stamped now (so they are the newest rows of the subscription)."""
    now = dt.datetime.now(dt.timezone.utc)
    rows = [{"subscription": move.subscription, "topic": move.kafka_topic, "partition": partition, "offset": offset,
             "batch_id": move.move_id, "committed_at": now, "writer": move.writer}
            for partition, offset in sorted(move.to_offsets.items())]
    return pa.Table.from_pylist(rows, schema=OFFSETS_SCHEMA)


def write_positions(store: TableStore, move: Move) -> None:
    store.replace(OFFSETS, position_rows(move), Slice(move.writer, move.move_id))


def moves_since(store: TableStore, after_ms: int) -> list[Move]:
    """Moves recorded after `after_ms` (epoch ms), oldest first."""
    rows = store.sql(RETRANSMISSIONS, f"SELECT * FROM {RETRANSMISSIONS} WHERE batch_id > {int(after_ms)}")
    grouped: dict[tuple[str, int], list[dict]] = {}
    for row in rows.to_pylist():
        grouped.setdefault((row["subscription"], row["batch_id"]), []).append(row)
    moves = [Move(sid, group[0]["topic"], {r["partition"]: r["from_offset"] for r in group
                                           if r["from_offset"] is not None},
                  {r["partition"]: r["to_offset"] for r in group}, group[0]["requested_date"], move_id,
                  group[0]["requested_by"] or "") for (sid, move_id), group in grouped.items()]
    return sorted(moves, key=lambda move: move.move_id)


class MoveWatcher:
    """In a running job: every `poll_s`, hands moves recorded since it started to `apply(move)`."""

    def __init__(self, store: TableStore, apply, poll_s: float, since_ms: int) -> None:
        self.store = store
        self.apply = apply
        self.poll_s = poll_s
        self._seen_ms = since_ms
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
                for move in moves_since(self.store, self._seen_ms):
                    self.apply(move)
                    self._seen_ms = max(self._seen_ms, move.move_id)
            except Exception:  # noqa: BLE001 - the job goes on; the move is tried again at the next look
                log.exception("applying a retransmission failed; trying again in %.1f s", self.poll_s)
