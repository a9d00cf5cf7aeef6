"""A lookup service on 127.0.0.1 for discovery tests (NSQ lookupd's /lookup, as far as Herald reads it): it
answers whatever the test sets, JSON, or an HTTP error while `failing`.

    with Lookup() as lookup:
        lookup.set(["http://127.0.0.1:8080/orders"])             # a JSON list of endpoint URLs
        lookup.set_producers([("127.0.0.1", 8080)])                # lookupd's {"producers": [...]}
        lookup.failing = True                                      # 500 until set back
        lookup.url                                                 # http://127.0.0.1:<port>/lookup?topic=orders
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler

from tests.support.http_server import LocalHttpServer


class Lookup:
    def __init__(self) -> None:
        self._body = b"[]"
        self.failing = False
        self.polls = 0
        self._lock = threading.Lock()
        lookup = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with lookup._lock:
                    lookup.polls += 1
                    status, body = (500, b'{"message": "INTERNAL_ERROR"}') if lookup.failing else (200, lookup._body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = LocalHttpServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/lookup?topic=orders"

    def set(self, urls: list[str]) -> None:
        with self._lock:
            self._body, self.failing = json.dumps(urls).encode(), False

    def set_producers(self, nodes: list[tuple[str, int]]) -> None:
        producers = [{"remote_address": f"{a}:40000", "hostname": a, "broadcast_address": a, "tcp_port": 4150,
                      "http_port": p, "version": "1.3.0"} for a, p in nodes]
        with self._lock:
            self._body, self.failing = json.dumps({"channels": ["c"], "producers": producers}).encode(), False

    def polled_since(self, count: int) -> int:
        with self._lock:
            return self.polls - count

    def __enter__(self) -> Lookup:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
