"""Live configuration: a running `herald run` applies added, removed, edited, suspended and activated
subscriptions and topics within `streaming.configPollMs`, without a restart.

The watcher polls a cheap fingerprint of the conf directory (paths, sizes, modification times) and reloads it
leniently when it changes: a file with an error is logged with its file and key, and the job keeps the last
valid version of that file's subscription (or topic) and never stops because of it. The runner applies the
difference (`Runner.apply`), all of it or (when Kafka cannot be asked) nothing, and then tries again at every
poll until it applies. Changes to herald.yaml's kafka, storage and spark sections need a restart (said in the
log); the other settings apply to the next round.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from herald.config import HeraldConfig, Subscription
from herald.config.loader import conf_fingerprint, load_config_lenient

log = logging.getLogger(__name__)


class ConfWatcher:
    def __init__(self, conf_dir: Path, config: HeraldConfig, apply, poll_s: float) -> None:
        self.conf_dir = conf_dir
        self.apply = apply
        self.poll_s = poll_s
        self._config = config
        self._fingerprint = conf_fingerprint(conf_dir)
        self._kept: dict[Path, Subscription] = {}  # subscription file -> its last valid version
        self._remember(config)
        self._stop = threading.Event()
        self._reported: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="herald-conf-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _remember(self, config: HeraldConfig) -> None:
        self._kept = {Path(config.files[subscription.id]): subscription for subscription in config.subscriptions}

    def _run(self) -> None:
        failing = None
        while not self._stop.wait(self.poll_s):
            try:
                fingerprint = conf_fingerprint(self.conf_dir)
                if fingerprint != self._fingerprint:
                    self.reload()
                    self._fingerprint = fingerprint  # only once applied: a change that failed is tried again
                    failing = None
            except Exception as error:  # noqa: BLE001 - the job keeps running on the configuration in force
                if str(error) != failing:
                    log.exception("applying the configuration change failed; the configuration in force stays, "
                                  "and the change is tried again every %.1f s", self.poll_s)
                failing = str(error)

    def reload(self) -> HeraldConfig:
        """Load the directory again and apply it, keeping the last valid version of files with errors. When
        applying raises, nothing is remembered: the next call applies the change again."""
        result = load_config_lenient(self.conf_dir)
        config = result.config
        for problem in result.problems:
            text = str(problem)
            if text not in self._reported:
                log.error("configuration: %s (keeping the last valid version)", text)
        self._reported = {str(problem) for problem in result.problems}
        kept = {Path(path): self._kept[Path(path)] for path in result.invalid_subscription_files
                if Path(path) in self._kept}
        previous = self._config
        topics = {s.topicName: previous.topics[s.topicName] for s in kept.values()
                  if s.topicName not in config.topics and s.topicName in previous.topics}
        config = config.with_subscriptions(kept, topics=topics, schemas=previous.schemas)
        self.apply(config)
        self._remember(config)
        self._config = config
        return config
