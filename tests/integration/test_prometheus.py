"""`herald run --metrics-port`: a Prometheus scrape during a real run (broker, Spark, HTTP subscriber, Delta)
agrees with the metrics table."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from herald.storage import DeltaRsStore
from herald.storage.tables import METRICS
from tests.support.herald_env import produce, wait_until, write_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_scrape_agrees_with_the_metrics_table(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    documents = [{"i": i, **({"replies": [[400]]} if i % 5 == 0 else {})} for i in range(30)]
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "a": {"endpoint": sub.url + "/a"},
            "b": {"endpoint": sub.url + "/b", "filters": [{"type": "jsonpath", "path": "$.i", "matcher": "1.*"}]},
        }, settings={"metrics": {"prometheusHost": "127.0.0.1"}})
        store = DeltaRsStore(str(tmp_path / "storage"))

        def table_sums() -> dict[str, dict[str, int]]:
            rows = store.read(METRICS).to_pylist()
            sums: dict[str, dict[str, int]] = {}
            for row in rows:
                mine = sums.setdefault(row["subscription"], {})
                for column in ("read", "delivered", "discarded", "filtered", "attempts", "codes_2xx", "codes_4xx"):
                    mine[column] = mine.get(column, 0) + row[column]
            return sums

        with RunningHerald(conf, spark, metrics_port=0) as running:
            port = running.runner.exporter.port
            a, b = f"{topic_name}.a", f"{topic_name}.b"
            before = scrape(port)  # nothing happened yet: every counter is there, at 0
            for sid in (a, b):
                for name in ("herald_read_total", "herald_delivered_total", "herald_discarded_total",
                             "herald_lost_total"):
                    assert before[(name, (("subscription", sid),))] == 0, (sid, name)
                assert before[("herald_answers_total", (("class", "5xx"), ("subscription", sid)))] == 0
            produce(broker.bootstrap_servers, topic_name, documents)
            assert wait_until(lambda: table_sums().get(a, {}).get("read", 0) == 30
                              and table_sums().get(b, {}).get("read", 0) == 30, timeout_s=120)
            found = scrape(port)
            sums = table_sums()
    for sid in (a, b):
        label = (("subscription", sid),)
        for column in ("read", "delivered", "discarded", "filtered", "attempts"):
            assert found[(f"herald_{column}_total", label)] == sums[sid][column], (sid, column)
        assert found[("herald_answers_total", (("class", "4xx"), ("subscription", sid)))] == sums[sid]["codes_4xx"]
        assert found[("herald_answers_total", (("class", "2xx"), ("subscription", sid)))] == sums[sid]["codes_2xx"]
        assert found[("herald_parked_messages", label)] == 0
        assert sum(v for (name, labels), v in found.items()
                   if name == "herald_lag_messages" and ("subscription", sid) in labels) == 0
        assert {p for (name, labels), _ in found.items() if name == "herald_lag_messages"
                and ("subscription", sid) in labels for k, p in labels if k == "partition"} == {"0", "1"}
    assert sums[a]["delivered"] == 24 and sums[a]["discarded"] == 6
    assert sums[b]["delivered"] + sums[b]["discarded"] == 11 and sums[b]["filtered"] == 19
    assert sum(v for (name, _), v in found.items() if name == "herald_round_duration_seconds_count") >= 1
    assert found[("herald_flow_rate_per_second", (("subscription", a),))] > 0
