"""The HTTP headers every delivery attempt carries (docs/design.md §4, Hermes' HTTP sender).

The fixed part is built once per task (`static_headers`); each attempt adds only its message id and retry count.
"""

from __future__ import annotations

import base64

MESSAGE_ID = "Hermes-Message-Id"
RETRY_COUNT = "Hermes-Retry-Count"
TOPIC_NAME = "Hermes-Topic-Name"
SUBSCRIPTION_NAME = "Hermes-Subscription-Name"
CONTENT_TYPE = "Content-Type"
AUTHORIZATION = "Authorization"
SCHEMA_ID = "Schema-Id"
SCHEMA_VERSION = "Schema-Version"

JSON_CONTENT_TYPE = "application/json"
AVRO_CONTENT_TYPE = "avro/binary"


def basic_authorization(user: str, password: str) -> str:
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


def static_headers(
    content_type: str,
    topic_name: str,
    subscription_name: str,
    identity_headers: bool,
    custom_headers: tuple[tuple[str, str], ...] = (),
    authorization: str | None = None,
) -> dict[str, str]:
    """The headers shared by every attempt of a subscription; the subscription's own headers come last."""
    headers = {CONTENT_TYPE: content_type}
    if identity_headers:
        headers[TOPIC_NAME] = topic_name
        headers[SUBSCRIPTION_NAME] = subscription_name
    for name, value in custom_headers:
        headers[name] = value
    if authorization is not None:
        headers[AUTHORIZATION] = authorization
    return headers


def attempt_headers(
    static: dict[str, str],
    message_id: str,
    retry_count: int,
    schema_id: int | None = None,
    schema_version: int | None = None,
) -> dict[str, str]:
    """`static` plus this attempt's message id and retry count (0 on the first attempt), and for Avro
    deliveries the Schema-Id / Schema-Version of the message's schema when known."""
    headers = dict(static)
    headers[MESSAGE_ID] = message_id
    headers[RETRY_COUNT] = str(retry_count)
    if schema_id is not None:
        headers[SCHEMA_ID] = str(schema_id)
    if schema_version is not None:
        headers[SCHEMA_VERSION] = str(schema_version)
    return headers
