"""What a running task learns from the driver while it delivers: which subscriptions are still delivered, and in
which version of their definition.

A round's task may deliver for up to `streaming.batchDeadlineMs`. When an operator suspends, removes or edits a
subscription meanwhile, the driver's configuration watcher applies it and the driver's control endpoint
(`herald.engine.upkeep.control`) answers the new versions. A task asks every `poll_s` seconds, on a thread of its own
(the delivery loop never waits for it), and its loop stops starting first attempts for a subscription whose
version changed or that is gone: what was never attempted stays behind its position, for the next round (with
the new definition, or after activation). An endpoint that cannot be reached changes nothing.
"""

from __future__ import annotations

import json
import threading
import urllib.request


class ControlPoller:
    """Asks `url` every `poll_s` seconds for {"versions": {subscription id: version}}; `versions()` is the last
    answer (None before the first, and while the driver cannot be reached)."""

    def __init__(self, url: str, poll_s: float, timeout_s: float = 2.0) -> None:
        self.url = url
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self._versions: dict[str, str] | None = None
        self._answered = False
        self._failed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="herald-control", daemon=True)
        self._thread.start()

    def versions(self) -> dict[str, str] | None:
        return self._versions

    @property
    def unreachable(self) -> bool:
        """It was asked and never answered: this executor cannot reach the driver's control endpoint (its task
        reports it, and the driver logs it once)."""
        return self._failed and not self._answered

    def _run(self) -> None:
        while True:
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout_s) as answer:
                    self._versions = dict(json.loads(answer.read())["versions"])
                self._answered = True
            except Exception:  # noqa: BLE001 - unreachable or malformed: the task goes on as planned
                self._versions = None
                self._failed = True
            if self._stop.wait(self.poll_s):
                return

    def close(self) -> None:
        self._stop.set()
