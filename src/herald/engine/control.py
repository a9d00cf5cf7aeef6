"""The driver's control endpoint: which subscriptions are delivered now, in which version of their definition.

Tasks of a round in progress ask it (`herald.delivery.control.ControlPoller`) every `streaming.configPollMs`, so a
suspension, a removal or an edit (a new endpoint, say) stops first attempts under the old definition within two
polls, instead of when the round's tasks reach their deadline. It serves GET /versions on the driver's host (the
address Spark's executors reach the driver at) on a free port, as {"versions": {subscription id: version}}.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from herald.config import Subscription

log = logging.getLogger(__name__)


def version_of(subscription: Subscription) -> str:
    """A short fingerprint of a subscription's definition (it changes with any edit of its file's fields)."""
    return hashlib.sha1(subscription.model_dump_json().encode("utf-8")).hexdigest()[:16]


def pinned_version(version: str, pin_id: str | None) -> str:
    """A pinned subscription's version in a round: its definition's and its pin's."""
    return f"{version}:{pin_id or '-'}"


class ControlServer:
    def __init__(self, host: str) -> None:
        self._versions: dict[str, str] = {}
        self._body = b'{"versions": {}}'
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path != "/versions":
                    self.send_error(404)
                    return
                body = server._body
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_port}/versions"
        self._thread = threading.Thread(target=self._server.serve_forever, name="herald-control", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("control endpoint for running tasks: %s", self.url)

    def publish(self, subscriptions: list[Subscription], pins: dict[str, str | None] | None = None) -> None:
        """The subscriptions delivered now (the others are stopped in running tasks); `pins`: a pinned
        subscription's pin id (None while it changes hands), part of its version (`pinned_version`), so that
        running tasks stop sending to a pin given up."""
        pins = pins or {}
        self._versions = {s.id: pinned_version(version_of(s), pins[s.id]) if s.id in pins else version_of(s)
                          for s in subscriptions}
        self._body = json.dumps({"versions": self._versions}).encode()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
