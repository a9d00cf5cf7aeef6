"""A client of a Confluent-compatible schema registry, with answers cached per process.

Spark reuses its Python workers, so the module-level cache makes one registry call per schema id per
executor process, not per record; only answers are cached, never failures. Credentials in the URL
(`https://user:pass@host`) are used for Basic auth and never appear in errors or logs.

What a failure means for the records (`herald.avro.decode`):
- `UnknownSchemaError`: the registry says the schema id, subject or version does not exist (404 with a Confluent
  error code 404xx, e.g. 40403). The only failure that makes a record undecodable (DISCARDED).
- `RegistryUnavailableError`: unreachable, timed out, 5xx, 408 or 429, still after `ATTEMPTS` tries with
  jittered backoff (`FIRST_WAIT_S`, `MAX_WAIT_S`). The round fails and is run again later.
- any other `SchemaRegistryError` (credentials refused, a 404 that is not a registry's answer: a wrong URL): the
  round fails too; nothing is discarded for a registry that could not say whether the schema exists.

Endpoints used: GET /schemas/ids/{id}, GET /schemas/ids/{id}/versions, GET /subjects/{subject}/versions/latest,
GET /subjects/{subject}/versions and /versions/{version} (the driver, for from_avro: `herald.avro.jvm`),
POST /subjects/{subject}/versions (registering, for `herald publish` and tests).
"""

from __future__ import annotations

import threading
from typing import Any

import requests
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from herald.endpoint import Endpoint, mask_secrets

_CACHE: dict[tuple[str, str], Any] = {}
_CACHE_LOCK = threading.Lock()

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


ATTEMPTS = 4  # tries of one request before a RegistryUnavailableError
FIRST_WAIT_S = 0.2  # jittered exponential wait between tries, seconds
MAX_WAIT_S = 3.0


class SchemaRegistryError(RuntimeError):
    """The registry could not say what was asked (see the module's docs for what each kind means)."""


class UnknownSchemaError(SchemaRegistryError):
    """The registry says this schema id, subject or version does not exist."""


class RegistryUnavailableError(SchemaRegistryError):
    """The registry could not answer (unreachable, timed out, 5xx, 408, 429) after `ATTEMPTS` tries."""


class RegistryClient:
    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        endpoint = Endpoint.parse(url)
        self.url = endpoint.url.rstrip("/")
        self.masked = endpoint.masked.rstrip("/")
        self._auth = (endpoint.user, endpoint.password or "") if endpoint.user is not None else None
        self.timeout_s = timeout_s

    def __reduce__(self):
        raise TypeError("RegistryClient is created on each executor; ship the registry URL instead")

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        for attempt in Retrying(retry=retry_if_exception_type(RegistryUnavailableError),
                                stop=stop_after_attempt(ATTEMPTS), reraise=True,
                                wait=wait_random_exponential(multiplier=FIRST_WAIT_S, max=MAX_WAIT_S)):
            with attempt:
                return self._request_once(method, path, body)

    def _request_once(self, method: str, path: str, body: dict | None) -> Any:
        try:
            response = requests.request(method, f"{self.url}{path}", json=body, auth=self._auth,
                                        timeout=self.timeout_s, headers={"Accept": CONTENT_TYPE})
        except requests.RequestException as error:
            raise RegistryUnavailableError(f"schema registry {self.masked} unreachable: {type(error).__name__}") \
                from None
        status = response.status_code
        if status == 404 and _error_code(response) // 100 == 404:
            raise UnknownSchemaError(f"schema registry {self.masked}: {path} not found")
        if status >= 500 or status in (408, 429):
            raise RegistryUnavailableError(f"schema registry {self.masked}: {method} {path} answered {status}")
        if status >= 300:
            hint = " (not a schema registry's answer: is the URL right?)" if status == 404 else ""
            raise SchemaRegistryError(mask_secrets(
                f"schema registry {self.masked}: {method} {path} answered {status}{hint}: {response.text[:200]}"))
        try:
            return response.json()
        except ValueError:
            raise SchemaRegistryError(f"schema registry {self.masked}: {method} {path} answered {status} with a "
                                      "body that is not JSON") from None

    def _cached(self, key: str, fetch) -> Any:
        cache_key = (self.url, key)
        with _CACHE_LOCK:
            if cache_key in _CACHE:
                return _CACHE[cache_key]
        value = fetch()
        with _CACHE_LOCK:
            _CACHE[cache_key] = value
        return value

    def schema(self, schema_id: int) -> str:
        """The schema (JSON text) registered under `schema_id`."""
        return self._cached(f"id:{schema_id}", lambda: self._request("GET", f"/schemas/ids/{schema_id}")["schema"])

    def version(self, schema_id: int, subject: str) -> int | None:
        """The version of `schema_id` under `subject`, or None when it is registered under other subjects only."""

        def fetch() -> int | None:
            for entry in self._request("GET", f"/schemas/ids/{schema_id}/versions"):
                if entry.get("subject") == subject:
                    return int(entry["version"])
            return None

        return self._cached(f"version:{schema_id}:{subject}", fetch)

    def subject_ids(self, subject: str) -> dict[int, int]:
        """{schema id: version} of every version registered under `subject` (the list is asked each time; a
        version's id is cached, as it never changes); {} when the registry does not know the subject."""
        try:
            versions = self._request("GET", f"/subjects/{subject}/versions")
        except UnknownSchemaError:
            return {}
        found = {}
        for version in versions:
            answer = self._cached(f"subject:{subject}:{version}",
                                  lambda v=version: self._request("GET", f"/subjects/{subject}/versions/{v}"))
            found[int(answer["id"])] = int(version)
        return found

    def latest(self, subject: str) -> tuple[int, int, str]:
        """(id, version, schema) of the subject's latest version (not cached: it changes)."""
        answer = self._request("GET", f"/subjects/{subject}/versions/latest")
        return int(answer["id"]), int(answer["version"]), answer["schema"]

    def register(self, subject: str, schema: str) -> int:
        """Register `schema` under `subject` (idempotent in the registry); its id."""
        return int(self._request("POST", f"/subjects/{subject}/versions", {"schema": schema})["id"])


def _error_code(response: requests.Response) -> int:
    """The Confluent `error_code` of an error answer (40403: schema not found), or 0 when it has none."""
    try:
        code = response.json().get("error_code")
    except (ValueError, AttributeError):
        return 0
    return code if isinstance(code, int) else 0


def clear_cache() -> None:
    with _CACHE_LOCK:
        _CACHE.clear()
