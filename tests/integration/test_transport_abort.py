"""`Transport.abort` on both transports, against a real HTTP server on 127.0.0.1 that reads a request and never
answers it (no Spark: fast). An aborted attempt is a timeout; its connection is closed, so its answer, however
late, reaches nobody, and the transport goes on serving the next attempts, even one with the same token.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from herald.delivery.input import InputBatch
from herald.delivery.message import Record, message_id
from herald.delivery.outcome import FailureKind
from herald.delivery.plan import TaskPlan
from herald.delivery.sender import TaskSender
from herald.delivery.transport import HttpAnswer, HttpRequest, open_transport
from tests.support.delivery import lane_plan, retry_policy
from tests.support.herald_env import wait_until

LINES = ("Content-Type: application/json",)
REQUEST_TIMEOUT_S = 60.0


class HangingServer:
    """HTTP/1.1 on 127.0.0.1, keep-alive. A request to /hang is read and left unanswered until `release` is set,
    then answered 200 (late) if its connection is still open; any other request is answered 201 at once.
    `requests`: (path, client port) in arrival order; `closed`: client ports of /hang connections the client
    closed while their request waited."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.release = threading.Event()
        self.requests: list[tuple[str, int]] = []
        self.closed: list[int] = []
        self.late_answers = 0
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def __enter__(self) -> HangingServer:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        self.release.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, (_, port) = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection, port), daemon=True).start()

    def _serve(self, connection: socket.socket, port: int) -> None:
        buffer = b""
        with connection:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = _recv(connection)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                               if line.lower().startswith("content-length:")), 0)
                while len(buffer) < length:
                    chunk = _recv(connection)
                    if not chunk:
                        return
                    buffer += chunk
                buffer = buffer[length:]
                path = lines[0].split()[1]
                self.requests.append((path, port))
                if path == "/hang":
                    if not self._hold(connection, port):
                        return
                    self.late_answers += 1
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                else:
                    connection.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")

    def _hold(self, connection: socket.socket, port: int) -> bool:
        """Wait for `release` (True) or for the client to close the connection (False)."""
        connection.settimeout(0.05)
        try:
            while not self.release.is_set():
                try:
                    if not connection.recv(1, socket.MSG_PEEK):
                        self.closed.append(port)
                        return False
                except TimeoutError:
                    continue
        except OSError:
            self.closed.append(port)
            return False
        finally:
            connection.settimeout(None)
        return True


def _recv(connection: socket.socket) -> bytes:
    try:
        return connection.recv(65536)
    except OSError:
        return b""


def _until_answered(transport, limit_s: float = 20.0) -> list:
    results = []
    deadline = time.monotonic() + limit_s
    while transport.open and time.monotonic() < deadline:
        results += transport.poll(0.1)
    return results


@pytest.mark.parametrize("kind", ["curl", "requests"])
def test_an_aborted_attempt_closes_its_connection_and_its_late_answer_never_comes_back(kind):
    with HangingServer() as server:
        transport = open_transport(kind, 4)
        try:
            transport.start(HttpRequest(f"{server.url}/hang", LINES, b"{}", REQUEST_TIMEOUT_S), "a")
            answered = []  # curl's transfers move only in `poll`
            assert wait_until(lambda: answered.extend(transport.poll(0.05)) or server.paths() == ["/hang"], 10), \
                "the server has the request"
            assert answered == [] and transport.open == 1
            failure = transport.abort("a")
            assert failure.kind is FailureKind.TIMEOUT and failure.detail.startswith("Timeout")
            assert transport.open == 0 and transport.abort("a") is None, "aborted once; no longer open"
            assert wait_until(lambda: server.closed, 10), "the attempt's connection is closed"
            server.release.set()  # its answer would go out now, on a connection no longer there
            transport.start(HttpRequest(f"{server.url}/ok", LINES, b"{}", REQUEST_TIMEOUT_S), "a")  # same token
            assert _until_answered(transport) == [("a", HttpAnswer(201))], "the new attempt's own answer"
            assert transport.poll(0.3) == [] and server.late_answers == 0
            (hung_port, ok_port) = [port for _, port in server.requests]
            assert ok_port != hung_port, "the next attempt went out on a new connection"
        finally:
            transport.close()


@pytest.mark.parametrize("kind", ["curl", "requests"])
def test_a_task_with_a_subscriber_that_never_answers_ends_at_its_deadline_plus_the_grace(kind):
    """Its requestTimeout is 60 s; the task's deadline 1 s: the task ends long before the request would have
    timed out, the attempt counted as a timeout and its message parked for a retry."""
    with HangingServer() as server:
        plan = lane_plan(f"{server.url}/hang", retry=retry_policy(message_ttl_s=600, backoff_s=1.0), inflight=1,
                         rate_per_s=100.0, request_timeout_s=REQUEST_TIMEOUT_S)
        task = TaskPlan(topic="g.t", lanes={0: plan}, budget_s=1.0, transport=kind)
        row = Record(partition=0, offset=0, timestamp_ms=int(time.time() * 1000),
                     message_id=message_id("g.t", 0, 0, None), body=b"{}")
        started = time.monotonic()
        report = TaskSender(task, open_transport(kind, 8)).run([InputBatch([(row, (0,))])]).lanes[0]
        elapsed_s = time.monotonic() - started
        assert elapsed_s < REQUEST_TIMEOUT_S, "it did not wait for the request's own timeout"
        assert report.counters.timeouts == 1 and report.counters.delivered == 0
        (parked,) = report.parked
        assert parked.state.attempts == 1 and parked.state.last_reason.startswith("Timeout")
        assert wait_until(lambda: server.closed, 10), "the attempt's connection is closed"
