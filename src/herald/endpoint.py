"""Subscriber endpoints: Basic-auth credentials split out of the URL, masking for anything shown or stored,
and endpoint templates.

Example::

    endpoint = Endpoint.parse("http://user:s3cret@example.com/hook")
    endpoint.url        # 'http://example.com/hook'   (what requests is sent to)
    endpoint.masked     # 'http://user:*****@example.com/hook'   (logs, tables, CLI)

A template endpoint holds `{json.path}` placeholders in its path or query, filled from each JSON message as
Hermes' interpolating resolver does: `http://orders/{order.id}/events` with `{"order": {"id": 7}}` is sent to
`http://orders/7/events`. A path is dotted field names with optional `[n]` list indices; the value (a string,
number or boolean) is percent-encoded as one path segment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit, urlunsplit

MASK = "*****"

# scheme://user:password@  (password up to the last '@' before the host part)
_CREDENTIALS = re.compile(r"(?P<prefix>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<password>[^\s/]*)@")


def mask_secrets(text: str) -> str:
    """Replace every URL password in `text` with *****."""
    return _CREDENTIALS.sub(lambda match: f"{match.group('prefix')}{MASK}@", text)


@dataclass(frozen=True)
class Endpoint:
    url: str
    user: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, raw: str) -> Endpoint:
        """Split `user:password@` out of an http(s) URL (placeholders allowed in its path and query). Raises
        ValueError (with the URL masked) when invalid."""
        placeholders(raw)  # raises on a malformed placeholder
        parts = urlsplit(raw)
        if "{" in parts.netloc or "}" in parts.netloc:
            raise ValueError(f"placeholders are allowed in the path and query only: {mask_secrets(raw)}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL with a host: {mask_secrets(raw)}")
        try:
            port = parts.port
        except ValueError as error:
            raise ValueError(f"invalid port in {mask_secrets(raw)}") from error
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc = host if port is None else f"{host}:{port}"
        url = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        user = unquote(parts.username) if parts.username is not None else None
        password = unquote(parts.password) if parts.password is not None else None
        return cls(url=url, user=user, password=password)

    @property
    def masked(self) -> str:
        if self.user is None:
            return self.url
        scheme, rest = self.url.split("://", 1)
        secret = f":{MASK}" if self.password is not None else ""
        return f"{scheme}://{self.user}{secret}@{rest}"

    def __repr__(self) -> str:  # never show the password, even in a traceback
        return f"Endpoint({self.masked!r})"


PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*|\[\d+\])*$")
_STEP = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]")


def placeholders(url: str) -> tuple[str, ...]:
    """The `{json.path}` placeholders of a URL, in order. Raises ValueError for a malformed one or a stray
    brace."""
    found = tuple(PLACEHOLDER.findall(url))
    for path in found:
        if not _PATH.match(path):
            raise ValueError(f"placeholder {{{path}}} is not a JSON path like {{order.id}} or {{items[0].sku}}")
    if PLACEHOLDER.sub("", url).count("{") or PLACEHOLDER.sub("", url).count("}"):
        raise ValueError("an endpoint has an unmatched '{' or '}'")
    return found


class MissingField(ValueError):
    """A message has no scalar value at a placeholder's path."""

    def __init__(self, path: str) -> None:
        super().__init__(f"Endpoint template placeholder {{{path}}}: the message has no such field")
        self.path = path


def fill(url: str, document) -> str:
    """`url` with each placeholder replaced by the value at its path in the parsed JSON `document`,
    percent-encoded. Raises MissingField when a value is absent, null, an object or a list."""

    def value_of(match: re.Match) -> str:
        path = match.group(1)
        value = document
        for name, index in _STEP.findall(path):
            try:
                value = value[name] if name else value[int(index)]
            except (KeyError, IndexError, TypeError):
                raise MissingField(path) from None
        if value is None or isinstance(value, (dict, list)):
            raise MissingField(path)
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return quote(text, safe="")

    return PLACEHOLDER.sub(value_of, url)
