"""The herald_kafka planner process prints no traceback when Spark closes its socket (a query stopping), and
every other uncaught error as before. Each case runs in its own Python, as Spark's planner process does."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_planner_like(raised: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent(f"""
        from herald.source.stream_reader import quiet_when_spark_hangs_up
        quiet_when_spark_hangs_up()
        quiet_when_spark_hangs_up()  # once is enough: a second reader in the process changes nothing
        try:
            raise ConnectionResetError(104, "Connection reset by peer")  # read_int on the socket Spark closed
        except ConnectionResetError:
            raise {raised}
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


def test_a_socket_spark_closed_ends_the_process_without_a_traceback():
    for raised in ('BrokenPipeError(32, "Broken pipe")', 'ConnectionResetError(104, "reset")', "EOFError()"):
        result = run_planner_like(raised)
        assert result.returncode == 1, "still a failed process: Spark does not read its code, a person might"
        assert result.stderr == "", raised


def test_any_other_error_is_printed_with_its_traceback():
    result = run_planner_like('ValueError("a bug")')
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "ValueError: a bug" in result.stderr
