"""What a task reports back to the driver, as Arrow rows (what `mapInArrow` returns).

Per task: how far it read each partition and whether it read all its input. Per subscription (lane): its
counters and flow state, where its position must stop in each partition (`stops`), and the messages it
discarded, parked (to the retries table) or carried (retry state only, for its catch-up to continue from).
`TaskReport.to_arrow` writes one Arrow batch of `REPORT_SCHEMA`; `TaskReport.from_table` reads the collected
rows back on the driver, one `TaskReport` per task.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, astuple, dataclass, field, fields

import pyarrow as pa

from herald.delivery.flow import FlowMode, FlowState, FlowWindow
from herald.delivery.message import Record, RetryState

MAX_GAPS = 1_000_000
"""Most gaps between offsets read a task reports per partition: every one in practice (a transactional topic has
one per transaction, a range read in a task holds at most streaming.maxOffsetsPerTrigger offsets)."""

REPORT_SCHEMA = pa.schema([
    ("task", pa.string()),  # one id per task run
    ("row_type", pa.string()),  # task | lane | discarded | parked | carried | traced | delivered | ended_carried
    ("lane", pa.int32()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("message_id", pa.string()),
    ("reason", pa.string()),
    ("ended_by", pa.string()),
    ("http_status", pa.int32()),
    ("attempts", pa.int32()),
    ("message", pa.binary()),  # discarded and parked: the message (JSON), as people read it
    ("avro", pa.binary()),  # parked: the Avro binary an AVRO subscription is sent
    ("raw_value", pa.binary()),
    ("schema_id", pa.int32()),
    ("schema_version", pa.int32()),
    ("published_ms", pa.int64()),
    ("event_ms", pa.int64()),  # discarded: when; parked/carried: first read
    ("due_ms", pa.int64()),
    ("backoff_s", pa.float64()),
    ("stats", pa.string()),  # task and lane rows: JSON
    ("event", pa.string()),  # traced: INFLIGHT | FAILED | SUCCESS | FILTERED
    ("endpoint", pa.string()),  # discarded (BROADCAST): the endpoint that did not get it, password masked
    ("targets", pa.string()),  # parked/carried (BROADCAST): JSON of the endpoints still to reach
    ("key", pa.binary()),  # discarded and parked: the Kafka record's key (for a dead-letter topic)
    ("batch_id", pa.string()),  # discarded (BATCH): the batch's Hermes-Batch-Id
    ("batch_last_offset", pa.int64()),  # carried (BATCH): a closed batch's last offset
])
_DDL_TYPES = {pa.string(): "string", pa.int32(): "int", pa.int64(): "long", pa.binary(): "binary",
              pa.float64(): "double"}
REPORT_DDL = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in REPORT_SCHEMA)
"""REPORT_SCHEMA as the DDL `mapInArrow` is given."""


@dataclass
class LaneCounters:
    """Counts for one subscription over one task; summed over tasks for the metrics table.

    read: rows of the subscription's range the task went through; matched: rows its filters passed (and
    records that could not be decoded, which go to every subscription); filtered = read - matched.
    """

    read: int = 0
    matched: int = 0
    delivered: int = 0
    discarded: int = 0
    parked: int = 0
    attempts: int = 0
    timeouts: int = 0
    other_errors: int = 0
    codes_2xx: int = 0
    codes_3xx: int = 0
    codes_4xx: int = 0
    codes_5xx: int = 0
    inflight_peak: int = 0
    batches_delivered: int = 0  # BATCH: batches delivered and discarded (their messages count in delivered
    batches_discarded: int = 0  # and discarded)
    lost: int = 0  # offsets of the subscription's range Kafka deleted before they were read (set by the driver)
    started_ms: int = 0
    finished_ms: int = 0

    @property
    def filtered(self) -> int:
        return max(0, self.read - self.matched)

    def add(self, other: LaneCounters) -> None:
        for name, value in asdict(other).items():
            if name == "inflight_peak":
                self.inflight_peak = max(self.inflight_peak, value)
            elif name == "started_ms":
                self.started_ms = min(self.started_ms, value) if self.started_ms else value
            elif name == "finished_ms":
                self.finished_ms = max(self.finished_ms, value)
            else:
                setattr(self, name, getattr(self, name) + value)


@dataclass(frozen=True)
class Discarded:
    partition: int
    offset: int
    message_id: str
    reason: str
    ended_by: str
    http_status: int | None
    attempts: int
    message: bytes | None  # the message as text (JSON), for people to read
    published_ms: int
    discarded_ms: int
    raw_value: bytes | None = None  # the original bytes of a record that could not be decoded
    schema_id: int | None = None
    schema_version: int | None = None
    endpoint: str | None = None  # BROADCAST: the endpoint that did not get it (password masked)
    key: bytes | None = None  # the Kafka record's key
    batch_id: str | None = None  # BATCH: the Hermes-Batch-Id of the batch it was discarded with


TRACK_OFF, TRACK_DISCARDED, TRACK_ALL = "off", "discarded", "all"
"""LanePlan.tracking for trackingOff, discardedOnly and trackingAll."""

INFLIGHT, FAILED, SUCCESS, FILTERED, DISCARDED = "INFLIGHT", "FAILED", "SUCCESS", "FILTERED", "DISCARDED"
STEP_ORDER = {INFLIGHT: 0, FILTERED: 1, FAILED: 1, SUCCESS: 2, DISCARDED: 2}
"""Where a step stands among steps of the same millisecond: read, then attempts, then the end."""


@dataclass(frozen=True)
class Traced:
    """One step of a message's history in a lane (trackingAll), as Hermes' tracking records it: read
    (INFLIGHT), an attempt that failed (FAILED, with its reason and status), delivered (SUCCESS) or passed over
    by the subscription's filters (FILTERED). DISCARDED steps are the `Discarded` items. event_ms: epoch ms."""

    partition: int
    offset: int
    message_id: str
    status: str
    event_ms: int
    reason: str | None = None
    http_status: int | None = None


@dataclass(frozen=True)
class Parked:
    """A message whose retries continue outside the task: the record to send and where its delivery stands."""

    record: Record
    state: RetryState


@dataclass(frozen=True)
class Carried:
    """A message left behind the subscription's position with its retry state, for catch-up to continue."""

    partition: int
    offset: int
    state: RetryState


@dataclass
class LaneReport:
    """One subscription's outcome in one task.

    stops: partition -> the first offset the subscription has not finished (its position may not pass it).
    cut: the subscription stopped taking input part-way; partitions missing from `stops` were not reached.
    delivered: (partition, offset) of each message delivered, for lanes outside any position (parked retries,
        `LanePlan.positional` False), whose round must record exactly which messages ended; empty otherwise.
    ended_carried: (partition, offset, SUCCESS or DISCARDED) of each message (or batch, at its first offset) the
        lane continued from a carried state and that ended in the task.
    pin_news: priority pinned: (last 2xx, refused since) of the pinned endpoint in epoch ms, or None when
        nothing was answered (`herald.delivery.pin`).
    """

    counters: LaneCounters = field(default_factory=LaneCounters)
    flow_state: FlowState = field(default_factory=FlowState)
    stops: dict[int, int] = field(default_factory=dict)
    cut: bool = False
    discarded: list[Discarded] = field(default_factory=list)
    parked: list[Parked] = field(default_factory=list)
    carried: list[Carried] = field(default_factory=list)
    traced: list[Traced] = field(default_factory=list)
    delivered: list[tuple[int, int]] = field(default_factory=list)
    ended_carried: list[tuple[int, int, str]] = field(default_factory=list)
    pin_news: tuple[int | None, int | None] | None = None

    def stop(self, partition: int, offset: int) -> None:
        """The subscription's position may not pass `offset` in `partition`."""
        if offset < self.stops.get(partition, math.inf):
            self.stops[partition] = offset

    def discard(self, record: Record, reason: str, ended_by: str, status: int | None, attempts: int,
                discarded_ms: int | None, endpoint: str | None = None, batch_id: str | None = None) -> None:
        """`record` goes to the undelivered table with `reason` (`discarded_ms`: when, epoch ms)."""
        self.counters.discarded += 1
        self.discarded.append(Discarded(
            partition=record.partition, offset=record.offset, message_id=record.message_id, reason=reason,
            ended_by=ended_by, http_status=status, attempts=attempts, message=record.body,
            published_ms=record.timestamp_ms, discarded_ms=discarded_ms or 0, raw_value=record.raw,
            schema_id=record.schema_id, schema_version=record.schema_version, endpoint=endpoint, key=record.key,
            batch_id=batch_id))

    def trace(self, record: Record, status: str, event_ms: int, reason: str | None = None,
              http_status: int | None = None) -> None:
        """A step of `record`'s history (tracking), at `event_ms` (epoch ms)."""
        self.traced.append(Traced(record.partition, record.offset, record.message_id, status, event_ms, reason,
                                  http_status))

    def forget_rereads(self) -> None:
        """Forget what a later round records again for the rows at or past where the position stops (it reads
        them again): their INFLIGHT and FILTERED steps, except for messages carried there with their state, and
        the discards of messages never attempted (undecodable, not JSON in a batch, or an endpoint placeholder
        without a value), which would otherwise leave a second undelivered row."""
        stops = self.stops
        if not stops:
            return
        kept = [item for item in self.discarded
                if item.attempts > 0 or item.offset < stops.get(item.partition, math.inf)]
        self.counters.discarded -= len(self.discarded) - len(kept)
        self.discarded[:] = kept
        if not self.traced:
            return
        carried = {(item.partition, item.offset) for item in self.carried}
        self.traced[:] = [
            step for step in self.traced
            if step.status not in (INFLIGHT, FILTERED) or step.offset < stops.get(step.partition, math.inf)
            or (step.partition, step.offset) in carried]


@dataclass
class TaskReport:
    """One task's outcome.

    progress: partition -> the offset after the last row the task read of it.
    firsts: partition -> the first offset the task read of it (a round's range may start below it: records
        Kafka deleted before they were read, or offsets a transaction marker or compaction left empty).
    gaps: partition -> [start, end) ranges of offsets between the first and the last read that the task did
        not read (the same causes, or a read that jumped when Kafka deleted records under it), every one
        (up to `MAX_GAPS` per partition).
    exhausted: the task read all its input (every partition it had was read to the end of the round).
    control_unreachable: the task asked the driver's control endpoint and never got an answer.
    """

    task: str = ""
    progress: dict[int, int] = field(default_factory=dict)
    firsts: dict[int, int] = field(default_factory=dict)
    gaps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    exhausted: bool = True
    lanes: dict[int, LaneReport] = field(default_factory=dict)
    control_unreachable: bool = False

    def to_arrow(self) -> pa.RecordBatch:
        rows: list[dict] = [{"row_type": "task", "stats": json.dumps(
            {"progress": {str(p): o for p, o in self.progress.items()}, "exhausted": self.exhausted,
             "firsts": {str(p): o for p, o in self.firsts.items()},
             "gaps": {str(p): [list(gap) for gap in gaps] for p, gaps in self.gaps.items()},
             "control_unreachable": self.control_unreachable})}]
        for index, lane in self.lanes.items():
            flow = lane.flow_state
            stats = {"counters": asdict(lane.counters), "stops": {str(p): o for p, o in lane.stops.items()},
                     "cut": lane.cut, "flow": [flow.mode.value, flow.rate_per_s, flow.permit_in_ms,
                                               list(astuple(flow.window))],
                     "pin": lane.pin_news}
            rows.append({"row_type": "lane", "lane": index, "stats": json.dumps(stats)})
            for item in lane.discarded:
                columns = asdict(item)
                columns["event_ms"] = columns.pop("discarded_ms")
                rows.append({"row_type": "discarded", "lane": index, **columns})
            for item in lane.parked:
                record, state = item.record, item.state
                rows.append({"row_type": "parked", "lane": index, "partition": record.partition,
                             "offset": record.offset, "message_id": record.message_id, "message": record.body,
                             "avro": record.avro, "key": record.key, "raw_value": record.raw,
                             "schema_id": record.schema_id,
                             "schema_version": record.schema_version, "published_ms": record.timestamp_ms,
                             **_state_columns(state)})
            for item in lane.carried:
                rows.append({"row_type": "carried", "lane": index, "partition": item.partition,
                             "offset": item.offset, **_state_columns(item.state)})
            for partition, offset in lane.delivered:
                rows.append({"row_type": "delivered", "lane": index, "partition": partition, "offset": offset})
            for partition, offset, how in lane.ended_carried:
                rows.append({"row_type": "ended_carried", "lane": index, "partition": partition, "offset": offset,
                             "event": how})
            for step in lane.traced:
                rows.append({"row_type": "traced", "lane": index, "partition": step.partition,
                             "offset": step.offset, "message_id": step.message_id, "event": step.status,
                             "event_ms": step.event_ms, "reason": step.reason, "http_status": step.http_status})
        for row in rows:
            row["task"] = self.task
        return pa.RecordBatch.from_pylist(rows, schema=REPORT_SCHEMA)

    @staticmethod
    def from_table(table: pa.Table) -> list[TaskReport]:
        """The collected rows of every task, read back on the driver."""
        tasks: dict[str, TaskReport] = {}
        discarded_fields = [f.name for f in fields(Discarded)]
        for row in table.to_pylist():
            report = tasks.setdefault(row["task"], TaskReport(task=row["task"]))
            kind = row["row_type"]
            if kind == "task":
                stats = json.loads(row["stats"])
                report.progress = {int(p): o for p, o in stats["progress"].items()}
                report.firsts = {int(p): o for p, o in stats.get("firsts", {}).items()}
                report.gaps = {int(p): [tuple(gap) for gap in gaps] for p, gaps in stats.get("gaps", {}).items()}
                report.exhausted = stats["exhausted"]
                report.control_unreachable = stats.get("control_unreachable", False)
                continue
            lane = report.lanes.setdefault(row["lane"], LaneReport())
            if kind == "lane":
                stats = json.loads(row["stats"])
                lane.counters = LaneCounters(**stats["counters"])
                lane.stops = {int(p): o for p, o in stats["stops"].items()}
                lane.cut = stats["cut"]
                mode, rate, permit_in_ms, window = stats["flow"]
                lane.flow_state = FlowState(FlowMode(mode), rate, 0, FlowWindow(*window), permit_in_ms)
                lane.pin_news = tuple(stats["pin"]) if stats.get("pin") is not None else None
            elif kind == "discarded":
                row["discarded_ms"] = row["event_ms"]
                lane.discarded.append(Discarded(**{name: row[name] for name in discarded_fields}))
            elif kind == "parked":
                record = Record(partition=row["partition"], offset=row["offset"], timestamp_ms=row["published_ms"],
                                message_id=row["message_id"], body=row["message"], avro=row["avro"],
                                schema_id=row["schema_id"], schema_version=row["schema_version"], key=row["key"],
                                raw=row["raw_value"])
                lane.parked.append(Parked(record, _state_of(row)))
            elif kind == "carried":
                lane.carried.append(Carried(row["partition"], row["offset"], _state_of(row)))
            elif kind == "delivered":
                lane.delivered.append((row["partition"], row["offset"]))
            elif kind == "ended_carried":
                lane.ended_carried.append((row["partition"], row["offset"], row["event"]))
            elif kind == "traced":
                lane.traced.append(Traced(row["partition"], row["offset"], row["message_id"], row["event"],
                                          row["event_ms"], row["reason"], row["http_status"]))
        return list(tasks.values())


def _state_columns(state: RetryState) -> dict:
    return {"attempts": state.attempts, "event_ms": state.first_read_ms, "due_ms": state.due_ms,
            "backoff_s": state.backoff_s, "http_status": state.last_status, "reason": state.last_reason,
            "targets": state.targets_json(), "batch_last_offset": state.batch_last_offset}


def _state_of(row: dict) -> RetryState:
    return RetryState(attempts=row["attempts"], first_read_ms=row["event_ms"], due_ms=row["due_ms"],
                      backoff_s=row["backoff_s"], last_status=row["http_status"], last_reason=row["reason"] or "",
                      targets=RetryState.targets_from_json(row["targets"]),
                      batch_last_offset=row.get("batch_last_offset"))
