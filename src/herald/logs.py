"""Logging for the CLI and jobs: one format, and URL passwords masked in every line."""

from __future__ import annotations

import logging
import sys

from herald.endpoint import mask_secrets


class MaskSecrets(logging.Filter):
    """Rewrites each record's message with `mask_secrets`, whatever logger produced it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


class CurrentStderr(logging.StreamHandler):
    """A handler that writes to whatever `sys.stderr` is when a record arrives, not the stream it was made with:
    a caller that redirects or captures stderr (a notebook, pytest) and later closes it keeps working."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure(verbose: bool = False) -> None:
    handler = CurrentStderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-5s %(name)s: %(message)s", "%H:%M:%S"))
    handler.addFilter(MaskSecrets())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("py4j", "urllib3", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
