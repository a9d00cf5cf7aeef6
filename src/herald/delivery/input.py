"""A task's input: the topic's rows, each with the subscriptions (lanes) it goes to, read ahead by a thread.

`arrow_input` turns the Arrow batches Spark hands to `mapInArrow` into `InputBatch`es: only rows that go to
some subscription become Python objects; every offset read is kept per partition as a NumPy array, so the
rows a subscription went through can be counted without touching each row once per subscription.
`Prefetcher` reads them on a thread, so the delivery loop never blocks on Spark while requests are open.

Input columns (see `herald.engine.round.projection`): partition, offset, timestamp, value (the message as JSON
subscriptions receive it), headers, targets (array<int>: the lanes whose filters passed), and for AVRO topics
avro (the Avro binary AVRO subscriptions receive), error, raw, schema_id, schema_version; and position_id (the
message id of a row without an `id` header, computed in the JVM for the rows that go somewhere; computed here for
the others). A row that could not be decoded (`error`) goes to every lane: each one records it as undelivered.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from herald.delivery.message import Record, message_id

_OPTIONAL = ("key", "avro", "error", "raw", "schema_id", "schema_version", "position_id")


@dataclass
class InputBatch:
    """rows: (record, lane indices) for rows that go to at least one lane, in input order.
    offsets: every offset read, per partition, ascending (rows that go nowhere included)."""

    rows: list[tuple[Record, Sequence[int]]]
    offsets: dict[int, np.ndarray] = field(default_factory=dict)
    nbytes: int = 0


def arrow_input(batches: Iterable[pa.RecordBatch], topic: str, every_lane: Sequence[int],
                every_row: bool = False) -> Iterator[InputBatch]:
    """Convert `mapInArrow` input; `every_lane` is where a record that could not be decoded goes. With
    `every_row` (a lane tracks every message, FILTERED included) rows that go nowhere become records too."""
    for batch in batches:
        if batch.num_rows:
            yield _convert(batch, topic, tuple(every_lane), every_row)


def _convert(batch: pa.RecordBatch, topic: str, every_lane: tuple[int, ...], every_row: bool = False) -> InputBatch:
    partitions = batch.column("partition").to_numpy(zero_copy_only=False)
    offsets = batch.column("offset").to_numpy(zero_copy_only=False)
    by_partition = {int(p): np.sort(offsets[partitions == p]) for p in np.unique(partitions)}
    targets = batch.column("targets")
    wanted = pc.fill_null(pc.greater(pc.list_value_length(targets), 0), False)
    names = batch.schema.names
    if "error" in names:
        wanted = pc.or_(wanted, pc.is_valid(batch.column("error")))
    if every_row:
        wanted = pa.array(np.ones(batch.num_rows, dtype=bool))
    if not pc.any(wanted).as_py():
        return InputBatch([], by_partition, 0)
    rows = batch.filter(wanted)
    ids = _header_ids(rows.column("headers"))
    columns = {name: rows.column(name).to_pylist() for name in ("partition", "offset", "value")}
    timestamps = pc.divide(rows.column("timestamp").cast(pa.int64()), 1000).to_pylist()
    optional = {name: rows.column(name).to_pylist() if name in names else [None] * rows.num_rows
                for name in _OPTIONAL}
    lanes = rows.column("targets").to_pylist()
    out: list[tuple[Record, Sequence[int]]] = []
    nbytes = 0
    for i in range(rows.num_rows):
        partition, offset = columns["partition"][i], columns["offset"][i]
        record = Record(
            partition=partition,
            offset=offset,
            timestamp_ms=timestamps[i] or 0,
            message_id=ids.get(i) or optional["position_id"][i] or message_id(topic, partition, offset, None),
            body=columns["value"][i],
            avro=optional["avro"][i],
            error=optional["error"][i],
            raw=optional["raw"][i],
            schema_id=optional["schema_id"][i],
            schema_version=optional["schema_version"][i],
            key=optional["key"][i],
        )
        nbytes += record.size
        out.append((record, every_lane if record.error is not None else (lanes[i] or ())))
    return InputBatch(out, by_partition, nbytes)


def _header_ids(headers: pa.Array) -> dict[int, str]:
    """Row -> the value of its Kafka header `id` (Hermes' message id), for the rows that have one."""
    if pc.sum(pc.fill_null(pc.list_value_length(headers), 0)).as_py() in (None, 0):
        return {}
    flat = pc.list_flatten(headers)
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    keys = flat.field("key")
    hits = np.nonzero(pc.fill_null(pc.equal(keys, "id"), False).to_numpy(zero_copy_only=False))[0]
    values = flat.field("value")
    found: dict[int, str] = {}
    for position in hits:
        value = values[int(position)].as_py()
        row = int(parents[position])
        if value and row not in found:
            found[row] = value.decode("utf-8", errors="replace")
    return found


class Prefetcher:
    """Reads input batches on a thread, at most `depth` ahead of the loop that takes them.

    `take()` never blocks; `done` is True once the input is exhausted and every batch taken. `close()` makes
    the thread read the rest of the input without keeping it (Spark's worker must see its input to the end),
    then waits for it. An error while reading is raised by `take()`.
    """

    _END = object()

    def __init__(self, batches: Iterable[InputBatch], depth: int = 2) -> None:
        self._source = iter(batches)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._discard = threading.Event()
        self._error: BaseException | None = None
        self.done = False
        self._peeked = None
        self._thread = threading.Thread(target=self._run, name="herald-input", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for batch in self._source:
                while not self._discard.is_set():
                    try:
                        self._queue.put(batch, timeout=0.05)
                        break
                    except queue.Full:
                        continue
        except BaseException as error:  # noqa: BLE001 - handed to the loop
            self._error = error
        self._put_end()

    def _put_end(self) -> None:
        while True:
            try:
                self._queue.put(self._END, timeout=0.05)
                return
            except queue.Full:
                if self._discard.is_set():
                    self._empty_queue()

    def _empty_queue(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def take(self) -> InputBatch | None:
        """The next batch read, or None when none is ready (or the input is done)."""
        if self.done:
            return None
        item, self._peeked = self._peeked, None
        if item is None:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return None
        if item is self._END:
            self.done = True
            if self._error is not None:
                raise self._error
            return None
        return item

    def wait(self, timeout_s: float) -> None:
        """Block until a batch is ready (or `timeout_s` seconds pass): for a loop with nothing else to do."""
        if self.done or self._peeked is not None:
            return
        try:
            self._peeked = self._queue.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            pass

    def close(self) -> None:
        self._discard.set()
        self._peeked = None
        self._empty_queue()
        self._thread.join()
        if self._error is not None and not self.done:
            self.done = True
            raise self._error
        self.done = True


class InlineReader:
    """The Prefetcher's interface, reading on the caller's thread: for loops on a fake clock, whose tests must
    not depend on how fast another thread runs. `take()` reads the next batch (it may block while it is read).
    """

    def __init__(self, batches: Iterable[InputBatch]) -> None:
        self._source = iter(batches)
        self.done = False

    def take(self) -> InputBatch | None:
        if self.done:
            return None
        batch = next(self._source, None)
        self.done = batch is None
        return batch

    def wait(self, timeout_s: float) -> None:
        """Nothing to wait for: the next `take()` reads."""

    def close(self) -> None:
        for _ in self._source:  # read to the end, as the Prefetcher does
            pass
        self.done = True
