"""A client of a Confluent-compatible schema registry, with answers cached per process.

Spark reuses its Python workers, so the module-level cache makes one registry call per schema id per
executor process, not per record. Transient failures (connection errors, 5xx) are retried with jittered
backoff; an unknown id is an `UnknownSchemaError`. Credentials in the URL (`https://user:pass@host`) are used
for Basic auth and never appear in errors or logs.

Endpoints used: GET /schemas/ids/{id}, GET /schemas/ids/{id}/versions, GET /subjects/{subject}/versions/latest,
GET /subjects/{subject}/versions and /versions/{version} (the driver, for from_avro: `herald.avro.jvm`),
POST /subjects/{subject}/versions (registering, for `herald publish` and tests).
"""

from __future__ import annotations

import threading
from typing import Any

import requests
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from herald.endpoint import Endpoint, mask_secrets

_CACHE: dict[tuple[str, str], Any] = {}
_CACHE_LOCK = threading.Lock()

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class SchemaRegistryError(RuntimeError):
    """The registry could not be reached or answered something unexpected."""


class UnknownSchemaError(SchemaRegistryError):
    """The registry does not know this schema id or subject."""


class _Transient(SchemaRegistryError):
    """A failure worth retrying (connection error, 5xx)."""


class RegistryClient:
    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        endpoint = Endpoint.parse(url)
        self.url = endpoint.url.rstrip("/")
        self.masked = endpoint.masked.rstrip("/")
        self._auth = (endpoint.user, endpoint.password or "") if endpoint.user is not None else None
        self.timeout_s = timeout_s

    def __reduce__(self):
        raise TypeError("RegistryClient is created on each executor; ship the registry URL instead")

    @retry(retry=retry_if_exception_type(_Transient), stop=stop_after_attempt(4),
           wait=wait_random_exponential(multiplier=0.2, max=3), reraise=True)
    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        try:
            response = requests.request(method, f"{self.url}{path}", json=body, auth=self._auth,
                                        timeout=self.timeout_s, headers={"Accept": CONTENT_TYPE})
        except requests.RequestException as error:
            raise _Transient(f"schema registry {self.masked} unreachable: {type(error).__name__}") from None
        if response.status_code == 404:
            raise UnknownSchemaError(f"schema registry {self.masked}: {path} not found")
        if response.status_code >= 500:
            raise _Transient(f"schema registry {self.masked}: {path} answered {response.status_code}")
        if response.status_code >= 300:
            raise SchemaRegistryError(mask_secrets(
                f"schema registry {self.masked}: {method} {path} answered {response.status_code}: "
                f"{response.text[:200]}"))
        return response.json()

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


def clear_cache() -> None:
    with _CACHE_LOCK:
        _CACHE.clear()
