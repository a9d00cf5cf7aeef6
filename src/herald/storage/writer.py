"""Writing rounds to the tables on a thread of their own, in the order they were submitted.

Delivery does not wait for Delta commits: a round hands its slices over and goes on. Order is kept (a later
round's positions never land before an earlier one's), and each round's tables are written in the order
given, positions last, so a crash between two commits leaves positions behind, never ahead, of what the
undelivered and retries tables hold (at least once). A failing write is retried with a growing pause until
it succeeds or the writer is closed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import pyarrow as pa

from herald.storage.store import Slice, TableStore

log = logging.getLogger(__name__)

_MAX_PAUSE_S = 30.0


@dataclass(frozen=True)
class SliceWrite:
    part: Slice
    tables: tuple[tuple[str, pa.Table], ...]  # (table, rows), written in this order


class TableWriter:
    def __init__(self, store: TableStore) -> None:
        self.store = store
        self._queue: queue.Queue[SliceWrite | None] = queue.Queue()
        self._idle = threading.Condition()
        self._unwritten = 0
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="herald-table-writer", daemon=True)
        self._thread.start()

    def submit(self, part: Slice, tables: list[tuple[str, pa.Table]]) -> None:
        """Queue a round's rows, table by table in the order given (an empty table clears the slice)."""
        with self._idle:
            self._unwritten += 1
        self._queue.put(SliceWrite(part, tuple(tables)))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything submitted is written; False when `timeout_s` seconds passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._idle:
            while self._unwritten:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    @property
    def pending(self) -> int:
        return self._unwritten

    def close(self, timeout_s: float = 60.0) -> bool:
        """Write what is queued (up to `timeout_s` seconds), then stop; False when some was left unwritten."""
        flushed = self.flush(timeout_s)
        self._closing.set()
        self._queue.put(None)
        self._thread.join(timeout=5)
        if not flushed:
            log.error("%d round(s) were not written to the tables; their messages will be delivered again",
                      self._unwritten)
        return flushed

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._write(item)
            with self._idle:
                self._unwritten -= 1
                self._idle.notify_all()

    def _write(self, item: SliceWrite) -> None:
        for table, rows in item.tables:
            pause_s = 0.5
            while True:
                try:
                    self.store.replace(table, rows, item.part)
                    break
                except Exception as error:  # noqa: BLE001 - logged, retried: losing it would lose positions
                    if self._closing.is_set():
                        log.error("%s: giving up writing %s: %s", table, item.part, error)
                        return
                    log.error("%s: writing %s failed (retrying in %.1f s): %s", table, item.part, pause_s, error)
                    time.sleep(pause_s)
                    pause_s = min(pause_s * 2, _MAX_PAUSE_S)
