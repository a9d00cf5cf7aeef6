"""The parked messages of a running job, kept on the driver's local disk instead of in its memory.

A subscriber down for an hour at 400 messages a second parks about 1.4 M messages; their bodies do not belong in
the driver's heap. `ParkedRegistry` keeps each parked message (its record, body included, and its retry state)
in an SQLite file in a temporary directory of the driver (`TMPDIR`; deleted when the job stops), indexed by
subscription and due time, so that what a retry round needs (the messages due now, the next due time, a
subscription's count) costs the same whatever the number parked; memory holds a count per subscription and
SQLite's page cache (`CACHE_KIB`). The file is a cache of the `retries` table, which stays the record: a job
that starts fills it from there (`herald.engine.triggers.retry_driver.RetryDriver.load`), and nothing in it needs
to survive a crash (no journal, no sync). A job killed (kill -9) leaves its directory behind: the next registry
made in the same place deletes those no process holds any more (`sweep`: each registry holds an flock on a file in
its directory for its life, which the kernel lets go when the process ends, whatever its PID namespace), so that a
job restarted by its cluster manager again and again does not fill the driver's disk (or its memory, where TMPDIR
is a tmpfs).

Not thread-safe: the retry driver calls it under its own lock. Each stored message has a version, new at every
`put`, so that a round that took a message can tell whether the registry still holds that same one when the
round ends (`same`).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import pickle
import shutil
import sqlite3
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

from herald.delivery.message import Record, RetryState

CACHE_KIB = 8 * 1024
"""SQLite's page cache, KiB: what stays in memory of the file whatever the number of parked messages."""


@dataclass
class ParkedMessage:
    """A parked message as a round gets it: its record, retry state, Kafka topic, and the version `put` gave it."""

    record: Record
    state: RetryState
    kafka_topic: str
    version: int = 0


PREFIX = "herald-parked-"


LOCK_FILE = "owner.lock"


def sweep(directory: str | None = None) -> list[str]:
    """Delete the registries' directories in `directory` (None: TMPDIR) that no process holds any more (their
    lock file is free); returns those deleted. A registry still open (another job on the host, or this one)
    keeps its directory; a directory without a lock file is left alone."""
    parent = directory or tempfile.gettempdir()
    deleted = []
    try:
        names = [name for name in os.listdir(parent) if name.startswith(PREFIX)]
    except OSError:
        return deleted
    for name in names:
        path = os.path.join(parent, name)
        try:
            fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR)
        except OSError:  # not one of ours, or not readable
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its registry is open
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)
        deleted.append(name)
    return deleted


def _locked_owner_file(directory: str) -> int:
    """The registry's lock file in `directory`, locked (its descriptor). Locked under a name of its own first, then
    renamed: a sweep never finds an `owner.lock` free that a registry is about to lock. Where the file system
    has no locks (NFS without lockd), the registry goes on without one: a sweep skips directories it cannot lock."""
    staging = os.path.join(directory, f"{LOCK_FILE}.{os.getpid()}")
    fd = os.open(staging, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            os.close(fd)
            raise
    os.rename(staging, os.path.join(directory, LOCK_FILE))
    return fd


class ParkedRegistry:
    def __init__(self, directory: str | None = None) -> None:
        sweep(directory)
        self._directory = tempfile.mkdtemp(prefix=PREFIX, dir=directory)
        self._lock_fd = -1
        try:
            self._lock_fd = _locked_owner_file(self._directory)
            self._db = sqlite3.connect(os.path.join(self._directory, "parked.sqlite"), check_same_thread=False,
                                       isolation_level=None)
            for pragma in ("journal_mode=OFF", "synchronous=OFF", f"cache_size=-{CACHE_KIB}", "temp_store=FILE"):
                self._db.execute(f"PRAGMA {pragma}")
            self._db.execute("""CREATE TABLE parked (subscription TEXT NOT NULL, partition INTEGER NOT NULL,
                "offset" INTEGER NOT NULL, kafka_topic TEXT NOT NULL, due_ms INTEGER NOT NULL, tried INTEGER NOT NULL,
                version INTEGER NOT NULL, record BLOB NOT NULL, state BLOB NOT NULL,
                PRIMARY KEY (subscription, partition, "offset"))""")
            self._db.execute("CREATE INDEX parked_due ON parked (subscription, due_ms)")  # due order, tried or not
        except BaseException:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
            shutil.rmtree(self._directory, ignore_errors=True)
            raise
        self._counts: dict[str, int] = {}
        self._versions = itertools.count(1)

    def close(self) -> None:
        self._db.close()
        shutil.rmtree(self._directory, ignore_errors=True)
        os.close(self._lock_fd)  # last: the directory is gone before a sweep could take it

    # -- counts -----------------------------------------------------------------------------------------------
    def count(self, subscription_id: str) -> int:
        return self._counts.get(subscription_id, 0)

    def total(self) -> int:
        return sum(self._counts.values())

    def subscriptions(self) -> list[str]:
        """The subscriptions with parked messages."""
        return [sid for sid, count in self._counts.items() if count]

    # -- writing ----------------------------------------------------------------------------------------------
    def put(self, subscription_id: str, kafka_topic: str, items: Iterable[tuple[Record, RetryState]]) -> None:
        """Park messages (a message already parked at the same partition and offset is replaced), untried."""
        rows = [(subscription_id, record.partition, record.offset, kafka_topic, state.due_ms, 0,
                 next(self._versions), pickle.dumps(record, 5), pickle.dumps(state, 5)) for record, state in items]
        if not rows:
            return
        self._db.execute("BEGIN")
        try:
            known = sum(self._db.execute(
                'SELECT COUNT(*) FROM parked WHERE subscription = ? AND partition = ? AND "offset" = ?',
                row[:3]).fetchone()[0] for row in rows)
            self._db.executemany("INSERT OR REPLACE INTO parked VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._counts[subscription_id] = self._count_of(subscription_id) + len(rows) - known

    def _count_of(self, subscription_id: str) -> int:
        return self._counts.get(subscription_id, 0)

    def update(self, subscription_id: str, message: ParkedMessage, state: RetryState, tried: bool) -> bool:
        """A round re-drove `message` and it is still retrying: its new state (and new version). False when the
        registry no longer holds that same message (`same`)."""
        cursor = self._db.execute(
            'UPDATE parked SET state = ?, due_ms = ?, tried = ?, version = ? WHERE subscription = ? AND partition = ? '
            'AND "offset" = ? AND version = ?',
            (pickle.dumps(state, 5), state.due_ms, int(tried), next(self._versions), subscription_id,
             message.record.partition, message.record.offset, message.version))
        return cursor.rowcount == 1

    def remove(self, subscription_id: str, message: ParkedMessage) -> bool:
        """The message ended (delivered or discarded): False when the registry no longer holds that same one."""
        cursor = self._db.execute(
            'DELETE FROM parked WHERE subscription = ? AND partition = ? AND "offset" = ? AND version = ?',
            (subscription_id, message.record.partition, message.record.offset, message.version))
        if cursor.rowcount:
            self._counts[subscription_id] = self._count_of(subscription_id) - 1
        return cursor.rowcount == 1

    def same(self, subscription_id: str, message: ParkedMessage) -> bool:
        """True while the registry holds `message` as it was taken (no `put`, `update` or removal since)."""
        found = self._db.execute(
            'SELECT version FROM parked WHERE subscription = ? AND partition = ? AND "offset" = ?',
            (subscription_id, message.record.partition, message.record.offset)).fetchone()
        return found is not None and found[0] == message.version

    def postpone(self, subscription_id: str, messages: Iterable[ParkedMessage], due_ms: int) -> None:
        """Not before `due_ms` (epoch ms)."""
        self._db.executemany(
            'UPDATE parked SET due_ms = MAX(due_ms, ?) WHERE subscription = ? AND partition = ? AND "offset" = ?',
            [(due_ms, subscription_id, m.record.partition, m.record.offset) for m in messages])

    def take_where(self, kafka_topic: str, firsts: dict[int, int], subscriptions: Iterable[str]) \
            -> dict[str, list[ParkedMessage]]:
        """Take out the messages of `kafka_topic` at offsets `firsts[partition]` and above, of `subscriptions`."""
        taken: dict[str, list[ParkedMessage]] = {}
        for subscription_id in subscriptions:
            for partition, first in firsts.items():
                where = 'subscription = ? AND kafka_topic = ? AND partition = ? AND "offset" >= ?'
                args = (subscription_id, kafka_topic, partition, first)
                found = [self._message(row) for row in self._db.execute(
                    f"SELECT kafka_topic, version, record, state FROM parked WHERE {where}", args)]
                if found:
                    self._db.execute(f"DELETE FROM parked WHERE {where}", args)
                    self._counts[subscription_id] = self._count_of(subscription_id) - len(found)
                    taken.setdefault(subscription_id, []).extend(found)
        return taken

    # -- reading ----------------------------------------------------------------------------------------------
    def due(self, subscription_id: str, horizon_ms: int, limit: int, untried_only: bool) -> list[ParkedMessage]:
        """At most `limit` of the subscription's messages due by `horizon_ms` (epoch ms), earliest first;
        `untried_only`: not those a `--once` run re-drove already."""
        tried = " AND tried = 0" if untried_only else ""
        return [self._message(row) for row in self._db.execute(
            f"SELECT kafka_topic, version, record, state FROM parked WHERE subscription = ?{tried} AND due_ms <= ? "
            "ORDER BY due_ms LIMIT ?", (subscription_id, horizon_ms, limit))]

    def next_due(self, subscription_id: str, untried_only: bool) -> int | None:
        """The earliest due time (epoch ms) of the subscription's messages."""
        tried = " AND tried = 0" if untried_only else ""
        return self._db.execute(f"SELECT MIN(due_ms) FROM parked WHERE subscription = ?{tried}",
                                (subscription_id,)).fetchone()[0]

    def untried_due_by(self, subscription_id: str, since_ms: int) -> bool:
        """True when one of the subscription's messages due by `since_ms` was not re-driven yet (`--once`)."""
        return self._db.execute("SELECT 1 FROM parked WHERE subscription = ? AND tried = 0 AND due_ms <= ? LIMIT 1",
                                (subscription_id, since_ms)).fetchone() is not None

    def earliest(self) -> int | None:
        """The earliest due time (epoch ms) of every parked message."""
        return self._db.execute("SELECT MIN(due_ms) FROM parked").fetchone()[0]

    @staticmethod
    def _message(row) -> ParkedMessage:
        kafka_topic, version, record, state = row
        return ParkedMessage(pickle.loads(record), pickle.loads(state), kafka_topic, version)
