"""Stopping on a signal: to Herald's Python, or to the JVM it drives.

Under spark-submit the driver is two processes: spark-submit's JVM, and Herald's Python, which the JVM starts as
its child and drives through py4j. A SIGTERM reaches the JVM alone (Kubernetes: the container's init forwards the
pod's SIGTERM to the process it started) or both (YARN kills the container's process group; a terminal's Ctrl-C
goes to the foreground group). The JVM's own handler exits at once, its shutdown hooks stopping the SparkContext
while Herald's Python still lets its rounds finish: every Spark call of that graceful stop (a table's commit, the
lease's renewal) then failed, its rounds were never recorded, and the next run delivered them again. With
`herald run` the JVM is Python's child, and a SIGTERM to the group (systemd's default) did the same.

`JvmSignals` replaces the JVM's handlers of SIGTERM and SIGINT while Herald runs (a signal the JVM ignores stays
ignored: `herald run`'s JVM ignores SIGINT): the JVM stays up and tells Herald's Python through py4j's callback
server, which stops as on a signal of its own. Once Python has stopped, the old handlers are back, Python exits,
and spark-submit exits with Python's exit code, as after any Python application.

`StopRequests` counts the signals each process received: the first starts the graceful stop, a second to the same
process stops at once. A signal to the process group reaches both processes: one request, not two.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

log = logging.getLogger(__name__)

PYTHON = "python"
JVM = "jvm"
JVM_SIGNALS = ("TERM", "INT")


class StopRequests:
    """graceful: starts the graceful stop; now: stops at once; stopping: whether the job stops already for another
    reason (a --once run that is done, a lost lease), when a first signal stops it at once."""

    def __init__(self, graceful: Callable[[], None], now: Callable[[], None], stopping: Callable[[], bool]) -> None:
        self._graceful = graceful
        self._now = now
        self._stopping = stopping
        self._received: Counter[str] = Counter()
        self._lock = threading.Lock()

    def received(self, receiver: str) -> None:
        """A signal to `receiver` (PYTHON or JVM)."""
        with self._lock:
            first = not self._received
            self._received[receiver] += 1
            again = self._received[receiver] > 1 or (first and self._stopping())
        (self._now if again else self._graceful)()


class JvmSignals:
    """The JVM's SIGTERM and SIGINT handlers replaced by relays to `on_signal` (called on a py4j thread), until
    `restore()`. `install` returns None where there is no JVM to ask (Spark Connect)."""

    def __init__(self, jvm, previous: dict[str, object]) -> None:
        self._jvm = jvm
        self._previous = previous

    @classmethod
    def install(cls, spark, on_signal: Callable[[], None]) -> JvmSignals | None:
        jvm = getattr(spark, "_jvm", None)
        gateway = getattr(getattr(spark, "sparkContext", None), "_gateway", None)
        if jvm is None or gateway is None:
            return None
        from pyspark.java_gateway import ensure_callback_server_started

        try:
            ensure_callback_server_started(gateway)
        except Exception as error:  # noqa: BLE001 - the JVM keeps its handlers: a signal to it stops it at once
            log.warning("the JVM's signals are not relayed to Herald (py4j callback server: %s)", error)
            return None
        previous = {}
        for name in JVM_SIGNALS:
            try:
                previous[name] = jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal(name), _Relay(on_signal))
            except Exception as error:  # noqa: BLE001 - a JVM that lets no one handle it (-Xrs): as before
                log.debug("the JVM's SIG%s is not relayed: %s", name, error)
        return cls(jvm, previous)

    def restore(self) -> None:
        for name, handler in self._previous.items():
            try:
                self._jvm.sun.misc.Signal.handle(self._jvm.sun.misc.Signal(name), handler)
            except Exception as error:  # noqa: BLE001 - a JVM gone already needs no handler
                log.debug("the JVM's SIG%s handler was not restored: %s", name, error)
        self._previous = {}


class _Relay:
    """A `sun.misc.SignalHandler` implemented in Python (py4j calls `handle` on its callback server's thread)."""

    def __init__(self, on_signal: Callable[[], None]) -> None:
        self._on_signal = on_signal

    def handle(self, _signal) -> None:
        try:
            self._on_signal()
        except Exception:  # noqa: BLE001 - never into the JVM's signal thread
            log.exception("stopping on the JVM's signal failed")

    class Java:
        implements = ["sun.misc.SignalHandler"]
