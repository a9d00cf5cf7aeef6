"""Signed requests, per the Standard Webhooks specification (beyond Hermes; what webhook receivers expect).

Every attempt of a subscription with `signing` carries three headers:

- `webhook-id`: the message id (the batch id for a batch): the same on every retry, for deduplication;
- `webhook-timestamp`: the attempt's time, integer Unix seconds;
- `webhook-signature`: `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`, one per secret, space-separated,
  so that a receiver can rotate its secret (it accepts a request any one of its secrets verifies).

The body is signed as the exact bytes sent (JSON or Avro binary). A secret is `whsec_` + base64 of the key, or
the key itself as text; a key has at least 24 bytes. Keys are configuration secrets: never logged or shown.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

SECRET_PREFIX = "whsec_"
MIN_KEY_BYTES = 24

WEBHOOK_ID = "webhook-id"
WEBHOOK_TIMESTAMP = "webhook-timestamp"
WEBHOOK_SIGNATURE = "webhook-signature"


def signing_key(secret: str) -> bytes:
    """The HMAC key of one configured secret. Raises ValueError (without the secret) when it is not valid
    base64 after `whsec_`, or shorter than 24 bytes."""
    if secret.startswith(SECRET_PREFIX):
        encoded = secret[len(SECRET_PREFIX):]
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a whsec_ secret must be base64 after its prefix") from None
    else:
        key = secret.encode("utf-8")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a signing key must have at least {MIN_KEY_BYTES} bytes (this one has {len(key)})")
    return key


def signature(key: bytes, message_id: str, timestamp_s: int, body: bytes) -> str:
    """`v1,<base64 signature>` of one body with one key."""
    signed = b"%s.%d." % (message_id.encode("utf-8"), timestamp_s) + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")


def signature_lines(keys: tuple[bytes, ...], message_id: str, timestamp_s: int, body: bytes) -> tuple[str, ...]:
    """The three header lines ("Name: value") that sign one attempt."""
    signatures = " ".join(signature(key, message_id, timestamp_s, body) for key in keys)
    return (f"{WEBHOOK_ID}: {message_id}", f"{WEBHOOK_TIMESTAMP}: {timestamp_s}",
            f"{WEBHOOK_SIGNATURE}: {signatures}")
