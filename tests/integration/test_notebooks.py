"""The Databricks notebooks, run as they are with small stand-ins for dbutils, display and spark, on tables
written by a real delivery run (broker, Spark, HTTP subscriber, Delta); and their source format."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from confluent_kafka import Producer

from herald.config import load_config
from herald.engine.context import now_ms
from herald.engine.endpoints.pin_group import PINNED, START, TIMEOUT, UNPINNED, Advisory
from herald.engine.endpoints.priority_groups import advisory_rows
from herald.engine.runner import Runner
from herald.notebooks import ANSWER_CLASSES
from herald.storage import DeltaRsStore, Slice
from herald.storage.tables import METRICS, UNDELIVERED
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SEPARATOR = "# COMMAND ----------"


class Widgets:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.declared: list[str] = []

    def text(self, name: str, default: str, label: str = "") -> None:
        self.declared.append(name)
        self.values.setdefault(name, default)

    def get(self, name: str) -> str:
        return self.values[name]


class DbUtils:
    def __init__(self, values: dict[str, str]) -> None:
        self.widgets = Widgets(values)


class SparkWithoutDelta:
    """Stands in for a session without the Delta jars (as here): reading format('delta') fails."""

    class _Reader:
        def format(self, name: str):
            return self

        def load(self, path: str):
            raise RuntimeError("[DATA_SOURCE_NOT_FOUND] Failed to find the data source: delta")

    read = _Reader()


def run_notebook(name: str, widgets: dict[str, str]) -> tuple[list, DbUtils]:
    shown: list = []
    dbutils = DbUtils(dict(widgets))
    source = (NOTEBOOKS / name).read_text(encoding="utf-8")
    exec(compile(source, str(NOTEBOOKS / name), "exec"),  # noqa: S102 - the notebook, run as Databricks would
         {"dbutils": dbutils, "display": shown.append, "spark": SparkWithoutDelta(), "__name__": "__main__"})
    return shown, dbutils


def bar_total(axes) -> float:
    return sum(patch.get_height() for patch in axes.patches)


@pytest.fixture(scope="module")
def delivered_tables(tmp_path_factory, broker, spark):
    """A real run: two subscriptions (a tracks every message), every fifth message refused with 400, one answered
    500 then 200; then 3 more messages on partition 0 that are not delivered (a lag of 3)."""
    root = tmp_path_factory.mktemp("notebooks")
    topic = f"nb.t{dt.datetime.now().microsecond}"
    broker.create_topics({topic: 2})
    documents = [{"i": i, **({"replies": [[400]]} if i % 5 == 0 else {"replies": [[500], [200]]} if i == 3 else {})}
                 for i in range(40)]
    produce(broker.bootstrap_servers, topic, documents)
    with ScriptedSubscriber() as sub:
        conf = write_conf(root, broker.bootstrap_servers, topic, {
            "a": {"endpoint": sub.url + "/a", "trackingMode": "trackingAll"},
            "b": {"endpoint": sub.url + "/b", "filters": [{"type": "jsonpath", "path": "$.i", "matcher": "[0-9]"}]},
        }, settings={"streaming": {"parkAfterMs": 5000}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(40, 43):
        producer.produce(topic, json.dumps({"i": i}).encode(), partition=0)
    assert producer.flush(10) == 0
    return load_config(conf), topic


@pytest.mark.spark
@pytest.mark.broker
def test_the_undelivered_notebook_plots_what_the_table_holds(delivered_tables, tmp_path, capsys):
    config, topic = delivered_tables
    rows = DeltaRsStore(config.storage_path).read(UNDELIVERED).to_pandas()
    subscription = f"{topic}.a"
    mine = rows[rows["subscription"] == subscription]
    assert len(mine) == 8  # i = 0, 5, ..., 35

    shown, dbutils = run_notebook("undelivered.py", {"storage_path": config.storage_path,
                                                     "subscription": subscription, "window_hours": "24"})
    assert dbutils.widgets.declared == ["storage_path", "subscription", "window_hours"]
    latest, figure = shown
    assert sorted(latest["offset"]) == sorted(mine["offset"])
    by_reason, by_status = figure.axes
    assert bar_total(by_reason) == len(mine) and bar_total(by_status) == len(mine)
    assert [text.get_text() for text in by_status.get_legend().get_texts()] == ["400"]
    newest = mine.sort_values("timestamp").iloc[-1]
    detail = capsys.readouterr().out
    assert newest["message_id"] in detail
    history = detail[detail.index("history:"):].splitlines()
    assert [line.split()[2] for line in history[1:4]] == ["INFLIGHT", "FAILED", "DISCARDED"], "a tracks every step"
    assert history[2].split()[3] == "400"
    png = tmp_path / "undelivered.png"
    figure.savefig(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    shown, _ = run_notebook("undelivered.py", {"storage_path": config.storage_path, "subscription": "all",
                                               "window_hours": "24"})
    assert bar_total(shown[1].axes[0]) == len(rows), "all subscriptions"


@pytest.mark.spark
@pytest.mark.broker
def test_the_metrics_notebook_plots_what_the_table_holds(delivered_tables, tmp_path):
    config, topic = delivered_tables
    rows = DeltaRsStore(config.storage_path).read(METRICS).to_pandas()
    rows = rows[rows["finished_at"].notna()]
    pins = [Advisory(PINNED, f"{topic}.a", "http://one/a", "pin-1", START, now_ms() - 60_000),
            Advisory(UNPINNED, f"{topic}.a", "http://one/a", "pin-1", TIMEOUT, now_ms() - 30_000),
            Advisory(PINNED, f"{topic}.a", "http://two/a", "pin-2", TIMEOUT, now_ms() - 29_000)]
    DeltaRsStore(config.storage_path).replace("advisories", advisory_rows(pins, "priority:test", 1),
                                              Slice("priority:test", 1))
    shown, dbutils = run_notebook("metrics.py", {"storage_path": config.storage_path, "subscription": "all",
                                                 "window_hours": "24", "conf": str(config.conf_dir)})
    assert dbutils.widgets.declared == ["storage_path", "subscription", "window_hours", "conf"]
    per_minute, lag, figure, advisories = shown
    assert list(zip(advisories["type"], advisories["endpoint"], advisories["reason"])) == [
        ("pinned", "http://one/a", "start"), ("unpinned", "http://one/a", "timeout"),
        ("pinned", "http://two/a", "timeout")]
    assert per_minute["delivered"].sum() == rows["delivered"].sum() == 32 + 8  # a: 32; b: i 1..9 but 5 -> 8
    assert sorted(zip(lag["subscription"], lag["partition"], lag["lag"])) == [
        (f"{topic}.a", 0, 3), (f"{topic}.a", 1, 0), (f"{topic}.b", 0, 3), (f"{topic}.b", 1, 0)]
    delivered_axes, answers_axes, inflight_axes, lag_axes = (axes for axes in figure.axes if axes.get_title())
    assert bar_total(lag_axes) == 6
    assert bar_total(delivered_axes) == rows["delivered"].sum()
    assert bar_total(answers_axes) == sum(rows[column].sum() for column in ANSWER_CLASSES)
    assert {line.get_label() for line in inflight_axes.get_lines()} == {f"{topic}.a", f"{topic}.b"}
    png = tmp_path / "metrics.png"
    figure.savefig(png)
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("name", ["undelivered.py", "metrics.py"])
def test_notebook_source_format(name):
    source = (NOTEBOOKS / name).read_text(encoding="utf-8")
    assert source.splitlines()[0] == "# Databricks notebook source"
    cells = source.split(f"\n{SEPARATOR}\n")
    assert len(cells) >= 4, "cells separated as Databricks writes them: a separator line between blank lines"
    assert source.count(f"\n\n{SEPARATOR}\n\n") == source.count(SEPARATOR)
    markdown = [cell for cell in cells if "# MAGIC %md" in cell]
    assert markdown, "the notebook explains itself"
    for cell in markdown:
        lines = [line for line in cell.splitlines() if line.strip() and line != "# Databricks notebook source"]
        assert all(line.startswith("# MAGIC") for line in lines), cell
    compile(source, name, "exec")


@pytest.mark.spark
@pytest.mark.broker
def test_herald_metrics_gives_the_last_minute_per_second_and_the_lag(delivered_tables, capsys):
    from herald.cli import main

    config, topic = delivered_tables
    conf_dir = str(config.conf_dir)
    capsys.readouterr()
    assert main(["metrics", "--conf", conf_dir, f"{topic}.a", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["delivered"] == 32 and figures["lagError"] is None
    assert figures["lastMinute"]["delivered"] == round(32 / 60, 3), "the run finished within the last minute"
    assert figures["lastMinute"]["codes4xx"] == round(8 / 60, 3)
    assert [(item["partition"], item["lag"]) for item in figures["lag"]] == [(0, 3), (1, 0)]
    assert sum(item["endOffset"] for item in figures["lag"]) == 43
