"""A real Apache Kafka broker for tests: Kafka's own server (KRaft, one node that is broker and controller) on
127.0.0.1, run from the jars `tests.support.kafka_dist` fetches.

    broker = KafkaBroker(tmp_path / "kafka")
    broker.start()                                   # formats the storage the first time, waits until it answers
    broker.create_topics({"t": 1}, configs={"t": {"retention.ms": "60000"}})
    broker.add_partitions("t", 3)
    broker.alter_topic_config("t", {"retention.ms": "1000"})
    broker.restart()                                 # same ports, same data
    broker.delete_topics(["t"])
    broker.stop()

It has `bootstrap_servers` and `create_topics(partitions_by_topic)` as `herald.broker.EmbeddedBroker` has, so
tests can take either.

With `sasl_ssl=True` it also listens for SASL_SSL on `sasl_port` (`sasl_bootstrap_servers`), as production
brokers do: TLS with a certificate for 127.0.0.1 and localhost that a test CA signed (`pki.ca`, a PEM file
clients trust), and SASL with PLAIN and SCRAM-SHA-512, user `SASL_USER` with password `SASL_PASSWORD` for
both. PLAINTEXT stays the listener between broker and controller and the one the other tests and the helpers
here use. The settings in `SERVER_PROPERTIES` make retention act within seconds (a retention check
every second, from the start) and keep a one-node cluster small (internal topics of one partition, one replica).
"""

from __future__ import annotations

import base64
import subprocess
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from herald.broker import BrokerError
from tests.support import kafka_dist
from tests.support.tls_certs import TestPki

SERVER_PROPERTIES = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # a deleted topic stays deleted: clients asking for it do not bring it back
    "auto.create.topics.enable": "false",
    # retention is checked every second from the start (defaults: 5 minutes, after 30 s)
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "0",
    "log.segment.delete.delay.ms": "1000",
}
SASL_USER = "herald"
SASL_PASSWORD = "sasl-pw-7Qk2vX9z"  # unique enough that a test can look for it in logs
# SASL_SSL: the listener's TLS from PEM files (no keytool, no JKS), PLAIN's users in its JAAS config, and
# SCRAM-SHA-512, whose credentials live in the cluster metadata (added when the storage is formatted).
_SASL_SSL_PROPERTIES = {
    "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
    "listener.name.sasl_ssl.plain.sasl.jaas.config":
        f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{SASL_USER}="{SASL_PASSWORD}";',
    "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
}

# The JVM's heap bounds and C1 only: it starts faster and takes less CPU on a 2-core machine shared with Spark.
JVM_OPTIONS = ("-Xms64m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

_LOG4J2 = """status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
"""


def _free_port() -> int:
    from tests.conftest import free_port

    return free_port()


class KafkaBroker:
    """Kafka's server on 127.0.0.1:`port` (its controller on `controller_port`), its data in `data_dir`.

    `properties` add to or override `SERVER_PROPERTIES`. After `start()`, `started_in_s` is the seconds from
    launching the JVM until the broker answered a metadata request. With `sasl_ssl`, a SASL_SSL listener on
    `sasl_port` too (its CA and certificate in `pki`, made once in data_dir/pki).
    """

    def __init__(self, data_dir: Path, port: int | None = None, controller_port: int | None = None,
                 properties: dict[str, str] | None = None, sasl_ssl: bool = False) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or _free_port()
        self.controller_port = controller_port or _free_port()
        self.properties = dict(properties or {})
        self.sasl_port = _free_port() if sasl_ssl else None
        self.pki: TestPki | None = None
        self.started_in_s: float | None = None
        self._process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def sasl_bootstrap_servers(self) -> str:
        if self.sasl_port is None:
            raise BrokerError("this broker has no SASL_SSL listener (KafkaBroker(..., sasl_ssl=True))")
        return f"127.0.0.1:{self.sasl_port}"

    def _admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})

    # -- process ------------------------------------------------------------------------------------------------
    def _write_config(self) -> Path:
        listeners = f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
        advertised = f"PLAINTEXT://127.0.0.1:{self.port}"
        settings = {
            **SERVER_PROPERTIES,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": listeners,
            "advertised.listeners": advertised,
            "log.dirs": str(self.data_dir / "logs"),
        }
        if self.sasl_port is not None:
            settings.update({
                "listeners": f"{listeners},SASL_SSL://127.0.0.1:{self.sasl_port}",
                "advertised.listeners": f"{advertised},SASL_SSL://127.0.0.1:{self.sasl_port}",
                "listener.security.protocol.map": f"{SERVER_PROPERTIES['listener.security.protocol.map']},"
                                                  "SASL_SSL:SASL_SSL",
                **_SASL_SSL_PROPERTIES,
                "listener.name.sasl_ssl.ssl.keystore.location": str(self._keystore()),
            })
        settings.update(self.properties)
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2.format(log=self.log_file))
        return path

    def _keystore(self) -> Path:
        """The SASL_SSL listener's PEM key store (its key, then its certificate), made with the test CA once."""
        keystore = self.data_dir / "pki" / "broker-keystore.pem"
        self.pki = TestPki(self.data_dir / "pki")
        if not keystore.exists():
            self.pki = TestPki.create(self.data_dir / "pki")
            keystore.write_bytes(self.pki.server_key.read_bytes() + self.pki.server_cert.read_bytes())
        return keystore

    def _java(self, main: str, *args: str) -> list[str]:
        classpath = ":".join(kafka_dist.fetch())
        return [kafka_dist.java(), *JVM_OPTIONS, f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                "-cp", classpath, main, *args]

    def _format(self, config: Path) -> None:
        """Format the storage with a random cluster id (once: a restart keeps the data)."""
        if (self.data_dir / "logs" / "meta.properties").exists():
            return
        cluster_id = "-"
        while cluster_id.startswith("-"):  # as Kafka's Uuid.randomUuid: a leading '-' reads as an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        scram = (("--add-scram", f"SCRAM-SHA-512=[name={SASL_USER},password={SASL_PASSWORD}]")
                 if self.sasl_port is not None else ())
        result = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config),
                                           *scram),
                                capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise BrokerError(f"kafka-storage format failed: {(result.stdout + result.stderr)[-2000:]}")

    def start(self, wait_s: float = 90.0) -> None:
        """Start the server (formatting its storage the first time) and wait until it answers metadata requests.

        Raises BrokerError when it exits or does not answer within `wait_s` seconds.
        """
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        self._format(config)
        began = time.monotonic()
        with open(self.data_dir / "stdout.log", "ab") as out:
            self._process = subprocess.Popen(self._java("kafka.Kafka", str(config)), stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        while time.monotonic() - began < wait_s:
            if self._process.poll() is not None:
                raise BrokerError(f"kafka exited with {self._process.returncode}: {self._log_tail()}")
            if self._answers():
                self.started_in_s = time.monotonic() - began
                return
            time.sleep(0.1)
        self.stop()
        raise BrokerError(f"kafka did not answer on {self.bootstrap_servers} within {wait_s} s: {self._log_tail()}")

    def _answers(self) -> bool:
        try:
            return bool(self._admin().list_topics(timeout=1).brokers)
        except Exception:  # noqa: BLE001 - any failure means "not ready yet"
            return False

    def _log_tail(self) -> str:
        texts = [path.read_text(errors="replace")[-1500:] for path in (self.data_dir / "stdout.log", self.log_file)
                 if path.exists()]
        return "\n".join(texts).strip()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running else None

    def rss_bytes(self) -> int:
        """The server's resident memory now, in bytes (0 when it is not running)."""
        if not self.running:
            return 0
        for line in Path(f"/proc/{self._process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server (SIGTERM: a controlled shutdown; SIGKILL after `timeout_s` seconds); data stays."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        self._process = None

    def restart(self, down_s: float = 0.0) -> None:
        """Stop, stay down `down_s` seconds, start again on the same ports with the same data."""
        self.stop()
        time.sleep(down_s)
        self.start()

    # -- topics ---------------------------------------------------------------------------------------------------
    def create_topics(self, partitions_by_topic: dict[str, int], configs: dict[str, dict[str, str]] | None = None,
                      timeout_s: float = 30.0) -> None:
        """Create the topics (replication factor 1; `configs`: topic -> its settings, e.g. retention.ms) and wait
        until each partition has a leader."""
        admin = self._admin()
        existing = set(admin.list_topics(timeout=timeout_s).topics)
        wanted = [NewTopic(name, num_partitions=count, replication_factor=1, config=(configs or {}).get(name, {}))
                  for name, count in partitions_by_topic.items() if name not in existing]
        for _name, future in (admin.create_topics(wanted, operation_timeout=timeout_s).items() if wanted else ()):
            future.result()
        for name, count in partitions_by_topic.items():
            self._wait_for(lambda n=name, c=count: self._leaders(n) >= c, timeout_s, f"topic {name} has no leaders")

    def add_partitions(self, topic: str, total: int, timeout_s: float = 30.0) -> None:
        """Grow `topic` to `total` partitions and wait until each has a leader."""
        admin = self._admin()  # kept referenced until its futures resolve
        for future in admin.create_partitions([NewPartitions(topic, total)]).values():
            future.result()
        self._wait_for(lambda: self._leaders(topic) >= total, timeout_s, f"{topic} did not reach {total} partitions")

    def delete_topics(self, topics: list[str], timeout_s: float = 30.0) -> None:
        """Delete the topics and wait until the broker no longer lists them."""
        admin = self._admin()
        for future in admin.delete_topics(topics, operation_timeout=timeout_s).values():
            future.result()
        self._wait_for(lambda: not set(topics) & set(admin.list_topics(timeout=5).topics), timeout_s,
                       f"{topics} still listed")

    def alter_topic_config(self, topic: str, settings: dict[str, str]) -> None:
        """Set topic-level configs (e.g. retention.ms), leaving the others as they are."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET) for key, value in settings.items()])
        admin = self._admin()
        for future in admin.incremental_alter_configs([resource]).values():
            future.result()

    def watermarks(self, topic: str, partition: int = 0) -> tuple[int, int]:
        """(earliest offset still held, end offset) of one partition."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": "herald-tests",
                             "log_level": 0})
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        finally:
            consumer.close()

    def _leaders(self, topic: str) -> int:
        found = self._admin().list_topics(topic=topic, timeout=5).topics.get(topic)
        if found is None or found.error is not None:
            return 0
        return sum(1 for partition in found.partitions.values() if partition.leader >= 0)

    @staticmethod
    def _wait_for(condition, timeout_s: float, failure: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.1)
        raise BrokerError(failure)
