"""The driver's control endpoint: which subscriptions are delivered now, in which version of their definition.

Tasks of a round in progress ask it (`herald.delivery.control.ControlPoller`) every `streaming.configPollMs`, so a
suspension, a removal or an edit (a new endpoint, say) stops first attempts under the old definition within two
polls, instead of when the round's tasks reach their deadline. It serves GET /versions as {"versions":
{subscription id: version}}, bound as Spark's driver binds (`spark.driver.bindAddress`, else `spark.driver.host`;
all interfaces when that is no local address: a NAT's or a load balancer's) on `streaming.controlPort` (0: a free
port), and advertised to the tasks at the driver host (`spark.driver.host`, the address executors reach the
driver at). A task that cannot reach it keeps to its round's deadline and says so in its report; the driver logs
that once (`note_reports`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
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
    """bind_host: the address to listen on (an IPv6 address too); advertised_host: the one tasks are told; port:
    0 for a free one."""

    def __init__(self, bind_host: str, advertised_host: str | None = None, port: int = 0) -> None:
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

        self._server = _listen(bind_host, port, Handler)
        self._server.daemon_threads = True
        self.url = f"http://{_url_host(advertised_host or bind_host)}:{self._server.server_port}/versions"
        self._told_unreachable = False
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

    def note_reports(self, reports) -> None:
        """Tasks' reports (`TaskReport`) of a round: when one could not reach this endpoint, log it, once."""
        if self._told_unreachable or not any(report.control_unreachable for report in reports):
            return
        self._told_unreachable = True
        log.warning("running tasks cannot reach the control endpoint %s: a suspension or an edit reaches a round's "
                    "tasks only at their deadline (streaming.batchDeadlineMs). Executors must reach the driver host "
                    "(spark.driver.host) on this port: set streaming.controlPort to a port the network lets through",
                    self.url)

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for a serve_forever that never started
            self._server.shutdown()
        self._server.server_close()


def _listen(host: str, port: int, handler) -> ThreadingHTTPServer:
    """A server on `host`:`port`; on every interface when `host` is no address of this machine (a NAT's)."""
    try:
        return _server_class(host)((host, port), handler)
    except OSError as error:
        anywhere = "::" if ":" in host else "0.0.0.0"
        log.info("control endpoint: %s is not an address of this machine (%s); listening on %s", host, error,
                 anywhere)
        return _server_class(anywhere)((anywhere, port), handler)


def _server_class(host: str) -> type[ThreadingHTTPServer]:
    if ":" not in host:
        return ThreadingHTTPServer

    class Server6(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    return Server6


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
