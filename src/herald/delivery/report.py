"""What a task reports back to the driver: counters, read positions, discarded messages and its flow state.

`TaskReport.to_arrow()` turns a report into rows of one Arrow schema (`REPORT_SCHEMA`, one `row_type` per kind),
which is what `mapInArrow` returns; `summarize` combines the collected rows of all tasks on the driver.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from herald.delivery.flow import FlowMode, FlowState

REPORT_SCHEMA = pa.schema(
    [
        ("row_type", pa.string()),  # "task" | "position" | "discarded"
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),  # position rows: the next offset to read
        ("message_id", pa.string()),
        ("reason", pa.string()),
        ("http_status", pa.int32()),
        ("attempts", pa.int32()),
        ("message", pa.binary()),
        ("raw_value", pa.binary()),
        ("schema_id", pa.int32()),
        ("schema_version", pa.int32()),
        ("published_ms", pa.int64()),
        ("discarded_ms", pa.int64()),
        ("stats", pa.string()),  # task rows: TaskCounters and flow state as JSON
    ]
)
REPORT_DDL = (
    "row_type string, topic string, partition int, offset long, message_id string, reason string, "
    "http_status int, attempts int, message binary, raw_value binary, schema_id int, schema_version int, "
    "published_ms long, discarded_ms long, stats string"
)


@dataclass
class TaskCounters:
    """Counts over one task; summed over tasks for the metrics table."""

    read: int = 0
    filtered: int = 0
    delivered: int = 0
    discarded: int = 0
    attempts: int = 0
    timeouts: int = 0
    other_errors: int = 0
    codes_2xx: int = 0
    codes_3xx: int = 0
    codes_4xx: int = 0
    codes_5xx: int = 0
    inflight_peak: int = 0
    started_ms: int = 0
    finished_ms: int = 0

    def add(self, other: TaskCounters) -> None:
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
    topic: str
    partition: int
    offset: int
    message_id: str
    reason: str
    http_status: int | None
    attempts: int
    message: bytes | None  # the message as text (JSON), for people to read
    published_ms: int
    discarded_ms: int
    raw_value: bytes | None = None  # the original bytes of a record that could not be decoded
    schema_id: int | None = None
    schema_version: int | None = None


@dataclass
class TaskReport:
    counters: TaskCounters = field(default_factory=TaskCounters)
    positions: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, partition) -> next offset
    discarded: list[Discarded] = field(default_factory=list)
    flow_state: FlowState | None = None

    def saw(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        if offset + 1 > self.positions.get(key, -1):
            self.positions[key] = offset + 1

    def to_arrow(self) -> pa.RecordBatch:
        rows: list[dict] = []
        stats = asdict(self.counters)
        if self.flow_state is not None:
            stats["flow_mode"] = self.flow_state.mode.value
            stats["flow_rate_per_s"] = self.flow_state.rate_per_s
        rows.append({"row_type": "task", "stats": json.dumps(stats)})
        for (topic, partition), offset in self.positions.items():
            rows.append({"row_type": "position", "topic": topic, "partition": partition, "offset": offset})
        for item in self.discarded:
            rows.append({"row_type": "discarded", **asdict(item)})
        return pa.RecordBatch.from_pylist(rows, schema=REPORT_SCHEMA)


@dataclass
class BatchSummary:
    """Every task of a micro-batch, combined on the driver."""

    counters: TaskCounters = field(default_factory=TaskCounters)
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    discarded: list[Discarded] = field(default_factory=list)
    flow_states: list[FlowState] = field(default_factory=list)
    tasks: int = 0


def summarize(table: pa.Table) -> BatchSummary:
    """Combine collected REPORT_SCHEMA rows (driver side)."""
    summary = BatchSummary()
    for row in table.to_pylist():
        kind = row["row_type"]
        if kind == "task":
            stats = json.loads(row["stats"])
            mode = stats.pop("flow_mode", None)
            rate = stats.pop("flow_rate_per_s", None)
            summary.counters.add(TaskCounters(**stats))
            summary.tasks += 1
            if mode is not None:
                summary.flow_states.append(FlowState(FlowMode(mode), rate))
        elif kind == "position":
            key = (row["topic"], row["partition"])
            summary.positions[key] = max(summary.positions.get(key, 0), row["offset"])
        elif kind == "discarded":
            summary.discarded.append(Discarded(**{name: row[name] for name in Discarded.__dataclass_fields__}))
    return summary
