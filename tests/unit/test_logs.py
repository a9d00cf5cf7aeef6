"""The CLI's logging: passwords masked in every line, and a stderr that is swapped and closed (a notebook
cell, pytest's capture) does not break later log lines."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from herald import logs


@pytest.fixture
def restored_root_logger():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_lines_go_to_the_current_stderr_even_after_an_earlier_one_was_closed(restored_root_logger, monkeypatch):
    logs.configure()
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logging.getLogger("herald.test").info("posting to %s", "http://ann:s3cret@hooks.local/x")
    first.close()  # the stream the handler was made with, or saw first, is gone
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("herald.test").warning("still here")
    assert "still here" in second.getvalue()


def test_a_password_in_a_url_never_reaches_the_line(restored_root_logger, monkeypatch):
    logs.configure()
    sink = io.StringIO()
    monkeypatch.setattr(sys, "stderr", sink)
    logging.getLogger("herald.test").info("posting to %s", "http://ann:s3cret@hooks.local/x")
    line = sink.getvalue()
    assert "s3cret" not in line and "hooks.local/x" in line
