"""herald.yaml's schema: the Kafka cluster, the tables' storage, streaming, delivery, Spark, rate control, the
schema registry, metrics and the OAuth providers, with Hermes' names and defaults where Hermes has them.

As the topic and subscription models (`herald.config.model`): frozen, unknown keys are errors, units as in the
YAML; the properties that hand values to the engine and the delivery code (`StreamingSettings.batch_deadline_s`,
`RateControlSettings.flow_settings()`, `OAuthProvider.token_source()`, ...) convert them to seconds, here and
nowhere else.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator

from herald import kafka_properties
from herald.config.base import Strict
from herald.config.model import OAuthPolicy, OnDiscard
from herald.config.tls import Tls
from herald.delivery.flow import FlowSettings
from herald.delivery.oauth import TokenSource
from herald.endpoint import Endpoint


class KafkaSettings(Strict):
    bootstrapServers: str
    connector: Literal["auto", "spark", "python"] = "auto"
    cluster: str = "primary"  # stored in undelivered rows, as Hermes names its data centre
    # client properties, in Java's or librdkafka's names (herald.kafka_properties); may hold secrets: never logged
    properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("properties")
    @classmethod
    def _both_clients_read_them(cls, properties: dict[str, str]) -> dict[str, str]:
        kafka_properties.check(properties)  # Spark's source reads Java's names, the other clients librdkafka's
        return properties

    def client_config(self) -> dict[str, str]:
        """confluent-kafka's settings for a client of this cluster, the properties in librdkafka's names (never log
        them: properties may hold secrets)."""
        return kafka_properties.for_librdkafka({**self.properties, "bootstrap.servers": self.bootstrapServers})


class StorageSettings(Strict):
    """maintenanceIntervalHours: hours between two compactions of the tables in a running job (None: never;
    `herald maintain` does it on demand). maintenanceRetentionHours: how old an unreferenced file must be before
    it is deleted; the tables' log and deleted-file retentions are the same (`herald.storage.properties`). At
    least an hour: the job's maintenance runs beside its writes and reads (with delta-spark a file written and not
    committed yet is unreferenced too; with delta-rs a read may still need the files a compaction replaced).
    commitIntervalMs: the least time between two writes of the table writer, so that rounds gather into one
    commit per table (0: write each round as soon as the last write ended). A minute by default, as Hermes
    commits its offsets: a crash delivers up to that minute again. urgentCommitMs: the most milliseconds a
    gathering lasts after a round with a discard, a loss or a newly parked message was handed over
    (`herald.engine.round.result.urgent`), so that an operator finds its row within seconds (no effect above
    commitIntervalMs).
    offsetsRetentionHours / historyRetentionHours: how old a row of history must be before maintenance deletes it
    (None: never; `herald.storage.history`): offsets rows that are not a position any more (a position's newest
    row stays, however old), and metrics, tracking and retries rows (a parked or held message's newest retries
    row stays). At least an hour: maintenance runs beside the job's writes."""

    path: str
    engine: Literal["auto", "spark", "deltalake"] = "auto"
    options: dict[str, str] = Field(default_factory=dict)  # object-store options for deltalake; never logged
    maintenanceIntervalHours: Annotated[float, Field(gt=0, le=8760)] | None = 6
    maintenanceRetentionHours: Annotated[float, Field(ge=1, le=87600)] = 168
    commitIntervalMs: Annotated[int, Field(ge=0, le=600_000)] = 60_000
    urgentCommitMs: Annotated[int, Field(ge=0, le=600_000)] = 5000
    offsetsRetentionHours: Annotated[float, Field(ge=1, le=87600)] | None = 6
    historyRetentionHours: Annotated[float, Field(ge=1, le=87600)] | None = 168

    def history_retention(self):
        """The retentions as maintenance takes them (`herald.storage.history.HistoryRetention`)."""
        from herald.storage.history import HistoryRetention

        return HistoryRetention(offsets_hours=self.offsetsRetentionHours, history_hours=self.historyRetentionHours)


class StreamingSettings(Strict):
    """How `herald run` reads and paces its micro-batches. The YAML keeps Hermes-style millisecond names; the
    `*_s` properties give the engine seconds.

    triggerInterval: Spark's micro-batch interval (a Spark duration string, e.g. "1 second").
    maxOffsetsPerTrigger: most records per micro-batch, all topics of the job together (Spark shares them out over
        the partitions by their backlog); also the most a catch-up round reads.
    batchDeadlineMs: milliseconds each task of a micro-batch delivers, from the task's start, before its
        unfinished work is parked (retries) or left behind the subscription's position (messages not attempted
        yet).
    parkAfterMs: milliseconds that a subscription's retries, once nothing else is left for it in the
        micro-batch, keep being retried in the task before they are parked.
    requestGraceMs: milliseconds a request still open when a subscription's delivery in a task ends (its
        deadline, parkAfterMs, a change) may take to answer before it is aborted and counts as a timeout. It bounds
        what a subscriber that never answers costs the others; a subscriber whose answers take longer has the
        requests of each round's end aborted and sent again.
    configPollMs: milliseconds between two looks of a running job for configuration changes.
    controlPort: the TCP port of the driver's control endpoint, which running tasks ask every configPollMs which
        subscriptions are delivered (0: a free port; on a cluster whose network lets only some ports through
        from executors to the driver, one of those).
    """

    triggerInterval: str = "1 second"
    maxOffsetsPerTrigger: Annotated[int, Field(ge=1)] | None = 10000
    batchDeadlineMs: Annotated[int, Field(ge=1000, le=600_000)] = 10_000
    parkAfterMs: Annotated[int, Field(ge=0, le=60_000)] = 1000
    requestGraceMs: Annotated[int, Field(ge=0, le=60_000)] = 1000
    configPollMs: Annotated[int, Field(ge=200, le=600_000)] = 2000
    controlPort: Annotated[int, Field(ge=0, le=65535)] = 0

    @property
    def batch_deadline_s(self) -> float:
        """batchDeadlineMs in seconds."""
        return self.batchDeadlineMs / 1000

    @property
    def park_after_s(self) -> float:
        """parkAfterMs in seconds."""
        return self.parkAfterMs / 1000

    @property
    def request_grace_s(self) -> float:
        """requestGraceMs in seconds."""
        return self.requestGraceMs / 1000

    @property
    def config_poll_s(self) -> float:
        """configPollMs in seconds."""
        return self.configPollMs / 1000


class DeliverySettings(Strict):
    """The senders in the Spark tasks.

    transport: the HTTP client: 'curl' (pycurl's multi interface, no threads), 'requests' (requests on a
        bounded thread pool), or 'auto' (curl when pycurl loads, requests otherwise).
    maxOpenRequests: most HTTP requests open at once in one Spark task, over all its subscriptions.
    tls: HTTPS settings of every subscription (CA bundle, client certificate), which a subscription's own `tls`
        overrides (`herald.config.tls`).
    """

    transport: Literal["auto", "curl", "requests"] = "auto"
    maxOpenRequests: Annotated[int, Field(ge=1, le=10_000)] = 512
    tls: Tls | None = None


class SparkSettings(Strict):
    master: str | None = None  # used only when nothing (spark-submit, Databricks) has set one
    conf: dict[str, str] = Field(default_factory=dict)


class RateControlSettings(Strict):
    """Tuning of the adaptive rate controller (herald.delivery.flow); defaults follow Hermes.

    adjustIntervalMs / heartbeatIntervalMs: milliseconds (the controller's window, Hermes' 30 s period, and the
    interval of single probes under sustained failure); slowRate: messages per second; the rest are ratios.
    `flow_settings()` converts them to seconds.
    """

    adjustIntervalMs: Annotated[int, Field(ge=100, le=600_000)] = 30_000
    convergenceFactor: Annotated[float, Field(gt=0, lt=1)] = 0.2
    speedUpToleranceRatio: Annotated[float, Field(ge=0, le=1)] = 0.01
    slowDownToleranceRatio: Annotated[float, Field(ge=0, le=1)] = 0.05
    slowRate: Annotated[float, Field(gt=0)] = 1.0
    heartbeatIntervalMs: Annotated[int, Field(ge=10, le=3_600_000)] = 60_000

    def flow_settings(self) -> FlowSettings:
        return FlowSettings(
            adjust_interval_s=self.adjustIntervalMs / 1000,
            convergence=self.convergenceFactor,
            speedup_tolerance=self.speedUpToleranceRatio,
            slowdown_tolerance=self.slowDownToleranceRatio,
            slow_rate_per_s=self.slowRate,
            heartbeat_interval_s=self.heartbeatIntervalMs / 1000,
        )


class SchemaRegistrySettings(Strict):
    url: str  # Confluent-compatible; user:password@ in the URL for Basic auth (never shown)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        Endpoint.parse(value)
        return value


class AvroSettings(Strict):
    """decoder: how AVRO topics are decoded: `fastavro` (in Python, the default: it measured about twice the rows
    per CPU-second of from_avro, tests/benchmarks/avro_decode.py), `spark` (spark-avro's from_avro, in the JVM,
    the same results), `auto` (from_avro where spark-avro's classes load); `herald.avro.jvm`."""

    decoder: Literal["auto", "spark", "fastavro"] = "fastavro"


class MetricsSettings(Strict):
    """prometheusPort: serve Prometheus metrics on the driver on this port (None: not served; `herald run
    --metrics-port` overrides it). prometheusHost: the address to listen on."""

    prometheusPort: Annotated[int, Field(ge=0, le=65535)] | None = None
    prometheusHost: str = "0.0.0.0"


class OAuthProvider(Strict):
    """An OAuth 2 token issuer (seeds/001 "OAuth"); delays and timeouts in milliseconds, secrets never shown.
    tls: the HTTPS settings of its token requests, over delivery.tls key by key (the token endpoint is another
    server than the subscribers: it may need another CA or client certificate)."""

    name: str
    tokenEndpoint: str
    clientId: str
    clientSecret: SecretStr
    tokenRequestInitialDelay: Annotated[int, Field(ge=0, le=3_600_000)] = 1000
    tokenRequestMaxDelay: Annotated[int, Field(ge=0, le=3_600_000)] = 30000
    requestTimeout: Annotated[int, Field(ge=100, le=300_000)] = 1000
    socketTimeout: Annotated[int, Field(ge=0, le=300_000)] = 500
    tls: Tls | None = None  # once loaded (`load_config`), the settings in force: its own over delivery.tls, paths
    # absolute (`herald.config.tls`)

    @field_validator("tokenEndpoint")
    @classmethod
    def _token_endpoint(cls, value: str) -> str:
        endpoint = Endpoint.parse(value)
        if endpoint.user is not None or "{" in value:
            raise ValueError("the token endpoint takes no credentials or placeholders (clientId and clientSecret "
                             "authenticate)")
        return value

    def token_source(self, policy: OAuthPolicy) -> TokenSource:
        """What the tasks need to get a token for a subscription's `policy` from this provider (delays and
        timeouts converted to seconds here)."""
        return TokenSource(
            provider=self.name, token_endpoint=self.tokenEndpoint, client_id=self.clientId,
            client_secret=self.clientSecret.get_secret_value(), grant_type=policy.grantType, scope=policy.scope,
            username=policy.username, password=policy.password.get_secret_value() if policy.password else None,
            initial_delay_s=self.tokenRequestInitialDelay / 1000, max_delay_s=self.tokenRequestMaxDelay / 1000,
            request_timeout_s=self.requestTimeout / 1000, socket_timeout_s=self.socketTimeout / 1000,
            tls=self.tls.settings() if self.tls is not None else None)  # in force: load_config merged it


class AdvisoriesSettings(OnDiscard):
    """A Kafka topic that gets every priority advisory (a pin given or given up) as JSON, besides the
    `advisories` table (`herald.engine.endpoints.advisories`)."""


class HeraldSettings(Strict):
    kafka: KafkaSettings
    storage: StorageSettings
    schemaRegistry: SchemaRegistrySettings | None = None
    avro: AvroSettings = AvroSettings()
    streaming: StreamingSettings = StreamingSettings()
    delivery: DeliverySettings = DeliverySettings()
    spark: SparkSettings = SparkSettings()
    rateControl: RateControlSettings = RateControlSettings()
    metrics: MetricsSettings = MetricsSettings()
    oauthProviders: list[OAuthProvider] = Field(default_factory=list)
    advisories: AdvisoriesSettings | None = None

    @field_validator("oauthProviders")
    @classmethod
    def _unique_providers(cls, value: list[OAuthProvider]) -> list[OAuthProvider]:
        names = [provider.name for provider in value]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"provider names must be unique: {', '.join(repeated)} repeated")
        return value

    def oauth_provider(self, name: str) -> OAuthProvider | None:
        return next((provider for provider in self.oauthProviders if provider.name == name), None)
