"""Building blocks for tests of the task's delivery loop (no Spark): records, input batches, lane plans, and a
TaskSender run on a fake clock and a fake transport."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import yaml

from herald.config import Subscription
from herald.delivery.flow import FlowSettings, FlowState
from herald.delivery.input import InputBatch
from herald.delivery.message import Record, message_id
from herald.delivery.plan import LanePlan, TaskPlan
from herald.delivery.policy import RetryPolicy
from herald.delivery.report import TaskReport
from herald.delivery.sender import TaskSender
from herald.delivery.transport import HttpAnswer
from tests.support.clock import FakeClock
from tests.support.config_files import SUBSCRIPTION
from tests.support.fake_transport import FakeTransport

TOPIC = "g.t"

# A subscription with every setting at the configuration model's default: the model is the one place with
# defaults, and the tests' plans start from it.
MODEL_DEFAULTS = Subscription.model_validate(yaml.safe_load(SUBSCRIPTION)).delivery_spec


def retry_policy(**overrides) -> RetryPolicy:
    """The model's default retry policy with `overrides` (seconds)."""
    return dataclasses.replace(MODEL_DEFAULTS.retry, **overrides)


def lane_plan(url: str, **overrides) -> LanePlan:
    """A lane plan for one endpoint, every field from the model's defaults unless overridden."""
    spec = MODEL_DEFAULTS
    values = dict(subscription_id="g.t.s", url=url, header_lines=("Content-Type: application/json",),
                  retry=spec.retry, inflight=spec.inflight, rate_per_s=spec.rate_per_s,
                  request_timeout_s=spec.request_timeout_s, socket_timeout_s=spec.socket_timeout_s,
                  sending_delay_s=spec.sending_delay_s, flow_settings=FlowSettings(), flow_state=FlowState(),
                  avro=False, ordered=False, starts={}, resume={}, positional=True, tracking="off", signing_keys=(),
                  targets=(), broadcast=False, oauth=None, batch=None, version="", tls=None, pin=None, pending=0)
    values.update(overrides)
    return LanePlan(**values)


def record(partition: int, offset: int, body: dict | None = None, **fields) -> Record:
    document = body if body is not None else {"p": partition, "o": offset}
    return Record(partition=partition, offset=offset, timestamp_ms=1_800_000_000_000,
                  message_id=message_id(TOPIC, partition, offset, None), body=json.dumps(document).encode(),
                  **fields)


def batch(rows: list[tuple[Record, tuple[int, ...]]], extra_offsets: dict[int, list[int]] | None = None) -> InputBatch:
    offsets: dict[int, list[int]] = {}
    for rec, _ in rows:
        offsets.setdefault(rec.partition, []).append(rec.offset)
    for partition, values in (extra_offsets or {}).items():
        offsets.setdefault(partition, []).extend(values)
    return InputBatch(rows, {p: np.array(sorted(v), dtype=np.int64) for p, v in offsets.items()},
                      sum(r.size for r, _ in rows))


def lane(url: str = "http://sub/a", **overrides) -> LanePlan:
    values = dict(retry=retry_policy(message_ttl_s=60, backoff_s=0.1), inflight=10, rate_per_s=10_000.0,
                  flow_settings=FlowSettings(adjust_interval_s=30))
    values.update(overrides)
    return lane_plan(url, **values)


def run(lanes: dict[int, LanePlan], batches: list[InputBatch], respond, clock: FakeClock | None = None,
        deadline_s: float = 10.0, park_after_s: float = 1.0, tokens=None, task_index: int = 0, stop=None,
        **plan_fields):
    clock = clock or FakeClock()
    transport = FakeTransport(clock, respond)
    plan = TaskPlan(topic=TOPIC, lanes=lanes, budget_s=deadline_s,
                    park_after_s=park_after_s, **plan_fields)
    sender = TaskSender(plan, transport, clock=clock.monotonic, wall_clock_ms=clock.wall_ms, sleep=clock.sleep,
                        prefetch=False, task_index=task_index, **({"tokens": tokens} if tokens is not None else {}),
                        **({"stop": stop} if stop is not None else {}))
    report = sender.run(batches)
    assert transport.closed
    return report, transport, clock


def lane_report(report: TaskReport, index: int = 0):
    return report.lanes[index]


def by_url(transport: FakeTransport, url: str):
    return [sent for sent in transport.sent if sent.request.url == url]


def scripted(table: dict[tuple[str, int], list]):
    """Answers per (url, offset) as a list (the last repeats); everything else 200 after 10 ms."""

    def respond(request, attempt):
        document = json.loads(request.body)
        replies = table.get((request.url, document["o"]))
        if not replies:
            return HttpAnswer(200), 0.01
        reply = replies[min(attempt, len(replies) - 1)]
        return (reply if not isinstance(reply, int) else HttpAnswer(reply)), 0.01

    return respond
