"""Writing rounds to the tables on a thread of their own, in the order they were submitted.

Delivery does not wait for Delta commits: a round hands its slices over and goes on. Order is kept (a later
round's positions never land before an earlier one's), and each round's tables are written in the order
given, positions last, so a crash between two commits leaves positions behind, never ahead, of what the
undelivered and retries tables hold (at least once). A failing write is retried with a growing pause until
it succeeds or the writer is closed.

Rounds waiting when the writer gets to them are written together: one commit per table for all of them
(`Slices`), tables in one order for every round (`TABLE_ORDER`: positions after the records they depend on, a
retransmission's record after its positions). A slow store (delta-spark takes about a second a commit) then
costs a commit per table per batch of rounds, not per round. With `min_interval_s` (`storage.commitIntervalMs`)
the writer also waits that long after a write began before the next one, so that rounds gather: a job with a
round a second then commits to each table once a minute (the default), not every second (each commit is a file,
a log entry and, in every checkpoint until the retention ends, a tombstone). Positions are then written up to
that much later: a crash delivers that minute again (at least once), as Hermes' periodic offset commits (60 s)
do. A flush, a close, a stop or a queue half full writes at once. A round with rows an operator looks for soon
after the event (`submit(urgent=True)`: a discard, a loss, a message parked) ends the gathering at most
`urgent_interval_s` (`storage.urgentCommitMs`) after it was handed over, with everything queued before and
after it, in order.

The queue is bounded (`max_pending` rounds, `max_pending_bytes` of rows): while storage is down or slow,
`submit` waits, and so does the round that submits (delivery pauses, with a log line, rather than piling rounds
up in the driver's memory). While a write fails, the queue holds only `FAILING_PENDING_ROUNDS`: delivery waits
for storage within seconds, not after the thousands of rounds a gathering may hold.
When the writer gives a slice up (closed while storage still fails), it writes nothing after it: a later
round's positions would otherwise pass the messages the abandoned slice parked or discarded. Whatever was not
written is delivered again by the next run (at least once).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from herald.storage.store import Slice, Slices, TableStore
from herald.storage.tables import METRICS, OFFSETS, RETRANSMISSIONS, RETRIES, SCHEMAS, TRACKING, UNDELIVERED

log = logging.getLogger(__name__)

TABLE_ORDER = (UNDELIVERED, RETRIES, METRICS, TRACKING, OFFSETS, RETRANSMISSIONS)
"""The order of a round's tables when rounds are written together; a round that lists its tables in another
order is written on its own."""
_MAX_PAUSE_S = 30.0
MAX_PENDING_ROUNDS = 2048
"""Rounds handed to the writer and not yet written before `submit` makes the next one wait. A gathering ends at
half of it: at the default commit interval (a minute) a job can gather a round a second of 17 busy topics."""
URGENT_INTERVAL_S = 5.0
"""Seconds a gathering lasts at most after an urgent round (`submit(urgent=True)`) was handed over
(`storage.urgentCommitMs`): its rows reach the tables within about that and a write, whatever the interval."""
FAILING_PENDING_ROUNDS = 16
"""Rounds queued, while a write fails and is retried, before `submit` makes the next one wait."""
MAX_PENDING_BYTES = 256 * 1024 * 1024
"""Bytes (of the rounds' Arrow tables) handed to the writer and not yet written before `submit` makes the next
one wait (a round alone always gets in); a gathering also ends at half of it."""


@dataclass(frozen=True)
class SliceWrite:
    part: Slice
    tables: tuple[tuple[str, pa.Table], ...]  # (table, rows), written in this order
    new: bool = False  # no row of this slice can be in the tables or handed over before: appended (`submit`)


class TableWriter:
    """pending: rounds submitted and not written yet; waited_s: seconds submitters waited for room (both for
    metrics); abandoned: rounds given up (their messages are delivered again by the next run)."""

    def __init__(self, store: TableStore, max_pending: int = MAX_PENDING_ROUNDS, min_interval_s: float = 0.0,
                 max_pending_bytes: int = MAX_PENDING_BYTES, on_failed: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, urgent_interval_s: float = URGENT_INTERVAL_S) -> None:
        """min_interval_s: seconds a gathering lasts after a write began (`storage.commitIntervalMs`);
        urgent_interval_s: seconds it lasts at most after an urgent round was handed over
        (`storage.urgentCommitMs`); clock: monotonic seconds, for the gathering (a test's fake clock)."""
        self.store = store
        self._clock = clock
        self.on_failed = on_failed  # told (with the reason) when the writer's thread fails: the job must stop
        self.max_pending = max(1, max_pending)
        self.max_pending_bytes = max(1, max_pending_bytes)
        self.min_interval_s = max(0.0, min_interval_s)
        self.urgent_interval_s = max(0.0, urgent_interval_s)
        self._last_write = float("-inf")  # `clock` s when the last write began
        self._flushing = 0  # callers of `flush` waiting: gather nothing more
        self._hurry = False  # a round that must not wait for the gathering was handed over
        self._urgent_since: float | None = None  # `clock` s when the first urgent round of the gathering came
        self._queue: queue.Queue[SliceWrite | None] = queue.Queue()
        self._idle = threading.Condition()
        self._unwritten = 0
        self._unwritten_bytes = 0
        self._failing = False  # the write in progress failed and is being retried
        self._held: Counter = Counter()  # slices handed over, not yet written or given up
        self._closing = threading.Event()
        self._given_up = False  # a slice was abandoned: nothing after it may be written
        self._wait_until: float | None = None  # monotonic s: `submit` waits no longer (the job is stopping)
        self.abandoned = 0
        self.waited_s = 0.0
        self._thread = threading.Thread(target=self._run, name="herald-table-writer", daemon=True)
        self._thread.start()

    def submit(self, part: Slice, tables: list[tuple[str, pa.Table]], hurry: bool = False, new: bool = False,
               urgent: bool = False) -> bool:
        """Queue a round's rows, table by table in the order given (an empty table clears the slice). Waits
        while `max_pending` rounds are queued. False when the round was given up instead (the writer is closed
        or abandoned an earlier round): none of its rows is written. `hurry`: end the gathering now (a row a
        crash must not lose for 10 s, such as where a new `latest` subscription starts). `urgent`: rows an
        operator looks for soon after the event (a discard): the gathering ends `urgent_interval_s` after this
        round at most. `new`: the caller knows that no row of `part` is in the tables and that `part` was never
        handed over before (a round id this process made up, a micro-batch its query logged itself, a start
        row): its rows are appended, not replaced (on delta-spark a tenth of the cost), and its empty tables are
        skipped; a failed append is tried again as a replace, as it may have landed all the same."""
        started = time.monotonic()
        warned = False
        with self._idle:
            while self._full() and not self._closing.is_set() and not self._given_up:
                if self._wait_until is not None and time.monotonic() >= self._wait_until:
                    self._given_up = True  # this round is not written: so no later one may be
                    break
                if not warned:
                    log.warning("storage is behind: %d round(s) wait to be written; delivery waits until the table "
                                "writer catches up", self._unwritten)
                    warned = True
                self._idle.wait(1.0)
            waited = time.monotonic() - started
            self.waited_s += waited
            if self._given_up or self._closing.is_set():
                self.abandoned += 1
                log.error("%s: not written (the table writer is %s); its messages are delivered again by the next "
                          "run", part, "closed" if self._closing.is_set() else "stopped at an earlier round")
                return False
            self._unwritten += 1
            self._unwritten_bytes += _nbytes(tables)
            self._held[part] += 1
            self._queue.put(SliceWrite(part, tuple(tables), new))  # under the lock: queued before `_hurry` is seen
            self._hurry = self._hurry or hurry
            urgent_first = urgent and self._urgent_since is None
            if urgent_first:
                self._urgent_since = self._clock()
            if hurry or urgent_first or self._enough():
                self._idle.notify_all()  # the writer stops gathering, or gathers for less time
        if warned:
            log.info("storage caught up: delivery goes on after %.1f s", waited)
        return True

    def stop_waiting_at(self, deadline: float) -> None:
        """The job is stopping: a `submit` still waiting for room at `deadline` (monotonic s) gives its round up
        (and every later one), so that no thread of the job waits forever for storage that is down."""
        with self._idle:
            self._wait_until = deadline
            self._idle.notify_all()

    def abandon(self) -> None:
        """Write nothing more: what is queued or submitted from now on is given up (a write in progress ends).
        For a job that lost its lease: its rounds would undo the holder's."""
        with self._idle:
            self._given_up = True
            self._idle.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything submitted is written or given up; False when `timeout_s` seconds passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._idle:
            self._flushing += 1
            self._idle.notify_all()
            try:
                while self._unwritten:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._idle.wait(remaining)
            finally:
                self._flushing -= 1
        return True

    def holds(self, part: Slice) -> bool:
        """True while a round of slice `part` was handed over and is not yet written or given up. Ask this before
        reading the tables for `part`: once it says False, the round's commits are visible (or never will be)."""
        with self._idle:
            return self._held[part] > 0

    def _full(self) -> bool:
        """(lock held) `submit` waits: the queue is full, in rounds or in bytes (a round alone always gets in), or
        holds `FAILING_PENDING_ROUNDS` while a write fails."""
        return (self._unwritten >= self.max_pending
                or (self._failing and self._unwritten >= min(self.max_pending, FAILING_PENDING_ROUNDS))
                or (self._unwritten > 0 and self._unwritten_bytes >= self.max_pending_bytes))

    def _enough(self) -> bool:
        """(lock held) The rounds queued end a gathering: half the queue, in rounds or in bytes, so that gathering
        never makes `submit` wait."""
        return (self._unwritten >= max(1, self.max_pending // 2)
                or self._unwritten_bytes >= max(1, self.max_pending_bytes // 2))

    def _gather(self) -> None:
        """Wait until `min_interval_s` after the last write began, or `urgent_interval_s` after an urgent round
        was handed over, whichever comes first, unless the writer must hurry."""
        with self._idle:
            while not (self._closing.is_set() or self._given_up or self._flushing or self._wait_until is not None
                       or self._hurry or self._enough()):
                ends = self._last_write + self.min_interval_s
                if self._urgent_since is not None:
                    ends = min(ends, self._urgent_since + self.urgent_interval_s)
                remaining = ends - self._clock()
                if remaining <= 0:
                    return
                self._idle.wait(remaining)

    @property
    def pending(self) -> int:
        return self._unwritten

    def close(self, timeout_s: float = 60.0) -> bool:
        """Write what is queued (up to `timeout_s` seconds), then stop, waiting for a write in progress to end;
        False when some round was given up, unwritten."""
        flushed = self.flush(timeout_s)
        with self._idle:
            self._closing.set()
            self._idle.notify_all()
        self._queue.put(None)
        self._thread.join()  # a write in progress ends (a failing one gives up now): never cut a commit midway
        # every round handed over is now written or given up (`abandoned`): a slow flush that ended in the
        # drain above left nothing behind
        if self.abandoned:
            log.error("%d round(s) were not written to the tables; their messages will be delivered again",
                      self.abandoned)
        elif not flushed:
            log.warning("the tables took longer than %.0f s to take the last rounds; all of them were written",
                        timeout_s)
        return not self.abandoned

    def _run(self) -> None:
        try:
            self._drain()
        except BaseException:  # a defect: nothing may wait for a writer that is gone (a flush, a full queue)
            with self._idle:
                log.exception("the table writer failed: %d round(s) are not written, and no later one will be; "
                              "their messages are delivered again by the next run", self._unwritten)
                self._given_up = True
                self.abandoned += self._unwritten
                self._unwritten, self._unwritten_bytes = 0, 0
                self._held.clear()
                self._idle.notify_all()
            if self.on_failed is not None:  # a job that records nothing must not go on delivering
                self.on_failed("the table writer failed")

    def _drain(self) -> None:
        """Write what is queued, rounds waiting together, until the writer is closed."""
        carried: SliceWrite | None = None  # taken from the queue, not mergeable with the rounds before it
        while True:
            first = carried if carried is not None else self._queue.get()
            if first is None:
                return
            if self.min_interval_s and carried is None:  # a round left over from the last drain is written now:
                self._gather()  # a hurried one may be queued behind it, its hurry already taken
            carried, last = None, False
            with self._idle:
                self._hurry = False  # every round handed with it is in the queue: drained below
                self._urgent_since = None
            self._last_write = self._clock()
            batch, parts, ordered = [first], {first.part}, _ordered(first)
            while len(batch) < self.max_pending:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    last = True
                    break
                if not (ordered and _ordered(item) and item.part not in parts):  # a round handed twice: alone
                    carried = item
                    break
                batch.append(item)
                parts.add(item.part)
            self._write_all(batch)
            if last:
                return

    def _write_all(self, items: list[SliceWrite]) -> None:
        """Write rounds together, in one commit per table; nothing once a round was given up."""
        try:
            writes = _writes(items)  # one round's tables are taken as they are: this raises only for several
        except Exception as error:  # noqa: BLE001 - rows that do not concatenate: in halves, to the odd round out
            log.warning("could not write %d rounds together (%s: %s); writing them in two halves", len(items),
                        type(error).__name__, error)
            half = len(items) // 2  # a few commits to find the odd round out, not one per round (up to 2048)
            self._write_all(items[:half])
            self._write_all(items[half:])
            return
        if self._given_up:
            self.abandoned += len(items)
        elif not self._write(writes, items[0].part if len(items) == 1 else Slices(tuple(i.part for i in items)),
                             appended=all(item.new for item in items)):
            self._given_up = True
            self.abandoned += len(items)
        with self._idle:
            self._unwritten -= len(items)
            self._unwritten_bytes -= sum(_nbytes(item.tables) for item in items)
            for item in items:
                self._held[item.part] -= 1
                if self._held[item.part] <= 0:
                    del self._held[item.part]
            self._idle.notify_all()

    def _write(self, writes: list[tuple[str, pa.Table, Slice | Slices]], shown: Slice | Slices,
               appended: bool = False) -> bool:
        """Write one round's (or several rounds') tables in order; False when the writer was closed while a write
        still failed. `appended`: every round is new (`submit`): each table's rows are appended (none: no
        commit), and replaced only when a try failed."""
        for table, rows, part in writes:
            if appended and not rows.num_rows:
                continue
            pause_s = 0.5
            tried = False
            while True:
                try:
                    if appended and not tried:
                        tried = True
                        self.store.append(table, rows)
                    else:
                        self.store.replace(table, rows, part)
                    if self._failing:
                        with self._idle:
                            self._failing = False
                            self._idle.notify_all()
                    break
                except Exception as error:  # noqa: BLE001 - logged, retried: losing it would lose positions
                    if self._closing.is_set() or self._given_up:  # closed, or abandoned (lease lost)
                        log.error("%s: giving up writing %s, and every round after it: %s", table, shown, error)
                        return False
                    log.error("%s: writing %s failed (retrying in %.1f s): %s", table, shown, pause_s, error)
                    self._failing = True
                    self._closing.wait(pause_s)
                    pause_s = min(pause_s * 2, _MAX_PAUSE_S)
        return True



def _ordered(item: SliceWrite) -> bool:
    order = [TABLE_ORDER.index(table) if table in TABLE_ORDER else None for table, _ in item.tables]
    return None not in order and order == sorted(order)


def _nbytes(tables) -> int:
    return sum(rows.nbytes for _, rows in tables)


def _writes(items: list[SliceWrite]) -> list[tuple[str, pa.Table, Slice | Slices]]:
    """(table, rows, slices) to replace for `items`: one round's own tables as given, or, for several, per
    table in `TABLE_ORDER` the rows of every round that lists it, under all their slices."""
    if len(items) == 1:
        return [(table, rows, items[0].part) for table, rows in items[0].tables]
    writes = []
    for table in TABLE_ORDER:
        listed = [(item.part, rows) for item in items for name, rows in item.tables if name == table]
        if listed:
            schema = SCHEMAS[table]
            rows = pa.concat_tables([rows.select(schema.names).cast(schema) for _, rows in listed])
            writes.append((table, rows, Slices(tuple(part for part, _ in listed))))
    return writes
