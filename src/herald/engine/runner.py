"""`herald run` and `jobs/deliver.py`: every ACTIVE subscription as its own streaming query.

With `once=True` each query processes what is available now (Trigger.AvailableNow) and the run returns when
all are done. Otherwise the queries run until interrupted: the first Ctrl-C (or SIGTERM) lets micro-batches in
progress finish (up to `grace_s` seconds) and stops; a second one stops at once. Either way nothing is lost:
a batch that did not finish is delivered again on the next start.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from herald.config import HeraldConfig
from herald.engine.query import SubscriptionStream
from herald.engine.session import get_or_create_session
from herald.source.stream import choose_connector
from herald.storage import open_store

log = logging.getLogger(__name__)


class Runner:
    def __init__(self, config: HeraldConfig, only: list[str] | None = None, spark=None) -> None:
        self.config = config
        self.subscriptions = config.active_subscriptions(only)
        self.spark = spark
        self.streams: list[SubscriptionStream] = []
        self._stop = threading.Event()

    def start(self, once: bool) -> list[SubscriptionStream]:
        settings = self.config.settings
        if self.spark is None:
            self.spark = get_or_create_session(settings.spark.master, settings.spark.conf, app_name="herald")
        connector = choose_connector(self.spark, settings.kafka.connector)
        store = open_store(settings.storage.engine, self.config.storage_path, self.spark, settings.storage.options)
        for subscription in self.subscriptions:
            stream = SubscriptionStream(self.spark, self.config, subscription, store, connector)
            stream.start(once)
            self.streams.append(stream)
        return self.streams

    def run(self, once: bool = False, grace_s: float = 30.0) -> int:
        """Run until done (`once`) or interrupted; 0 when every query ended cleanly, 1 when one failed."""
        skipped = [s.id for s in self.config.subscriptions if not s.active]
        if skipped:
            log.info("not running SUSPENDED subscriptions: %s", ", ".join(skipped))
        if not self.subscriptions:
            log.warning("no ACTIVE subscription to run")
            return 0
        self.start(once)
        if once:
            return self._wait_all()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self._stop.is_set() and all(s.query.isActive for s in self.streams):
                self._stop.wait(0.5)
            self._graceful_stop(grace_s)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._exit_code()

    def _on_signal(self, signum, frame) -> None:
        if self._stop.is_set():
            log.warning("second interrupt: stopping now")
            for stream in self.streams:
                stream.query.stop()
            return
        log.info("stopping: letting micro-batches in progress finish (Ctrl-C again to stop now)")
        self._stop.set()

    def _graceful_stop(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        for stream in self.streams:
            while stream.query.isActive and stream.query.status.get("isTriggerActive") and time.monotonic() < deadline:
                time.sleep(0.1)
            stream.query.stop()

    def _wait_all(self) -> int:
        for stream in self.streams:
            try:
                stream.query.awaitTermination()
            except Exception:  # noqa: BLE001 - reported below with the others
                pass
        return self._exit_code()

    def _exit_code(self) -> int:
        failed = 0
        for stream in self.streams:
            error = stream.query.exception()
            if error is not None:
                failed += 1
                log.error("%s failed: %s", stream.subscription.id, _short(error))
        return 1 if failed else 0


def _short(error) -> str:
    """The root cause of a failed query: the last `SomethingError: ...` line of the (Java and Python) chain."""
    import re

    from herald.endpoint import mask_secrets

    lines = [line.strip() for line in str(getattr(error, "desc", None) or error).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return mask_secrets(causes[-1] if causes else (lines[0] if lines else repr(error)))
