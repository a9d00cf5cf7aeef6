"""Logging for the CLI and jobs: one format, and URL passwords masked in every line."""

from __future__ import annotations

import logging

from herald.endpoint import mask_secrets


class MaskSecrets(logging.Filter):
    """Rewrites each record's message with `mask_secrets`, whatever logger produced it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def configure(verbose: bool = False) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-5s %(name)s: %(message)s", "%H:%M:%S"))
    handler.addFilter(MaskSecrets())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("py4j", "urllib3", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
