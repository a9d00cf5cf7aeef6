"""The YAML files' schema, with Hermes' field names, defaults and limits (docs/design.md §4), in one place.

Models are frozen; unknown keys are errors. Units are as in the YAML (Hermes mixes s and ms); the properties
that hand values to the engine and the delivery code (`Subscription.delivery_spec`,
`StreamingSettings.batch_deadline_s`, `RateControlSettings.flow_settings()`, ...) convert them to seconds and
messages per second, here and nowhere else.
"""

from __future__ import annotations

import re
from enum import Enum
from functools import cached_property
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from herald.config.tls import Tls
from herald.delivery.flow import FlowSettings
from herald.delivery.oauth import TokenSource
from herald.delivery.policy import RetryPolicy
from herald.delivery.spec import BatchSpec, DeliverySpec
from herald.endpoint import Endpoint

TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.[A-Za-z0-9_-]+$")
SUBSCRIPTION_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- herald.yaml ----------------------------------------------------------------------------------------------
class KafkaSettings(Strict):
    bootstrapServers: str
    connector: Literal["auto", "spark", "python"] = "auto"
    cluster: str = "primary"  # stored in undelivered rows, as Hermes names its data centre
    properties: dict[str, str] = Field(default_factory=dict)  # client properties; may hold secrets: never logged

    def client_config(self) -> dict[str, str]:
        """confluent-kafka's settings for a client of this cluster (never log them: properties may hold secrets)."""
        return {"bootstrap.servers": self.bootstrapServers, **self.properties}


class StorageSettings(Strict):
    """maintenanceIntervalHours: hours between two compactions of the tables in a running job (None: never;
    `herald maintain` does it on demand). maintenanceRetentionHours: how old an unreferenced file must be before
    it is deleted."""

    path: str
    engine: Literal["auto", "spark", "deltalake"] = "auto"
    options: dict[str, str] = Field(default_factory=dict)  # object-store options for deltalake; never logged
    maintenanceIntervalHours: Annotated[float, Field(gt=0, le=8760)] | None = None
    maintenanceRetentionHours: Annotated[float, Field(ge=0, le=87600)] = 168


class StreamingSettings(Strict):
    """How `herald run` reads and paces its micro-batches. The YAML keeps Hermes-style millisecond names; the
    `*_s` properties give the engine seconds.

    triggerInterval: Spark's micro-batch interval (a Spark duration string, e.g. "1 second").
    maxOffsetsPerTrigger: most records per micro-batch.
    batchDeadlineMs: milliseconds each task of a micro-batch delivers, from the task's start, before its
        unfinished work is parked (retries) or left behind the subscription's position (messages not attempted
        yet).
    parkAfterMs: milliseconds that a subscription's retries, once nothing else is left for it in the
        micro-batch, keep being retried in the task before they are parked.
    configPollMs: milliseconds between two looks of a running job for configuration changes.
    """

    triggerInterval: str = "1 second"
    maxOffsetsPerTrigger: Annotated[int, Field(ge=1)] | None = 10000
    batchDeadlineMs: Annotated[int, Field(ge=1000, le=600_000)] = 10_000
    parkAfterMs: Annotated[int, Field(ge=0, le=60_000)] = 1000
    configPollMs: Annotated[int, Field(ge=200, le=600_000)] = 2000

    @property
    def batch_deadline_s(self) -> float:
        """batchDeadlineMs in seconds."""
        return self.batchDeadlineMs / 1000

    @property
    def park_after_s(self) -> float:
        """parkAfterMs in seconds."""
        return self.parkAfterMs / 1000

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


class MetricsSettings(Strict):
    """prometheusPort: serve Prometheus metrics on the driver on this port (None: not served; `herald run
    --metrics-port` overrides it). prometheusHost: the address to listen on."""

    prometheusPort: Annotated[int, Field(ge=0, le=65535)] | None = None
    prometheusHost: str = "0.0.0.0"


class OAuthProvider(Strict):
    """An OAuth 2 token issuer (seeds/001 "OAuth"); delays and timeouts in milliseconds, secrets never shown."""

    name: str
    tokenEndpoint: str
    clientId: str
    clientSecret: SecretStr
    tokenRequestInitialDelay: Annotated[int, Field(ge=0, le=3_600_000)] = 1000
    tokenRequestMaxDelay: Annotated[int, Field(ge=0, le=3_600_000)] = 30000
    requestTimeout: Annotated[int, Field(ge=100, le=300_000)] = 1000
    socketTimeout: Annotated[int, Field(ge=0, le=300_000)] = 500

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
            request_timeout_s=self.requestTimeout / 1000, socket_timeout_s=self.socketTimeout / 1000)


class HeraldSettings(Strict):
    kafka: KafkaSettings
    storage: StorageSettings
    schemaRegistry: SchemaRegistrySettings | None = None
    streaming: StreamingSettings = StreamingSettings()
    delivery: DeliverySettings = DeliverySettings()
    spark: SparkSettings = SparkSettings()
    rateControl: RateControlSettings = RateControlSettings()
    metrics: MetricsSettings = MetricsSettings()
    oauthProviders: list[OAuthProvider] = Field(default_factory=list)

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


# -- topics/*.yaml --------------------------------------------------------------------------------------------
class ContentType(str, Enum):
    JSON = "JSON"
    AVRO = "AVRO"


class Owner(Strict):
    source: str = "Plaintext"
    id: str


class Topic(Strict):
    name: str
    contentType: ContentType = ContentType.JSON
    kafkaTopic: str | None = None
    description: str = ""
    owner: Owner | None = None
    # AVRO topics: records are plain Avro binary written with this schema (a path relative to the conf
    # directory), or, without it, Confluent wire format with schemas from herald.yaml's schemaRegistry.
    schemaFile: str | None = None
    schemaSubject: str | None = None  # the registry subject for Schema-Version; default: <kafka topic>-value

    @field_validator("name")
    @classmethod
    def _qualified(cls, value: str) -> str:
        if not TOPIC_NAME.match(value):
            raise ValueError("must be a qualified name 'group.topic' of letters, digits, '.', '_' and '-'")
        return value

    @property
    def kafka_topic(self) -> str:
        return self.kafkaTopic or self.name

    @property
    def subject(self) -> str:
        return self.schemaSubject or f"{self.kafka_topic}-value"


# -- subscriptions/*.yaml -------------------------------------------------------------------------------------
class Header(Strict):
    name: str
    value: str

    @field_validator("name")
    @classmethod
    def _token(cls, value: str) -> str:
        if not HEADER_NAME.match(value):
            raise ValueError("must be an HTTP header name (letters, digits and !#$%&'*+.^_`|~-)")
        return value

    @field_validator("value")
    @classmethod
    def _single_line(cls, value: str) -> str:
        if "\r" in value or "\n" in value:
            raise ValueError("must not contain CR or LF")
        return value


class Filter(Strict):
    """A Hermes message filter; its path and matcher are checked here so one pass reports every problem."""

    type: Literal["jsonpath", "avropath", "header"]
    matcher: str
    path: str | None = Field(None, validate_default=True)
    header: str | None = Field(None, validate_default=True)
    matchingStrategy: str = "all"

    @field_validator("path")
    @classmethod
    def _path_required(cls, value: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("type")
        if kind in ("jsonpath", "avropath") and not value:
            raise ValueError(f"required for a {kind} filter")
        return value

    @field_validator("header")
    @classmethod
    def _header_required(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("type") == "header" and not value:
            raise ValueError("required for a header filter")
        return value

    @field_validator("matchingStrategy")
    @classmethod
    def _strategy(cls, value: str) -> str:
        if value.lower() not in ("all", "any"):
            raise ValueError("must be 'all' or 'any'")
        return value.lower()

    @model_validator(mode="after")
    def _valid_rule(self) -> Filter:
        from herald.filters import FilterError, check_rule

        try:
            check_rule(self.rule())
        except FilterError as error:
            raise ValueError(str(error)) from None
        return self

    def rule(self):
        """This filter as a `herald.filters.FilterRule` (what the compiler takes)."""
        from herald.filters import FilterRule

        return FilterRule(type=self.type, matcher=self.matcher, path=self.path, header=self.header,
                          matching_strategy=self.matchingStrategy)


class _RetryOptions(Strict):
    """The retry options SERIAL and BATCH share: Hermes' plus backoffJitter (RocketMQ) and maxAttempts (NSQ)."""

    messageTtl: Annotated[int, Field(ge=0, le=7200)] = 3600  # seconds
    backoffMultiplier: Annotated[float, Field(ge=1, le=10)] = 1.0
    backoffMaxIntervalInSec: Annotated[int, Field(ge=1, le=600)] = 600  # seconds
    backoffJitter: Annotated[float, Field(ge=0, lt=1)] = 0.0
    maxAttempts: Annotated[int, Field(ge=0)] = 0  # 0 = no limit
    retryClientErrors: bool = False


class SerialPolicy(_RetryOptions):
    """Hermes' serial subscriptionPolicy plus backoffJitter (RocketMQ) and maxAttempts (NSQ); units as named."""

    rate: Annotated[float, Field(ge=1)] = 400  # messages per second
    messageBackoff: Annotated[int, Field(ge=0)] = 100  # milliseconds
    requestTimeout: Annotated[int, Field(ge=100, le=300_000)] = 1000  # milliseconds
    socketTimeout: Annotated[int, Field(ge=0, le=300_000)] = 0  # milliseconds, 0 = none
    inflightSize: Annotated[int, Field(ge=1, le=10_000)] = 100
    sendingDelay: Annotated[int, Field(ge=0, le=5000)] = 0  # milliseconds


class BatchPolicy(_RetryOptions):
    """Hermes' batch subscriptionPolicy (deliveryType BATCH) plus the same retry extensions as SERIAL: a batch
    is sent once it holds batchSize messages, once the next message would take its body past batchVolume
    bytes, or batchTime milliseconds after its first message was read."""

    batchSize: Annotated[int, Field(ge=1, le=10_000)] = 100  # messages
    batchTime: Annotated[int, Field(ge=1, le=3_600_000)] = 30_000  # milliseconds
    batchVolume: Annotated[int, Field(ge=1, le=64 * 1024 * 1024)] = 64_000  # bytes of the request body
    messageBackoff: Annotated[int, Field(ge=0)] = 500  # milliseconds
    requestTimeout: Annotated[int, Field(ge=100, le=300_000)] = 30_000  # milliseconds


SERIAL_ONLY = tuple(sorted(set(SerialPolicy.model_fields) - set(BatchPolicy.model_fields)))
BATCH_ONLY = tuple(sorted(set(BatchPolicy.model_fields) - set(SerialPolicy.model_fields)))
BATCH_RATE_PER_S = 10_000.0  # attempts (batches) per second: Hermes' batch sender has no rate, so in effect none
# (at 400, the SERIAL default, the cap was what limited a backlog's drain: 40,000 messages a second)


def _url(value: str) -> str:
    """An endpoint URL, checked (placeholders included); the error masks its password."""
    Endpoint.parse(value)
    return value


KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class OnDiscard(Strict):
    """A dead-letter topic: every message the subscription discards is also published there (key and value as
    read, headers saying why and where from)."""

    topic: str

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        if not KAFKA_TOPIC.match(value) or value in (".", ".."):
            raise ValueError("must be a Kafka topic name: 1 to 249 letters, digits, '.', '_' or '-'")
        return value


class OAuthPolicy(Strict):
    """A subscription's OAuth 2 grant (seeds/001): clientCredentials, or password with the resource owner's
    username and password."""

    grantType: Literal["clientCredentials", "password"]
    providerName: str
    scope: str | None = None
    username: str | None = None
    password: SecretStr | None = None

    @model_validator(mode="after")
    def _credentials(self) -> OAuthPolicy:
        if self.grantType == "password" and (not self.username or self.password is None):
            raise ValueError("the password grant needs username and password")
        if self.grantType == "clientCredentials" and (self.username or self.password is not None):
            raise ValueError("the clientCredentials grant takes no username or password")
        return self


class Priority(Strict):
    """Which of a subscription's endpoints gets its traffic (docs/design.md §5b; NATS priority groups).

    policy pinned: every attempt goes to ONE endpoint, the pinned one (first in the list at the very start),
    with a `Herald-Pin-Id` header; it keeps the pin until it has accepted nothing (no 2xx) for `timeoutMs`
    milliseconds while it had messages to take, or an operator unpins it (`herald unpin`); then the next
    endpoint in list order is pinned, once the old one's requests have ended.
    """

    policy: Literal["pinned"]
    timeoutMs: Annotated[int, Field(ge=1000, le=86_400_000)] = 120_000


class Signing(Strict):
    """Standard Webhooks signing (`herald.delivery.signing`): one signature per secret, for key rotation.
    Secrets are normally `${env:NAME}` references; they are never shown."""

    secrets: Annotated[list[SecretStr], Field(min_length=1, max_length=10)]

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, value: list[SecretStr]) -> list[SecretStr]:
        from herald.delivery.signing import signing_key

        for index, secret in enumerate(value):
            try:
                signing_key(secret.get_secret_value())
            except ValueError as error:
                raise ValueError(f"secrets[{index}]: {error}") from None
        return value

    def keys(self) -> tuple[bytes, ...]:
        from herald.delivery.signing import signing_key

        return tuple(signing_key(secret.get_secret_value()) for secret in self.secrets)


class Subscription(Strict):
    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["endpoint"]}, {"required": ["endpoints"]}]})

    topicName: str
    name: str
    endpoint: str | None = None
    endpoints: Annotated[list[Annotated[str, AfterValidator(_url)]], Field(min_length=1, max_length=100)] | None = None
    description: str = ""
    owner: Owner | None = None
    contact: str | None = None
    state: Literal["ACTIVE", "SUSPENDED"] = "ACTIVE"
    contentType: ContentType = ContentType.JSON
    deliveryType: Literal["SERIAL", "BATCH"] = "SERIAL"
    mode: Literal["ANYCAST", "BROADCAST"] = "ANYCAST"
    trackingMode: Literal["trackingOff", "trackingAll", "discardedOnly"] = "trackingOff"
    subscriptionIdentityHeadersEnabled: bool = False
    headers: list[Header] = Field(default_factory=list)
    filters: list[Filter] = Field(default_factory=list)
    subscriptionPolicy: Annotated[SerialPolicy | BatchPolicy, Field(union_mode="left_to_right")] = SerialPolicy()
    endpointAddressResolverMetadata: dict = Field(default_factory=dict)  # accepted; the default resolver ignores it
    startingOffsets: Literal["latest", "earliest"] = "latest"
    signing: Signing | None = None
    onDiscard: OnDiscard | None = None
    oAuthPolicy: OAuthPolicy | None = None
    priority: Priority | None = None
    # HTTPS: as written, over herald.yaml's delivery.tls; once loaded (`load_config`), the settings in force: both
    # merged (`herald.config.tls`) and paths absolute
    tls: Tls | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _policy_of_its_delivery_type(cls, data, handler):
        """subscriptionPolicy is read as SerialPolicy or BatchPolicy by deliveryType, and an option of the other
        kind is named as such (its errors keep their `subscriptionPolicy.<key>` place)."""
        if not isinstance(data, dict):
            return handler(data)
        batch = data.get("deliveryType") == "BATCH"
        kind, raw = (BatchPolicy if batch else SerialPolicy), data.get("subscriptionPolicy")
        errors: list[InitErrorDetails] = []
        if isinstance(raw, dict):
            foreign, other = (SERIAL_ONLY, "SERIAL") if batch else (BATCH_ONLY, "BATCH")
            for key in foreign:
                if key in raw:
                    errors.append(InitErrorDetails(
                        type="value_error", loc=("subscriptionPolicy", key), input=raw[key],
                        ctx={"error": ValueError(f"a {other} option; deliveryType "
                                                 f"{'BATCH' if batch else 'SERIAL'} does not take it")}))
            raw = {key: value for key, value in raw.items() if key not in foreign}
            try:
                policy = kind.model_validate(raw)
            except ValidationError as error:
                errors += [InitErrorDetails(type=item["type"], loc=("subscriptionPolicy", *item["loc"]),
                                            input=item["input"], ctx=item.get("ctx") or {})
                           for item in error.errors()]
                policy = kind()
            data = {**data, "subscriptionPolicy": policy}
        elif raw is None and batch:
            data = {**data, "subscriptionPolicy": BatchPolicy()}
        try:
            result = handler(data)
        except ValidationError as error:
            if not errors:
                raise
            errors = [InitErrorDetails(type=item["type"], loc=item["loc"], input=item["input"],
                                       ctx=item.get("ctx") or {}) for item in error.errors()] + errors
            raise ValidationError.from_exception_data(cls.__name__, errors) from None
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return result

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SUBSCRIPTION_NAME.match(value):
            raise ValueError("must contain only letters, digits, '-' and '_'")
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return _url(value) if value is not None else None

    @field_validator("priority")
    @classmethod
    def _priority_over_several_endpoints(cls, value: Priority | None, info: ValidationInfo) -> Priority | None:
        if value is None:
            return value
        if len(info.data.get("endpoints") or ()) < 2:
            raise ValueError("a priority policy chooses among endpoints: give at least two in `endpoints`")
        if info.data.get("mode") == "BROADCAST":
            raise ValueError("mode BROADCAST sends every message to every endpoint; a priority policy needs ANYCAST")
        return value

    @model_validator(mode="after")
    def _one_endpoint_form(self) -> Subscription:
        if isinstance(self.subscriptionPolicy, BatchPolicy) != (self.deliveryType == "BATCH"):
            raise ValueError(f"subscriptionPolicy must be a {self.deliveryType} policy")
        if (self.endpoint is None) == (self.endpoints is None):
            raise ValueError("give either endpoint (one URL) or endpoints (a list of URLs)")
        if self.oAuthPolicy is not None and any(target.user is not None for target in self.targets):
            raise ValueError("oAuthPolicy and user:password@ in an endpoint exclude each other (OAuth sends a "
                             "Bearer token)")
        return self

    @property
    def id(self) -> str:
        """`group.topic.name`: the subscription's id everywhere (tables, CLI, checkpoints)."""
        return f"{self.topicName}.{self.name}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def endpoint_urls(self) -> list[str]:
        """The configured URLs (credentials included: never show them; see `targets`)."""
        return [self.endpoint] if self.endpoint is not None else list(self.endpoints or [])

    @property
    def targets(self) -> list[Endpoint]:
        """Every endpoint, credentials split out (ANYCAST spreads attempts over them round-robin)."""
        return [Endpoint.parse(url) for url in self.endpoint_urls]

    @property
    def target(self) -> Endpoint:
        """The first (or only) endpoint."""
        return self.targets[0]

    @cached_property
    def delivery_spec(self) -> DeliverySpec:
        """subscriptionPolicy in the delivery code's units (seconds, messages per second), converted once.

        messageTtl s, messageBackoff ms, backoffMaxIntervalInSec s, requestTimeout ms, socketTimeout ms and
        sendingDelay ms all become float seconds; rate stays messages per second for the whole subscription and
        inflightSize messages for the whole subscription. messageTtl 0 stays 0 (exactly one attempt). BATCH:
        batchTime ms becomes seconds, batchVolume stays bytes, and attempts (one per batch) are capped at
        `BATCH_RATE_PER_S`.
        """
        policy = self.subscriptionPolicy
        retry = RetryPolicy(
            message_ttl_s=float(policy.messageTtl),
            backoff_s=policy.messageBackoff / 1000,
            backoff_multiplier=float(policy.backoffMultiplier),
            max_backoff_s=float(policy.backoffMaxIntervalInSec),
            backoff_jitter=float(policy.backoffJitter),
            max_attempts=policy.maxAttempts,
            retry_client_errors=policy.retryClientErrors,
        )
        if isinstance(policy, BatchPolicy):
            return DeliverySpec(
                retry=retry, rate_per_s=BATCH_RATE_PER_S, inflight=10_000,
                request_timeout_s=policy.requestTimeout / 1000,
                socket_timeout_s=0.0, sending_delay_s=0.0,  # Hermes' batch policy has neither
                batch=BatchSpec(size=policy.batchSize, time_s=policy.batchTime / 1000,
                                volume_bytes=policy.batchVolume))
        return DeliverySpec(
            retry=retry,
            rate_per_s=float(policy.rate),
            inflight=policy.inflightSize,
            request_timeout_s=policy.requestTimeout / 1000,
            socket_timeout_s=policy.socketTimeout / 1000,
            sending_delay_s=policy.sendingDelay / 1000,
            batch=None,
        )

    def retry_policy(self) -> RetryPolicy:
        """The retry part of `delivery_spec` (seconds)."""
        return self.delivery_spec.retry

    def model_copy(self, *, update=None, deep: bool = False) -> Subscription:
        """A copy; with `update`, its `delivery_spec` is built again from the new values."""
        copy = super().model_copy(update=update, deep=deep)
        if update:
            copy.__dict__.pop("delivery_spec", None)
        return copy

    def __repr__(self) -> str:  # never show the endpoint's password
        shown = ", ".join(target.masked for target in self.targets)
        return f"Subscription({self.id!r}, endpoint={shown!r}, state={self.state})"

    __str__ = __repr__
