"""The driver's control endpoint (herald.engine.upkeep.control) and the tasks' poller (herald.delivery.control):
bound as Spark's driver binds, advertised at the driver host, and a task that cannot reach it said once by the
driver. Real sockets on this machine, no Spark."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from herald.delivery.control import ControlPoller
from herald.delivery.report import TaskReport
from herald.engine.upkeep.control import ControlServer

NOT_HERE = "192.0.2.1"  # TEST-NET-1: no address of this machine, as a NAT's public address is not


def _versions(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


def _wait(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_a_driver_host_that_is_no_local_address_is_advertised_and_served_on_every_interface():
    """spark.driver.host behind a NAT (or a load balancer's): binding it failed, and the job could not start."""
    server = ControlServer(NOT_HERE, NOT_HERE)
    server.start()
    try:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        assert server.url == f"http://{NOT_HERE}:{port}/versions", "tasks are told the driver host"
        assert _versions(f"http://127.0.0.1:{port}/versions") == {"versions": {}}
    finally:
        server.stop()


def test_a_bind_address_and_a_fixed_port_are_kept():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ControlServer("127.0.0.1", "driver.example", port)
    server.start()
    try:
        assert server.url == f"http://driver.example:{port}/versions"
        assert _versions(f"http://127.0.0.1:{port}/versions") == {"versions": {}}
    finally:
        server.stop()


@pytest.mark.skipif(not socket.has_ipv6, reason="this Python was built without IPv6")
def test_an_ipv6_driver_host_is_bound_and_bracketed_in_the_url():
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    server = ControlServer("::1", "::1")
    server.start()
    poller = ControlPoller(server.url, poll_s=0.05)
    try:
        assert server.url.startswith("http://[::1]:")
        assert _wait(lambda: poller.versions() == {}), "a task reaches it over IPv6"
        assert not poller.unreachable
    finally:
        poller.close()
        server.stop()


def test_a_task_that_cannot_reach_it_says_so_and_the_driver_logs_it_once(caplog):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]  # nothing listens there once the probe is closed
    poller = ControlPoller(f"http://127.0.0.1:{dead}/versions", poll_s=0.05, timeout_s=0.5)
    try:
        assert _wait(lambda: poller.unreachable), "a refused connection is an unreachable endpoint"
    finally:
        poller.close()
    report = TaskReport(task="t", control_unreachable=True)
    (back,) = TaskReport.from_table(__import__("pyarrow").Table.from_batches([report.to_arrow()]))
    assert back.control_unreachable, "it crosses from the executor to the driver"

    server = ControlServer("127.0.0.1", "127.0.0.1")
    try:
        with caplog.at_level("WARNING", logger="herald.engine.upkeep.control"):
            server.note_reports([TaskReport(task="ok")])
            assert "cannot reach" not in caplog.text
            server.note_reports([back])
            server.note_reports([back])
        assert caplog.text.count("running tasks cannot reach the control endpoint") == 1
        assert "streaming.controlPort" in caplog.text
    finally:
        server.stop()
