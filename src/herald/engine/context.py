"""What every part of a running Herald shares: the session, the configuration, the writer."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from herald.config import HeraldConfig
from herald.delivery.flow import FlowSettings
from herald.endpoint import Endpoint
from herald.engine.endpoints.discoveries import Discoveries
from herald.engine.endpoints.priority_groups import Priority
from herald.storage import TableStore, TableWriter


def now_ms() -> int:
    return int(time.time() * 1000)


_stamp_lock = threading.Lock()
_last_stamp_ms = 0


def stamp_ms() -> int:
    """The time (epoch ms) a round's rows are stamped with: never the same twice in this process, and never
    earlier than a stamp given before, so that of two rows about one message the later-handed one is newer."""
    global _last_stamp_ms
    with _stamp_lock:
        _last_stamp_ms = max(now_ms(), _last_stamp_ms + 1)
        return _last_stamp_ms


@dataclass
class EngineContext:
    """spark: the session; config: the configuration in force (the watcher replaces it); connector: 'spark' or
    'python' (the Kafka source); store / writer: the tables; once: `--once`; priority: the pins of its pinned
    subscriptions (every round leases them); discovery: the discovered endpoint sets (docs/design.md §7)."""

    spark: object
    config: HeraldConfig
    connector: str
    store: TableStore
    writer: TableWriter
    once: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    catchup_slots: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(1))
    round_listeners: list[Callable] = field(default_factory=list)
    control_url: str | None = None  # where running tasks ask which subscriptions are delivered now
    on_task_reports: Callable[[list], None] | None = None  # each Kafka round's task reports (the control endpoint's)
    on_unrecorded: Callable[[str], None] | None = None  # the job's stop, told why (`unrecorded`)
    priority: Priority = field(init=False)
    discovery: Discoveries = field(init=False)

    def __post_init__(self) -> None:
        self.discovery = Discoveries(store=self.store, writer=f"discovery:{self.run_id}")
        self.priority = Priority(self.store, self.run_id, now_ms, self.config.settings.streaming.config_poll_s,
                                 endpoints_of=self.shown_endpoints)

    def holds(self, subscription_id: str) -> bool:
        """The subscription sits rounds out now: its pin changes hands (§6) or it has no endpoint discovered
        (§7). Its messages wait; what holds it wakes the catch-up and retry threads when it may deliver."""
        return self.priority.holds(subscription_id) or self.discovery.holds(subscription_id)

    def endpoints_of(self, subscription) -> list[Endpoint] | None:
        """The subscription's discovered set now (§7; empty while none is known), or None when its endpoints are
        configured (the planner then takes them from the subscription, overflow conditions included)."""
        return self.discovery.endpoints_of(subscription)

    def shown_endpoints(self, subscription) -> tuple[str, ...] | None:
        """Its endpoints as people see them (passwords masked), for its priority group; None while a discovered
        set is not known yet (no lookup has answered)."""
        if subscription.discovery is not None and not self.discovery.answered(subscription.id):
            return None
        found = self.endpoints_of(subscription)
        return tuple(endpoint.masked for endpoint in (subscription.targets if found is None else found))

    def former_endpoint(self, shown: str) -> Endpoint | None:
        """An endpoint that left its subscription's set, by its URL as people see it (None: unknown here)."""
        return self.discovery.known(shown)

    def recorded(self, result, duration_s: float) -> None:
        """A round's rows were handed to the writer: tell the listeners (the Prometheus exporter, the dead-letter
        publisher), each given the `herald.engine.round.result.RoundResult` and the round's duration in seconds. A
        listener that fails is logged and never stops delivery."""
        for listener in list(self.round_listeners):
            try:
                listener(result, duration_s)
            except Exception:  # noqa: BLE001 - a listener's failure must not stop the round
                logging.getLogger(__name__).exception("round listener %r failed", listener)

    def unrecorded(self, result, error: BaseException) -> None:
        """(`result`: the round's `RoundResult`, or None when it could not be built.) A round's outcomes were taken into
        its subscriptions' states (their positions moved past its messages), but its rows were not all handed to the
        writer, or its parked messages not to the retry driver. A later round's positions would pass those messages with
        no row about them, so nothing more is written and the job is told to stop (exit 1): the next run delivers them
        again from the positions written before."""
        round_named = (f"round {result.batch_id} of {result.kafka_topic} ({result.writer})" if result is not None
                       else "a round")
        reason = f"{round_named} could not be recorded: {type(error).__name__}: {error}"
        logging.getLogger(__name__).error("%s; nothing more is written, the next run delivers its messages again",
                                          reason, exc_info=error)
        self.writer.abandon()
        if self.on_unrecorded is not None:
            self.on_unrecorded(reason)

    @property
    def parallelism(self) -> int:
        return max(1, int(self.spark.sparkContext.defaultParallelism))

    @property
    def client_config(self) -> dict[str, str]:
        return self.config.settings.kafka.client_config()

    @property
    def flow_settings(self) -> FlowSettings:
        return self.config.settings.rateControl.flow_settings()

    @property
    def oauth_providers(self) -> dict:
        """herald.yaml's OAuth providers by name."""
        return {provider.name: provider for provider in self.config.settings.oauthProviders}

    @property
    def cluster(self) -> str:
        return self.config.settings.kafka.cluster
