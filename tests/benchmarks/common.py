"""What several benchmarks share: an HTTP sink on 127.0.0.1, percentiles, and stopping a job they started.

The benchmarks import it as a sibling (`from common import ...`: each puts its own folder on `sys.path`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.http_server import LocalHttpServer  # noqa: E402


class PostSink:
    """An HTTP server on 127.0.0.1 (a thread per connection, keep-alive) that hands every POST's path and body to
    `answer` and replies with the status it returns and an empty body. `answer` runs on the connection's thread."""

    def __init__(self, answer: Callable[[str, bytes], int]) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(answer(self.path, body))
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = LocalHttpServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def percentile(values, share: float) -> float:
    """The value at `share` (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def stop_job(process: subprocess.Popen, timeout_s: float) -> None:
    """Stop a job started in a process group of its own as Ctrl-C does (SIGINT to the group); after `timeout_s`
    seconds, kill the group."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
