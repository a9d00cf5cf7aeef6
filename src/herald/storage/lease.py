"""One `herald run` per storage path: a lease, held in the `leases` Delta table beside the other tables.

Two jobs on the same conf and storage (a retried cluster job, a second notebook) would replace each other's
rounds, both re-drive every parked message, and roll each other's positions back. So a job takes the lease
before it delivers anything, and a second job exits at once saying who holds it.

Each holder writes its own rows (slice `lease:<holder>`): who it is (host, process id, run id), when it took the
lease, and until when it holds it (`expires_at`, renewed every `renew_s`). Its newest row (by `renewed_at`,
which a holder stamps strictly later at every write; a released row wins a tie) is where it stands. A lease is
live while that row has not expired and is not released.

Taking it: read the live leases; if another holder's is live, refuse; else write one's own row and read again:
of the live leases, the one taken first (earliest `acquired_at`, then holder) wins, and everyone reading the
same rows picks the same one. Of two jobs starting together, the one that stamped its row first may commit it
later; so a job waits as long as two of its own commits took before it reads the others, and both then see both
rows. That commit is a warm one: a job first writes its row as released (no one counts it), as a first commit
costs many times a later one on delta-spark. Only a commit much slower than one's own, or clocks far apart, can
make both think they are first: every renewal checks again, so one of them stops within `renew_s`.

Rows are appended (on delta-spark an append costs a tenth of a replace, which rebuilds the table's state to
delete): the released row and the live one, and at the end the release. A renewal replaces the holder's rows
with one, so a job that runs for long keeps one row. Every maintenance pass deletes the rows of holders whose
lease ended more than a day before (`forget_ended`). (A Herald older than this reads a holder's rows one by one:
after such a release it counts the job as live until its lease expires, or until it sees the process gone.)

A lease whose holder ran on this host, in the same boot and PID namespace, and whose process is gone (kill -9)
is stale at once; any other ends at `expires_at`. A job that cannot renew its lease stops one renewal before
it would expire.

Times are epoch milliseconds unless named `_s` (seconds).
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
holds the path up to `TTL_S`; one on the same host is stale at once."""
ENDED_KEPT_S = 24 * 3600.0
"""How long the rows of a lease that ended (given back, or expired) are kept (seconds): a short job leaves three
rows, and `forget_ended` (run by every maintenance pass) deletes them once they are this old."""
FORGOTTEN_AT_MOST = 500  # holders whose rows one pass deletes (one commit; the next pass takes the rest)
SETTLE_S = 0.0  # the least wait between writing one's row and reading the others (seconds)
WRITE_ATTEMPTS = 5  # tries of each row `acquire` writes


class LeaseHeld(RuntimeError):
    """Another job holds the storage path's lease; the message names it."""


@dataclass(frozen=True)
class Holder:
    """A lease holder as its row says: who, and since / until when (epoch ms)."""

    holder: str
    host: str
    pid: int
    acquired_ms: int
    expires_ms: int
    released: bool
    space: str = ""  # `_process_space()` of the holder

    def shown(self) -> str:
        until = dt.datetime.fromtimestamp(self.expires_ms / 1000, dt.timezone.utc).isoformat(timespec="seconds")
        since = dt.datetime.fromtimestamp(self.acquired_ms / 1000, dt.timezone.utc).isoformat(timespec="seconds")
        return f"process {self.pid} on {self.host} (run {self.holder.rsplit(':', 1)[-1]}, since {since}, lease " \
               f"until {until} unless renewed)"


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


class StorageLease:
    """The lease of one storage path for this process. `acquire()` raises LeaseHeld; then `start()` renews it on
    a thread and calls `on_lost(reason)` if it is lost; `release()` ends it. settle_s: the least wait (seconds)
    between writing one's row and reading the others (see the module's docs)."""

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
        self._renewed_ms = 0
        self._stamped_ms = 0  # the newest `renewed_at` this holder wrote: every row it writes is later
        self._live_row = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the table ----------------------------------------------------------------------------------------------
    def live_holders(self) -> list[Holder]:
        """The jobs holding the storage path now (a released, expired or stale row counts not), read without
        taking the lease."""
        return self._live()

    def _live(self) -> list[Holder]:
        now = self.clock_ms()
        newest = _newest_rows(self.store)
        holders = []
        for _, row in newest.values():
            holder = Holder(row["holder"], row["host"], row["pid"], epoch_ms(row["acquired_at"]),
                            epoch_ms(row["expires_at"]), bool(row["released"]), row.get("space") or "")
            if holder.released or holder.expires_ms <= now:
                continue
            if holder.holder != self.holder and self.space and holder.space == self.space and holder.host == self.host \
                    and not self.alive(holder.pid):
                continue  # its process is gone (kill -9): stale
            holders.append(holder)
        return holders

    def _write(self, expires_ms: int, released: bool = False, new_row: bool = False) -> None:
        """Write this holder's row, stamped later than any it wrote before: in place of its rows (`replace`), or,
        `new_row`, beside them (`append`: a tenth of the cost on delta-spark); the newest one is where it stands."""
        self._stamped_ms = max(self.clock_ms(), self._stamped_ms + 1)
        row = {"holder": self.holder, "host": self.host, "pid": self.pid, "acquired_at": at_ms(self._acquired_ms),
               "renewed_at": at_ms(self._stamped_ms), "expires_at": at_ms(expires_ms), "released": released,
               "space": self.space,
               "writer": f"lease:{self.holder}", "batch_id": 0}
        rows = pa.Table.from_pylist([row], schema=LEASES_SCHEMA)
        if new_row:
            self.store.append(LEASES, rows)
        else:
            self.store.replace(LEASES, rows, Slice(f"lease:{self.holder}", 0))

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

    def _winner(self) -> Holder | None:
        live = self._live()
        return min(live, key=lambda h: (h.acquired_ms, h.holder)) if live else None

    # -- taking, keeping and giving it back ---------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lease, or raise LeaseHeld naming the job that holds it."""
        others = [h for h in self._live() if h.holder != self.holder]
        if others:
            raise LeaseHeld(_held_message(self.store, min(others, key=lambda h: (h.acquired_ms, h.holder))))
        # a released row first, which no one counts: the first commit of a job is its slowest by far (delta-spark
        # on a new JVM: 15-20 s, against 2-3 s once warm), and the wait below is measured on the next one
        # Both rows are added (appended): the live one is the newer, and the first renewal replaces the two with one
        self._acquired_ms = self.clock_ms()
        self._add_retried(self._acquired_ms, released=True)
        self._acquired_ms = self.clock_ms()
        started = time.monotonic()
        self._live_row = True  # from here a live row may be in the table: `release` gives it back
        self._add_retried(self._acquired_ms + int(self.ttl_s * 1000))
        self._renewed_ms = self._acquired_ms
        # a job starting at the same time may have stamped its row first and commit it later: wait as long as
        # two commits take here before reading the others
        time.sleep(max(self.settle_s, 2 * (time.monotonic() - started)))
        winner = self._winner()
        if winner is not None and winner.holder != self.holder:
            self._write(self.clock_ms(), released=True)
            raise LeaseHeld(_held_message(self.store, winner))
        log.info("holding the lease of %s (%s)", self.store.root, self.holder)

    def start(self) -> None:
        """Renew the lease every `renew_s` seconds until `release`."""
        self._thread = threading.Thread(target=self._run, name="herald-lease", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        """Extend the lease, after checking it is still this job's; calls `on_lost` when it is not."""
        winner = self._winner()
        if winner is not None and winner.holder != self.holder:
            self._stop.set()
            self.on_lost(f"another job took the lease: {winner.shown()}")
            return
        self._write(self.clock_ms() + int(self.ttl_s * 1000))
        self._renewed_ms = self.clock_ms()

    def _run(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                self.renew()
            except Exception as error:  # noqa: BLE001 - storage may come back before the lease expires
                overdue_s = (self.clock_ms() - self._renewed_ms) / 1000
                if overdue_s >= self.ttl_s - self.renew_s:  # stop before another job may take it
                    self._stop.set()
                    self.on_lost(f"the lease could not be renewed for {overdue_s:.0f} s ({error}); another job "
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


def _newest_rows(store: TableStore) -> dict[str, tuple[tuple[int, bool], dict]]:
    """holder -> ((renewed_at ms, released), its newest row): where each holder stands (a released row wins a tie)."""
    newest: dict[str, tuple[tuple[int, bool], dict]] = {}
    for row in store.read(LEASES).to_pylist():
        order = (epoch_ms(row["renewed_at"]) or 0, bool(row["released"]))
        if row["holder"] not in newest or order > newest[row["holder"]][0]:
            newest[row["holder"]] = (order, row)
    return newest


def forget_ended(store: TableStore, now_ms: int | None = None, kept_s: float = ENDED_KEPT_S) -> int:
    """Delete the rows of the holders whose lease ended more than `kept_s` seconds ago (their newest row released,
    or expired); returns how many holders were forgotten. A holder's rows are its own slice, so nothing else goes.
    A holder that comes back after all (a process stalled for a day) writes its row again at its next renewal.

    "Ago" is counted from `now_ms` or the newest row's `renewed_at`, whichever is earlier: a clock a day ahead
    (a laptop running `herald maintain`) must not make a live job's rows look old."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    newest = _newest_rows(store)
    if newest:
        now_ms = min(now_ms, max(renewed_ms for (renewed_ms, _), _ in newest.values()))
    ended = []
    for holder, ((renewed_ms, released), row) in newest.items():
        ended_ms = renewed_ms if released else (epoch_ms(row["expires_at"]) or 0)
        if ended_ms <= now_ms - int(kept_s * 1000):
            ended.append(holder)
    ended = sorted(ended)[:FORGOTTEN_AT_MOST]
    if ended:
        store.replace(LEASES, LEASES_SCHEMA.empty_table(), Slices(tuple(Slice(f"lease:{h}", 0) for h in ended)))
        log.info("forgot %d lease holder(s) whose lease ended more than %.0f h ago", len(ended), kept_s / 3600)
    return len(ended)


def _held_message(store: TableStore, holder: Holder) -> str:
    return (f"another herald run holds the storage path {store.root.rsplit('/tables', 1)[0]}: {holder.shown()}. "
            "Only one job may deliver from a storage path; stop that one, or wait for its lease to end")
