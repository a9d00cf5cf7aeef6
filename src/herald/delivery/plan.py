"""What one Spark task needs to deliver its share of a round: plain, picklable configuration.

The driver builds a `TaskPlan` per round (a micro-batch of the topic's shared query, a catch-up read, or a
batch of parked retries) and ships it to the tasks; each `LanePlan` is one subscription's share of a task.
Only configuration crosses the process boundary: transports, threads and clocks are created in the task.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from herald.delivery.flow import FlowSettings, FlowState
from herald.delivery.message import RetryState
from herald.delivery.oauth import TokenSource
from herald.delivery.pin import PinPlan
from herald.delivery.policy import RetryPolicy
from herald.delivery.spec import BatchSpec
from herald.delivery.tls import TlsSettings


@dataclass(frozen=True)
class Target:
    """One endpoint of a subscription: its URL without credentials (it may hold `{json.path}` placeholders,
    see `herald.endpoint.fill`) and the Authorization header line its credentials give (never printed)."""

    url: str
    authorization: str | None = field(default=None, repr=False)
    shown: str = ""  # the URL as people see it: user kept, password masked (tables, logs)
    min_pending: int | None = None  # priority overflow: served only while the subscription's pending messages
    min_inflight: int | None = None  # reach min_pending or its messages in flight reach min_inflight

    @property
    def conditional(self) -> bool:
        return self.min_pending is not None or self.min_inflight is not None

    @property
    def templated(self) -> bool:
        return "{" in self.url


@dataclass(frozen=True)
class LanePlan:
    """One subscription's share of a task. Every field is required: the planner (`herald.engine.round.planner`) fills
    them from the configuration model, the one place with defaults.

    url: the endpoint without credentials, when `targets` is empty (the lines in `header_lines` then carry any
        Authorization); otherwise the first target's, for people.
    targets: the endpoints, each with its own Authorization line; ANYCAST sends each message's first attempt
        to the next one round-robin and each retry to the one after its last.
    oauth: with a token source, every attempt carries `Authorization: Bearer <token>` (`herald.delivery.oauth`).
    broadcast: BROADCAST: each message goes to every target, each with its own attempts and backoff; it is
        delivered once every target has answered 2xx.
    header_lines: the lines every attempt carries ("Name: value"); each attempt adds its id and retry count.
    inflight: messages the round's tasks may hold in flight for the subscription, together (inflightSize less
        what parked retries hold); each task takes its share (`share`), so the sum never exceeds it. A task
        whose share is 0 takes nothing new for the subscription.
    rate_per_s: the round's share of the subscription's hard rate cap, attempts per second, split evenly.
    rate_tasks / rate_turn: how many tasks split the rate, and which of them this is: the tasks take turns
        (`herald.delivery.flow.Turns`), so their permits never bunch up.
    request_timeout_s / socket_timeout_s: total and idle limits of one attempt (socket 0 = none).
    sending_delay_s: a message is not attempted before its publish time plus this delay.
    avro: an AVRO delivery: the Avro binary is sent, with Schema-Id / Schema-Version when known.
    ordered: inflightSize 1: partition order is kept, so an unfinished message is never parked.
    starts: partition -> the first offset the subscription still needs; rows below it are already done.
    resume: (partition, offset) -> the retry state a message continues from (carried from an earlier round).
    positional: False for parked retries, which stand outside any position: whatever is unfinished at the end
        is parked again.
    signing_keys: with keys, every attempt is signed (Standard Webhooks, `herald.delivery.signing`).
    batch: BATCH delivery's thresholds (`herald.delivery.batcher`); None: each message alone.
    tracking: what the lane records of each message's history (`herald.delivery.report.TRACK_*`): nothing,
        its failed attempts and its end (the driver adds DISCARDED rows from the discards), or everything.
    version: the version of the subscription's definition the round was planned with; a task that learns of
        another (or that the subscription is no longer delivered) starts no more first attempts for it
        (`herald.delivery.control`).
    tls: whom its https attempts trust and the client certificate they show (None: certifi's CAs, none shown);
        its repr never shows the key's passphrase.
    pending: the subscription's pending messages when the round was planned (its lag as the job knows it, plus
        its parked messages): what an overflow endpoint's `min_pending` is compared with (`herald.delivery.choice`).
    pin: priority pinned: the pin the round got (`targets` is then the pinned endpoint alone, and
        `header_lines` carry its Herald-Pin-Id); the lane watches the endpoint's answers (`herald.delivery.pin`).
    departed: BROADCAST: the last `departed` of `targets` are endpoints that left the subscription's list or
        discovered set; only members of resumed messages that still owe them an answer go there, never a new
        message (docs/design.md §7).
    """

    subscription_id: str
    url: str
    header_lines: tuple[str, ...] = field(repr=False)  # carries Authorization: never printed
    retry: RetryPolicy
    inflight: int
    rate_per_s: float
    request_timeout_s: float
    socket_timeout_s: float
    sending_delay_s: float
    flow_settings: FlowSettings
    flow_state: FlowState
    avro: bool
    ordered: bool
    starts: dict[int, int]
    resume: dict[tuple[int, int], RetryState] = field(repr=False)
    positional: bool
    tracking: str
    signing_keys: tuple[bytes, ...] = field(repr=False)  # HMAC keys: never printed
    targets: tuple[Target, ...]
    broadcast: bool
    oauth: TokenSource | None
    batch: BatchSpec | None
    version: str
    tls: TlsSettings | None
    pin: PinPlan | None
    pending: int
    departed: int = 0
    rate_tasks: int = 1
    rate_turn: int = 0

    @property
    def tracks_all(self) -> bool:
        return self.tracking == "all"

    def share(self, tasks: int, task_index: int) -> LanePlan:
        """What task `task_index` of `tasks` gets (NSQ: the shares never sum to more than the whole): inflight
        split evenly with the remainder to the first tasks, the rate and the controller's rates evenly, and a
        heartbeat probe that many times less often. An overflow endpoint's `min_inflight` is split too (the
        task's messages in flight are its share of the subscription's)."""
        if tasks <= 1:
            return self
        inflight = self.inflight // tasks + (1 if task_index < self.inflight % tasks else 0)
        settings = replace(self.flow_settings, slow_rate_per_s=self.flow_settings.slow_rate_per_s / tasks,
                           heartbeat_interval_s=self.flow_settings.heartbeat_interval_s * tasks)
        targets = tuple(replace(target, min_inflight=-(-target.min_inflight // tasks))
                        if target.min_inflight is not None else target for target in self.targets)
        return replace(self, inflight=inflight, rate_per_s=self.rate_per_s / tasks, flow_settings=settings,
                       flow_state=self.flow_state.share(tasks), targets=targets, rate_tasks=tasks,
                       rate_turn=task_index)


@dataclass(frozen=True)
class TaskPlan:
    """Every subscription's share of one task.

    topic: the Kafka topic the rows come from (it keys the message ids).
    lanes: index in the rows' `targets` -> that subscription's plan; rows for other indices are ignored.
    tasks: how many tasks deliver the round at once (each takes its `LanePlan.share`).
    budget_s: seconds a task delivers, from when it starts (not from when the driver planned the round:
        Spark may take seconds to launch a task and its Python worker); after that no attempt starts, and what
        is unfinished is parked or left behind the subscription's position.
    park_after_s: once a subscription has nothing left but retries and the input is read, how long they are
        retried in the task before they are parked.
    request_grace_s: seconds a request still open when its lane settles (at the deadline, at the sender's
        `stop`, or on its own: stalled, throttled, a pin's timeout, its subscription changed) may take to answer;
        then the transport aborts it and it counts as a timeout (retried: parked or carried). A hanging
        subscriber so holds its task for at most this long past the deadline, whatever its requestTimeout.
    settle_throttled: a subscription whose next attempt waits longer than `park_after_s` for its rate (it is
        rate-limited, or slowed to probes because it fails) settles then, as at the deadline, instead of
        keeping the round open: for the shared query, where it would hold back the topic's other
        subscriptions. It catches up on its own.
    transport: 'auto', 'curl' or 'requests'; max_open: most attempts open at once in the task.
    readahead_rows / readahead_bytes: most rows read and waiting for a subscription to take them; past this a
        subscription that holds up the reading is cut off (its position stops, it catches up alone).
    flush_batches: BATCH lanes send their open batches once the input is read (a `--once` run) instead of
        carrying them to a later round until their batchTime.
    control_url / control_poll_s: where the task asks, every that many seconds, which version of each
        subscription is delivered now (None: it does not ask).
    """

    topic: str
    lanes: dict[int, LanePlan]
    budget_s: float
    tasks: int = 1
    park_after_s: float = 1.0
    request_grace_s: float = 1.0
    settle_throttled: bool = False
    transport: str = "auto"
    max_open: int = 512
    readahead_rows: int = 20_000
    readahead_bytes: int = 64 * 1024 * 1024
    flush_batches: bool = False
    control_url: str | None = None
    control_poll_s: float = 2.0
