"""`herald run` (not --once) in a thread of the test process, on the test session's SparkSession.

    with RunningHerald(conf, spark) as running:
        ... publish, wait for the subscriber ...
    assert running.exit_code == 0
"""

from __future__ import annotations

import threading

from herald.config import load_config
from herald.engine.runner import Runner
from tests.support.herald_env import wait_until


class RunningHerald:
    def __init__(self, conf, spark, metrics_port: int | None = None) -> None:
        self.runner = Runner(load_config(conf), spark=spark, metrics_port=metrics_port)
        self.exit_code: int | None = None
        self._thread = threading.Thread(target=self._run, name="herald-run", daemon=True)

    def _run(self) -> None:
        self.exit_code = self.runner.run(once=False, grace_s=20)

    def __enter__(self) -> RunningHerald:
        self._thread.start()
        assert wait_until(lambda: self.runner.pipelines and all(
            p.query is not None and p.query.lastProgress is not None for p in self.runner.pipelines.values()),
            timeout_s=120), "herald run did not start"
        return self

    def applied(self, since: int, timeout_s: float = 30) -> bool:
        """Wait until the job applied a configuration change after generation `since` (see `generation`)."""
        return wait_until(lambda: self.runner.config_generation > since, timeout_s=timeout_s)

    @property
    def generation(self) -> int:
        """The job's configuration generation now: take it before editing the conf, then `applied(it)`."""
        return self.runner.config_generation

    def __exit__(self, *exc) -> None:
        self.runner.stop()
        self._thread.join(timeout=180)
        assert not self._thread.is_alive(), "herald run did not stop"
