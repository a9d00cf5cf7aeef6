"""The schema of topics/*.yaml and subscriptions/*.yaml, with Hermes' field names, defaults and limits
(docs/design.md §4); a subscription's subscriptionPolicy is in `herald.config.policies`, herald.yaml's schema in
`herald.config.settings`.

Models are frozen; unknown keys are errors (`herald.config.base.Strict`). Units are as in the YAML (Hermes mixes
s and ms); `Subscription.delivery_spec` gives the delivery code the policy in seconds and messages per second,
converted in `herald.config.policies` and nowhere else (herald.yaml's values in `herald.config.settings`).
"""

from __future__ import annotations

import re
from enum import Enum
from functools import cached_property
from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from herald.config.base import Strict
from herald.config.endpoints import (
    DiscoveredEndpoints,
    Discovery,
    EndpointEntry,
    Endpoints,
    Priority,
    checked_url,
)
from herald.config.policies import BATCH_ONLY, SERIAL_ONLY, BatchPolicy, SerialPolicy, delivery_spec_of
from herald.config.tls import Tls
from herald.delivery.policy import RetryPolicy
from herald.delivery.spec import DeliverySpec
from herald.endpoint import Endpoint

TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.[A-Za-z0-9_-]+$")
KAFKA_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's own rule (and neither "." nor "..")
SUBSCRIPTION_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token


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

    @field_validator("kafkaTopic")
    @classmethod
    def _kafka_name(cls, value: str | None) -> str | None:
        if value is not None and (not KAFKA_TOPIC_NAME.fullmatch(value) or value in (".", "..")):
            raise ValueError("must be a Kafka topic name: 1 to 249 letters, digits, '.', '_' and '-'")
        return value

    @model_validator(mode="after")
    def _name_fits_kafka(self) -> Topic:
        if self.kafkaTopic is None and len(self.name) > 249:  # the name is the Kafka topic
            raise ValueError(f"name: must be at most 249 characters, Kafka's limit for a topic name, or set "
                             f"kafkaTopic (got {len(self.name)})")
        return self

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
    endpoints: Endpoints | None = None  # URLs, entries with conditions, or discovery
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
        return checked_url(value) if value is not None else None

    @field_validator("priority")
    @classmethod
    def _priority_over_several_endpoints(cls, value: Priority | None, info: ValidationInfo) -> Priority | None:
        if value is None:
            return value
        endpoints = info.data.get("endpoints")
        if not isinstance(endpoints, DiscoveredEndpoints) and len(endpoints or ()) < 2:
            raise ValueError("a priority policy chooses among endpoints: give at least two in `endpoints` (or "
                             "endpoints.discovery)")
        if info.data.get("mode") == "BROADCAST":
            raise ValueError("mode BROADCAST sends every message to every endpoint; a priority policy needs ANYCAST")
        if value.policy == "overflow" and isinstance(endpoints, list) and all(
                isinstance(entry, EndpointEntry) and entry.conditional for entry in endpoints):
            raise ValueError("policy overflow serves the endpoints without conditions first: give at least one")
        return value

    @model_validator(mode="after")
    def _one_endpoint_form(self) -> Subscription:
        if isinstance(self.subscriptionPolicy, BatchPolicy) != (self.deliveryType == "BATCH"):
            raise ValueError(f"subscriptionPolicy must be a {self.deliveryType} policy")
        if (self.endpoint is None) == (self.endpoints is None):
            raise ValueError("give either endpoint (one URL) or endpoints (a list of URLs)")
        overflow = self.priority is not None and self.priority.policy == "overflow"
        for index, entry in enumerate(self.endpoint_entries):
            for key in ("minPending", "minInflight"):
                if getattr(entry, key) is not None and not overflow:
                    raise ValueError(f"endpoints[{index}].{key}: a condition of priority policy overflow; give "
                                     "`priority: {policy: overflow}` or remove it")
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
    def endpoint_entries(self) -> list[EndpointEntry]:
        """The configured endpoints with their conditions, if any (none when they are discovered)."""
        if self.endpoint is not None:
            return [EndpointEntry(url=self.endpoint)]
        if not isinstance(self.endpoints, list):
            return []
        return [entry if isinstance(entry, EndpointEntry) else EndpointEntry(url=entry) for entry in self.endpoints]

    @property
    def discovery(self) -> Discovery | None:
        """How its endpoints are discovered (None: they are configured)."""
        return self.endpoints.discovery if isinstance(self.endpoints, DiscoveredEndpoints) else None

    @property
    def endpoint_urls(self) -> list[str]:
        """The configured URLs (credentials included: never show them; see `targets`); none when discovered."""
        return [entry.url for entry in self.endpoint_entries]

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
        """subscriptionPolicy in the delivery code's units (seconds, messages per second), converted once
        (`herald.config.policies.delivery_spec_of`)."""
        return delivery_spec_of(self.subscriptionPolicy)

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
