"""Subscriber endpoints: Basic-auth credentials split out of the URL, and masking for anything shown or stored.

Example::

    endpoint = Endpoint.parse("http://user:s3cret@example.com/hook")
    endpoint.url        # 'http://example.com/hook'   (what requests is sent to)
    endpoint.masked     # 'http://user:*****@example.com/hook'   (logs, tables, CLI)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "*****"

# scheme://user:password@  (password up to the last '@' before the host part)
_CREDENTIALS = re.compile(r"(?P<prefix>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:)(?P<password>[^\s/]*)@")


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
        """Split `user:password@` out of an http(s) URL. Raises ValueError (with the URL masked) when invalid."""
        parts = urlsplit(raw)
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
