"""One `herald run` per storage path: a lease, held in the `leases` Delta table beside the other tables.

Two jobs on the same conf and storage (a retried cluster job, a second notebook) would replace each other's
rounds, both re-drive every parked message, and roll each other's positions back. So a job takes the lease
before it delivers anything, and a second job exits at once saying who holds it.

Each holder writes its own rows (slice `lease:<holder>`): who it is (host, process id, run id), when it took the
lease, and until when it holds it (`expires_at`, renewed every `renew_s`). Its newest row (by `renewed_at`,
which a holder stamps strictly later at every write; a released row wins a tie) is where it stands. Every row's
commit carries a note naming the row (`userMetadata`), so a reader knows each row's table version: Delta's own
commit order, the same for every reader whatever the hosts' clocks say.

Hosts' clocks may be minutes or days apart, so no job judges another's rows by its own wall clock:
- A holder's lease ends when its newest row is released, when its process ran on this host (same boot and PID
  namespace) and is gone (kill -9), or when this job has seen that row unchanged for the lease's time to live
  (the row's `expires_at - renewed_at`) on its own monotonic clock. A holder stops by itself, one renewal before
  that, when it could not renew.
- Taking it: a job reads the rows; another holder whose row changed while it watched, or whose row looks current
  on its own clock, refuses it at once; a row it cannot judge yet (expired or in the future on its clock) it
  watches, reading again every `WATCH_S`, until that row changes (refused) or its lease ends. Then it writes its
  taking row, which records the table version it decided on (`seen_version`), and reads again.
- Who holds it: a taking that saw another holder's taking and newest row, with nothing of that holder committed
  between its look and its own commit, judged that holder ended and supersedes it. Of the holders not ended and
  not superseded, the one whose taking committed first (`taken_version`) holds; a holder that finds it is not
  that one stops (at its taking, or at its next renewal). Two jobs starting together did not see each other's
  takings: the one committed first read its own and no other, and keeps it.
A first commit costs many times a later one on delta-spark, so a job first writes its row as released (no one
counts it), and waits as long as two of its commits took before its second read (a rule from when rows were
ordered by their clocks).

Rows are appended (on delta-spark an append costs a tenth of a replace, which rebuilds the table's state to
delete): the released row and the live one, and at the end the release. A renewal replaces the holder's rows
with one, so a job that runs for long keeps one row. Every maintenance pass deletes the rows of holders whose
lease ended more than a day before (`forget_ended`). (A Herald older than this reads a holder's rows one by one:
after such a release it counts the job as live until its lease expires, or until it sees the process gone.)

Times are epoch milliseconds unless named `_s` (seconds); versions are the `leases` table's.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from tenacity import Retrying, stop_after_attempt, wait_random_exponential

from herald.storage.store import Slice, Slices, TableStore
from herald.storage.tables import LEASES, LEASES_SCHEMA, at_ms, epoch_ms

log = logging.getLogger(__name__)

TTL_S = 90.0
RENEW_S = 30.0
"""Every renewal is a commit to the `leases` table (a file, a log entry and, later, a tombstone): at 10 s they were
a third of a day's storage (tests/benchmarks/README.md, storage_growth). A job on another host whose process died
holds the path until a job starting has watched its row for `TTL_S` (after that row expired on its own clock, or
at once when it does not look current there); one on the same host is stale at once."""
ENDED_KEPT_S = 24 * 3600.0
"""How long the rows of a lease that ended (given back, or taken over) are kept (seconds): a short job leaves three
rows, and `forget_ended` (run by every maintenance pass) deletes them once they are this old."""
FORGOTTEN_AT_MOST = 500  # holders whose rows one pass deletes (one commit; the next pass takes the rest)
SETTLE_S = 0.0  # the least wait between writing one's row and reading the others (seconds)
WRITE_ATTEMPTS = 5  # tries of each row `acquire` writes
WATCH_S = 5.0
"""How often (seconds) a job taking the lease reads again a holder's row it cannot judge yet, to see it change."""
LOG_READ_AT_MOST = 100
"""The most commits of the `leases` table one read looks at for the versions of its rows: the newest on a job's
first read, then those since its last one. A row older than those is older than every row whose version is known."""
CURRENT_SLACK_MS = 1_000
"""A row stamped up to this long (ms) after this job's clock still looks current: a holder stamps each row a
millisecond after its last one when its clock did not move."""
_NOTE = "herald lease"  # a lease commit's note: "herald lease <holder> <renewed_at ms>"


class LeaseHeld(RuntimeError):
    """Another job holds the storage path's lease; the message names it."""


@dataclass(frozen=True)
class Holder:
    """A lease holder as its newest row says: who, since / until when (epoch ms, on the holder's clock), and where
    its rows stand in the table's commit order (versions; -1 for a row older than every commit read)."""

    holder: str
    host: str
    pid: int
    acquired_ms: int
    expires_ms: int
    released: bool
    space: str = ""  # `_process_space()` of the holder
    renewed_ms: int = 0
    version: int = -1  # the commit of this row
    taken_version: int = -1  # the commit of the holder's taking, as its later rows say (-1: this row is it)
    seen_version: int = -1  # the table version the holder decided to take the lease on (-1: none)

    @property
    def taken(self) -> int:
        """The commit version of the holder's taking (-1: older than every commit read)."""
        return self.taken_version if self.taken_version >= 0 else self.version

    @property
    def ttl_s(self) -> float:
        """The time to live the holder gave its row (seconds, on its own clock); 0 when the row says none."""
        return max(0.0, (self.expires_ms - self.renewed_ms) / 1000)

    def supersedes(self, other: Holder) -> bool:
        """This holder took the lease having judged `other` ended: it decided on a version with `other`'s taking
        and newest row in it, and `other` committed nothing between that version and this taking (a row of
        `other` after the taking was written without seeing it)."""
        if self.holder == other.holder or self.seen_version < 0:
            return False
        taken = self.taken
        return other.taken <= self.seen_version < taken and (other.version <= self.seen_version or
                                                             other.version > taken)

    def shown(self) -> str:
        until = dt.datetime.fromtimestamp(self.expires_ms / 1000, dt.timezone.utc).isoformat(timespec="seconds")
        since = dt.datetime.fromtimestamp(self.acquired_ms / 1000, dt.timezone.utc).isoformat(timespec="seconds")
        return f"process {self.pid} on {self.host} (run {self.holder.rsplit(':', 1)[-1]}, since {since}, lease " \
               f"until {until} unless renewed)"


def _first(holders: list[Holder]) -> Holder | None:
    """The one whose taking committed first."""
    return min(holders, key=lambda h: (h.taken, h.holder)) if holders else None


def _process_space() -> str:
    """Which process ids this process can see: the machine's boot and its PID namespace. Two containers with
    the same host name see different processes under the same id; only a holder in this same space whose
    process id is gone is known to be gone."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""  # unknown: such a holder's lease ends only when it expires


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _LeaseLog:
    """What one process learned of the `leases` table's log: the commit version of each current row (by holder
    and `renewed_at`), read from the commits' notes up to version `read_to`."""

    def __init__(self) -> None:
        self.versions: dict[tuple[str, int], int] = {}
        self.read_to = -1

    def read(self, store: TableStore) -> tuple[dict[str, Holder], int]:
        """holder -> its newest row, and the table version they were read at (-1: no table yet)."""
        logged = store.read_with_log(LEASES, self.read_to, LOG_READ_AT_MOST)
        for version, note in logged.commits:
            parts = (note or "").rsplit(" ", 2)
            if len(parts) == 3 and parts[0] == _NOTE and parts[2].isdigit():
                self.versions[(parts[1], int(parts[2]))] = version
        self.read_to = max(self.read_to, logged.version)
        holders = {}
        for _, row in _newest_rows(logged.rows).values():
            renewed_ms = epoch_ms(row["renewed_at"]) or 0
            holders[row["holder"]] = Holder(
                row["holder"], row["host"], row["pid"], epoch_ms(row["acquired_at"]) or 0,
                epoch_ms(row["expires_at"]) or 0, bool(row["released"]), row.get("space") or "", renewed_ms,
                self.versions.get((row["holder"], renewed_ms), -1), _version(row.get("taken_version")),
                _version(row.get("seen_version")))
        current = {(h.holder, h.renewed_ms) for h in holders.values()}
        self.versions = {key: version for key, version in self.versions.items() if key in current}
        return holders, logged.version


def _version(value) -> int:
    return -1 if value is None else int(value)


@dataclass
class _Watch:
    """Another holder's newest row as this job saw it: its stamp, since when (monotonic s) it saw it, and whether
    it saw that holder write a newer one (it lives)."""

    renewed_ms: int
    since_s: float
    changed: bool


class StorageLease:
    """The lease of one storage path for this process. `acquire()` raises LeaseHeld; then `start()` renews it on
    a thread and calls `on_lost(reason)` if it is lost; `release()` ends it. settle_s: the least wait (seconds)
    between writing one's row and reading the others (see the module's docs). clock_ms: the wall clock its rows
    are stamped with (epoch ms); the time to live is measured on `time.monotonic`."""

    def __init__(self, store: TableStore, on_lost: Callable[[str], None] = lambda reason: None,
                 ttl_s: float = TTL_S, renew_s: float = RENEW_S, settle_s: float = SETTLE_S,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 alive: Callable[[int], bool] = _process_alive) -> None:
        self.store = store
        self.on_lost = on_lost
        self.ttl_s, self.renew_s, self.settle_s = ttl_s, renew_s, settle_s
        self.clock_ms = clock_ms
        self.alive = alive
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.space = _process_space()
        self.holder = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:12]}"
        self._acquired_ms = 0
        self._renewed_s = time.monotonic()  # when (monotonic s) the last write that kept the lease began
        self._stamped_ms = 0  # the newest `renewed_at` this holder wrote: every row it writes is later
        self._seen_version = -1  # the version it decided to take the lease on
        self._taken_version = -1  # its taking's commit, once read
        self._live_row = False
        self._log = _LeaseLog()
        self._watched: dict[str, _Watch] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the table ----------------------------------------------------------------------------------------------
    def live_holders(self) -> list[Holder]:
        """The jobs that may hold the storage path now, as far as this job can tell (a released, stale or
        superseded row counts not; one it has not watched for its time to live does), read without taking it."""
        return self._live()

    def _live(self) -> list[Holder]:
        holders, read_s, _ = self._read()
        return self._standing(holders, read_s)

    def _read(self) -> tuple[dict[str, Holder], float, int]:
        """The holders' newest rows, when (monotonic s) the read began, and the version read; each other holder's
        row is watched from the read's end on, until it changes."""
        started_s = time.monotonic()
        holders, version = self._log.read(self.store)
        seen_s = time.monotonic()
        for holder in holders.values():
            watch = self._watched.get(holder.holder)
            if holder.holder != self.holder and (watch is None or watch.renewed_ms != holder.renewed_ms):
                self._watched[holder.holder] = _Watch(holder.renewed_ms, seen_s, changed=watch is not None)
        self._watched = {name: watch for name, watch in self._watched.items() if name in holders}
        return holders, started_s, version

    def _ended(self, holder: Holder, read_s: float) -> bool:
        """Another holder's lease ended, as far as this job can tell from a read that began at `read_s`."""
        if holder.released:
            return True
        if self.space and holder.space == self.space and holder.host == self.host and not self.alive(holder.pid):
            return True  # its process is gone (kill -9): stale
        watch = self._watched.get(holder.holder)
        return watch is not None and read_s - watch.since_s >= (holder.ttl_s or self.ttl_s)

    def _standing(self, holders: dict[str, Holder], read_s: float) -> list[Holder]:
        """The holders that may hold the lease: not released, not ended (this job's own row while it is not
        released), and not superseded by another's taking."""
        live = [h for h in holders.values()
                if not h.released and (h.holder == self.holder or not self._ended(h, read_s))]
        return [h for h in live if not any(other.supersedes(h) for other in holders.values())]

    def _looks_held(self, holder: Holder) -> bool:
        """Another holder's row shows it lives: it changed while this job watched, or it looks current on this
        job's clock (a clock behind makes a dead holder's row look so for one time to live at most)."""
        now_ms = self.clock_ms()
        return self._watched[holder.holder].changed or \
            holder.renewed_ms - CURRENT_SLACK_MS <= now_ms < holder.expires_ms

    def _write(self, expires_ms: int, released: bool = False, new_row: bool = False) -> None:
        """Write this holder's row, stamped later than any it wrote before: in place of its rows (`replace`), or,
        `new_row`, beside them (`append`: a tenth of the cost on delta-spark); the newest one is where it stands.
        A released row says what the taking saw only when the taking's version is known."""
        self._stamped_ms = max(self.clock_ms(), self._stamped_ms + 1)
        seen = self._seen_version >= 0 and (not released or self._taken_version >= 0)
        row = {"holder": self.holder, "host": self.host, "pid": self.pid, "acquired_at": at_ms(self._acquired_ms),
               "renewed_at": at_ms(self._stamped_ms), "expires_at": at_ms(expires_ms), "released": released,
               "space": self.space, "seen_version": self._seen_version if seen else None,
               "taken_version": self._taken_version if self._taken_version >= 0 else None,
               "writer": f"lease:{self.holder}", "batch_id": 0}
        rows = pa.Table.from_pylist([row], schema=LEASES_SCHEMA)
        note = f"{_NOTE} {self.holder} {self._stamped_ms}"
        if new_row:
            self.store.append(LEASES, rows, note=note)
        else:
            self.store.replace(LEASES, rows, Slice(f"lease:{self.holder}", 0), note=note)

    def _add_retried(self, expires_ms: int, released: bool = False) -> None:
        """Add a row beside the holder's own (`_write` with `new_row`), and after a failure replace them instead:
        a failed commit may have committed all the same, and the row must not be there twice. Tried a few times
        (0.2-2 s apart): a job starting beside another one on delta-spark may lose the race for the table's next
        commit (ConcurrentAppendException, the table's creation); the rows are the holder's own slice, so writing
        them again is safe. Renewals need none: the next one comes `renew_s` later."""
        tried = False
        for attempt in Retrying(stop=stop_after_attempt(WRITE_ATTEMPTS), reraise=True,
                                wait=wait_random_exponential(multiplier=0.2, max=2),
                                sleep=lambda seconds: time.sleep(seconds)):
            with attempt:
                new_row, tried = not tried, True
                self._write(expires_ms, released, new_row=new_row)

    def _lost_to(self, holders: dict[str, Holder], read_s: float) -> Holder | None:
        """None while this job holds the lease; else the job it lost it to: the one that holds it, or the one whose
        taking superseded this job's. This job's live row must be among `holders`."""
        mine = holders[self.holder]
        if mine.taken >= 0:
            self._taken_version = mine.taken
        winner = _first(self._standing(holders, read_s))
        if winner is not None and winner.holder == self.holder:
            return None
        return winner or _first([h for h in holders.values() if h.supersedes(mine)])

    # -- taking, keeping and giving it back ---------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lease, or raise LeaseHeld naming the job that holds it. A holder's row this job cannot judge
        yet it watches first (up to that lease's time to live)."""
        watching = False
        while True:
            holders, read_s, version = self._read()
            others = [h for h in self._standing(holders, read_s) if h.holder != self.holder]
            if not others:
                break
            held = [h for h in others if self._looks_held(h)]
            if held:
                raise LeaseHeld(_held_message(self.store, _first(held)))
            if not watching:
                watching = True
                log.info("taking the lease of %s: the row of %s does not look current on this host's clock; "
                         "watching it for up to %.0f s before taking the lease over", self.store.root,
                         _first(others).shown(), max(h.ttl_s or self.ttl_s for h in others))
            time.sleep(WATCH_S)
        # a released row first, which no one counts: the first commit of a job is its slowest by far (delta-spark
        # on a new JVM: 15-20 s, against 2-3 s once warm), and the wait below is measured on the next one
        # Both rows are added (appended): the live one is the newer, and the first renewal replaces the two with one
        self._acquired_ms = self.clock_ms()
        self._add_retried(self._acquired_ms, released=True)
        self._seen_version = version
        self._acquired_ms = self.clock_ms()
        started = time.monotonic()
        self._live_row = True  # from here a live row may be in the table: `release` gives it back
        self._add_retried(self._acquired_ms + int(self.ttl_s * 1000))
        self._renewed_s = started
        time.sleep(max(self.settle_s, 2 * (time.monotonic() - started)))
        holders, read_s, _ = self._read()
        other = self._lost_to(holders, read_s) if self.holder in holders else None
        if other is not None or self._taken_version < 0:  # taken by another, or its own row's commit not found
            self._write(self.clock_ms(), released=True)
            raise LeaseHeld(_held_message(self.store, other) if other is not None else
                            f"this job's lease row or its commit was not found in {self.store.path(LEASES)} "
                            "after writing it; try again")
        log.info("holding the lease of %s (%s)", self.store.root, self.holder)

    def start(self) -> None:
        """Renew the lease every `renew_s` seconds until `release`."""
        self._thread = threading.Thread(target=self._run, name="herald-lease", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        """Extend the lease, after checking it is still this job's; calls `on_lost` when it is not (a job that
        stalled for longer than the time to live finds the taking of the job that judged it ended)."""
        started = time.monotonic()
        holders, read_s, _ = self._read()
        if self.holder not in holders:  # forgotten by maintenance: another job's taking superseded it
            self._lose("this job's lease rows are gone from the leases table")
            return
        other = self._lost_to(holders, read_s)
        if other is not None:
            self._lose(f"another job took the lease: {other.shown()}")
            return
        self._write(self.clock_ms() + int(self.ttl_s * 1000))
        self._renewed_s = started

    def _lose(self, reason: str) -> None:
        self._stop.set()
        self.on_lost(reason)

    def _run(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                self.renew()
            except Exception as error:  # noqa: BLE001 - storage may come back before the lease expires
                overdue_s = time.monotonic() - self._renewed_s
                if overdue_s >= self.ttl_s - self.renew_s:  # stop before another job may take it
                    self._lose(f"the lease could not be renewed for {overdue_s:.0f} s ({error}); another job "
                               "may have taken it")
                    return
                log.warning("renewing the lease failed (%.0f s of %.0f left): %s", self.ttl_s - overdue_s,
                            self.ttl_s, error)

    def release(self) -> None:
        """Stop renewing and give the lease back (a next job may start at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._live_row:
            try:  # tried again: it may lose a commit race (a maintenance pass of this table ending beside it)
                self._add_retried(self.clock_ms(), released=True)
            except Exception as error:  # noqa: BLE001 - it expires by itself
                log.warning("giving the lease back failed (it expires in %.0f s): %s", self.ttl_s, error)


def _newest_rows(rows: pa.Table) -> dict[str, tuple[tuple[int, bool], dict]]:
    """holder -> ((renewed_at ms, released), its newest row): where each holder stands (a released row wins a tie)."""
    newest: dict[str, tuple[tuple[int, bool], dict]] = {}
    for row in rows.to_pylist():
        order = (epoch_ms(row["renewed_at"]) or 0, bool(row["released"]))
        if row["holder"] not in newest or order > newest[row["holder"]][0]:
            newest[row["holder"]] = (order, row)
    return newest


def forget_ended(store: TableStore, now_ms: int | None = None, kept_s: float = ENDED_KEPT_S) -> int:
    """Delete the rows of the holders whose lease ended more than `kept_s` seconds ago: given back, or taken over
    (another job's taking supersedes it) and expired; returns how many holders were forgotten. A holder's rows are
    its own slice, so nothing else goes. A lease no job took over is kept whatever the clocks say: its holder may
    live on a host days behind.

    "Ago" is counted from `now_ms` or the newest row's `renewed_at`, whichever is earlier: a clock a day ahead
    (a laptop running `herald maintain`) must not make a live job's rows look old."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    holders, _ = _LeaseLog().read(store)
    if holders:
        now_ms = min(now_ms, max(h.renewed_ms for h in holders.values()))
    ended = []
    for holder in holders.values():
        if holder.released:
            ended_ms = holder.renewed_ms
        elif any(other.supersedes(holder) for other in holders.values()):
            ended_ms = holder.expires_ms
        else:
            continue
        if ended_ms <= now_ms - int(kept_s * 1000):
            ended.append(holder.holder)
    ended = sorted(ended)[:FORGOTTEN_AT_MOST]
    if ended:
        store.replace(LEASES, LEASES_SCHEMA.empty_table(), Slices(tuple(Slice(f"lease:{h}", 0) for h in ended)))
        log.info("forgot %d lease holder(s) whose lease ended more than %.0f h ago", len(ended), kept_s / 3600)
    return len(ended)


def _held_message(store: TableStore, holder: Holder) -> str:
    return (f"another herald run holds the storage path {store.root.rsplit('/tables', 1)[0]}: {holder.shown()}. "
            "Only one job may deliver from a storage path; stop that one, or wait for its lease to end")
