"""The embedded Kafka-protocol broker (`noida-db`) for local work, demos and tests.

`noida-db` is a single binary that speaks the Kafka protocol on loopback. Its `noida-db` command is a Python
wrapper that starts the server in the background, so the server is stopped with `noida-db down`, never by
killing the wrapper's PID.

Example::

    broker = EmbeddedBroker(Path(".herald/broker"), port=19092)
    broker.up()
    broker.create_topics({"demo.orders": 3})
    broker.down()
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 19092


class BrokerError(RuntimeError):
    """The embedded broker could not be started, reached or stopped."""


def _noida_command() -> str:
    beside_python = Path(sys.executable).with_name("noida-db")
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("noida-db")
    if found is None:
        raise BrokerError("noida-db is not installed: pip install 'herald[local]' (it pins noida-db==0.2.3)")
    return found


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


@dataclass(frozen=True)
class EmbeddedBroker:
    """A noida-db Kafka broker bound to 127.0.0.1:`port`, keeping its data in `data_dir`."""

    data_dir: Path
    port: int = DEFAULT_PORT
    host: str = "127.0.0.1"

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def _run(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        command = [_noida_command(), *args, "--data-dir", str(self.data_dir)]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)

    def is_up(self) -> bool:
        return _port_open(self.host, self.port)

    def up(self, wait_s: float = 30.0) -> None:
        """Start the broker in the background (no-op if it already answers) and wait until it accepts clients.

        Raises BrokerError when it does not answer within `wait_s` seconds.
        """
        if self.is_up():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        result = self._run("up", "--only", "kafka", "--kafka-port", str(self.port), "--host", self.host)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.is_up() and self._answers_metadata():
                return
            time.sleep(0.1)
        raise BrokerError(
            f"embedded broker did not start on {self.bootstrap_servers}: {_clean(result.stdout + result.stderr)}"
        )

    def _answers_metadata(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(timeout=2)
            return True
        except Exception:  # noqa: BLE001 - any failure means "not ready yet"
            return False

    def down(self) -> None:
        """Stop the broker; its data stays in `data_dir`."""
        if self.data_dir.exists():
            self._run("down")
        deadline = time.monotonic() + 10
        while self.is_up() and time.monotonic() < deadline:
            time.sleep(0.1)

    def status(self) -> str:
        if not self.data_dir.exists():
            return f"not running (no data in {self.data_dir})"
        return _clean(self._run("status").stdout)

    def create_topics(self, partitions_by_topic: dict[str, int], timeout_s: float = 10.0) -> None:
        """Create the topics that do not exist yet, with the given partition counts."""
        create_topics(self.bootstrap_servers, partitions_by_topic, timeout_s)


def create_topics(bootstrap_servers: str, partitions_by_topic: dict[str, int], timeout_s: float = 10.0) -> None:
    """Create the Kafka topics that do not exist yet (replication factor 1: for local brokers)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [
        NewTopic(name, num_partitions=count, replication_factor=1)
        for name, count in partitions_by_topic.items()
        if name not in existing
    ]
    if not wanted:
        return
    for name, future in admin.create_topics(wanted, operation_timeout=timeout_s).items():
        try:
            future.result()
        except Exception as error:  # noqa: BLE001 - a concurrent create is fine, anything else is not
            if "already exists" not in str(error).lower() and "TOPIC_ALREADY_EXISTS" not in str(error):
                raise BrokerError(f"could not create topic {name}: {error}") from error


def _clean(text: str) -> str:
    """Drop noida-db's harmless glibc warning from its output."""
    return "\n".join(line for line in text.splitlines() if "GLIBC" not in line).strip()
