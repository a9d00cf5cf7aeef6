"""Both stacks deliver the same thing: the users' stack (Spark's Kafka source, delta-spark, spark-avro's from_avro)
and the fallback (Herald's Python Kafka source, delta-rs, fastavro), each one `--once` job over the same two
topics, each into its own storage, to the same kind of real subscriber.

The scenario covers what the two stacks implement apart: the read (partitions, offsets, timestamps, headers),
the filters over it (jsonpath, header, avropath), decoding (a JSON and an AVRO topic, a record that is no Avro),
SERIAL and BATCH delivery, retries inside a round, a 400 that discards, a message parked behind a long
Retry-After, a retransmission by date (a second run, where that subscription catches up over a bounded range of
offsets), and the tables each engine writes (undelivered rows, parked retries, positions, metrics, all read
back with delta-rs as the CLI reads them). What each endpoint received (message ids, bodies, attempts) and
every row must be the same, but for one count: a parked message's attempts include any that failed before the
subscriber saw them (on a loaded machine, a connection or a timeout), so each stack's must be those the subscriber
answered plus at most its own failed attempts.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter

import pytest
import yaml

from herald import readout
from herald.avro.jvm import SPARK_AVRO_CLASS
from herald.config import load_config
from herald.engine.runner import Runner
from herald.engine.upkeep.moves import retransmit
from herald.storage import DeltaRsStore
from herald.storage.delta_spark import DELTA_SPARK_CLASS
from herald.storage.tables import RETRIES
from tests.integration.test_avro_parity import invalid
from tests.support.avro_topics import ORDER, order, produce_raw
from tests.support.herald_env import produce, require_jars, write_topics_conf
from tests.support.registry import avro_bytes
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]

STACKS = {
    "jvm": {"kafka": {"connector": "spark"}, "storage": {"engine": "spark"}, "avro": {"decoder": "spark"}},
    "python": {"kafka": {"connector": "python"}, "storage": {"engine": "deltalake"}, "avro": {"decoder": "fastavro"}},
}
JSON_SUBSCRIPTIONS = {
    "everything": {},
    "from-web": {"filters": [{"type": "header", "header": "source", "matcher": "web"}]},
    "paid": {"filters": [{"type": "jsonpath", "path": ".status", "matcher": "PAID"}]},
    "batched": {"deliveryType": "BATCH", "subscriptionPolicy": {"batchSize": 4},
                "filters": [{"type": "jsonpath", "path": ".status", "matcher": "NEW"}]},
}
AVRO_SUBSCRIPTIONS = {
    "krakow": {"filters": [{"type": "avropath", "path": ".user.addresses[*].city", "matcher": "Krakow",
                            "matchingStrategy": "any"}]},
    "as-avro": {"contentType": "AVRO"},
}
PARKED_REPLY = {"status": 503, "headers": {"Retry-After": "300"}}  # due long after the --once run ends


def documents(source: str, first: int, count: int) -> list[dict]:
    """JSON messages; some answered 503 then 200, some 400, one parked (what the subscriber does is in the body)."""
    out = []
    for n in range(first, first + count):
        document = {"n": n, "status": "PAID" if n % 3 == 0 else "NEW", "source": source}
        if n % 7 == 3:
            document["replies"] = [{"status": 503}, {"status": 200}]
        elif n % 11 == 5:
            document["replies"] = [{"status": 400}]
        elif n == first + 1:
            document["replies"] = [PARKED_REPLY]
        out.append(document)
    return out


def publish(broker, json_topic: str, avro_topic: str) -> dt.datetime:
    """The messages; returns a time between the "web" ones and the "app" ones (published after it)."""
    broker.create_topics({json_topic: 3, avro_topic: 2})
    produce(broker.bootstrap_servers, json_topic, documents("web", 0, 30), headers=[("source", b"web")])
    time.sleep(1.0)
    between = dt.datetime.now(dt.timezone.utc)
    time.sleep(1.0)
    produce(broker.bootstrap_servers, json_topic, documents("app", 100, 25), headers=[("source", b"app")])
    cities = [["Krakow"], ["Berlin", "Krakow"], ["Paris"], []]
    values = [(avro_bytes(ORDER, order(i, cities[i % len(cities)], status="PAID" if i % 2 else "NEW")), None)
              for i in range(24)]
    values.insert(9, (b"\x07not avro", None))
    produce_raw(broker.bootstrap_servers, avro_topic, values)
    return between


def conf_for(tmp_path, broker, stack: str, json_topic: str, avro_topic: str, url: str, first: bool = True):
    """One job over both topics with `stack`'s parts; rounds gathered as by default (a minute: one commit of each
    table at the end of the run, not one per round). `first`: a new conf directory, else the same one (the
    subscriber's URL changed)."""
    topics = {topic: {name: {**fields, "endpoint": f"{url}/{name}"} for name, fields in subscriptions.items()}
              for topic, subscriptions in ((json_topic, JSON_SUBSCRIPTIONS), (avro_topic, AVRO_SUBSCRIPTIONS))}
    settings = {key: dict(value) for key, value in STACKS[stack].items()}
    settings["storage"]["commitIntervalMs"] = 60_000
    conf = write_topics_conf(tmp_path / stack, broker.bootstrap_servers, topics, settings)
    (conf / "schemas").mkdir(exist_ok=True)
    (conf / "schemas" / "order.avsc").write_text(json.dumps(ORDER))
    (conf / "topics" / f"{avro_topic}.yaml").write_text(
        yaml.safe_dump({"name": avro_topic, "contentType": "AVRO", "schemaFile": "schemas/order.avsc"}))
    return load_config(conf)


def received(requests) -> dict[str, list]:
    """Per endpoint, every attempt: (message id, body, attempt); a batch counts as its messages."""
    out: dict[str, list] = {}
    for request in requests:
        name = request.path.strip("/")
        if name == "batched":
            bodies = [json.dumps(element, sort_keys=True).encode() for element in request.json()]
            items = [("batch", body, request.attempt) for body in bodies]
        else:
            items = [(request.message_id, request.body, request.attempt)]
        out.setdefault(name, []).extend(items)
    return {name: sorted(items) for name, items in out.items()}


def deliver(spark, tmp_path, broker, stack: str, json_topic: str, avro_topic: str, again_from: dt.datetime) -> dict:
    """Two `--once` runs on `stack`: the first over everything, the second after `paid` was moved back to
    `again_from` (`herald retransmit`: it catches up over a bounded range while the others have nothing new)."""
    with ScriptedSubscriber() as subscriber:
        config = conf_for(tmp_path, broker, stack, json_topic, avro_topic, subscriber.url)
        assert Runner(config, spark=spark).run(once=True) == 0
    store = DeltaRsStore(config.storage_path)
    retransmit(store, config.settings.kafka.client_config(), f"{json_topic}.paid", json_topic, again_from)
    with ScriptedSubscriber() as again:
        config = conf_for(tmp_path, broker, stack, json_topic, avro_topic, again.url, first=False)
        assert Runner(config, spark=spark).run(once=True) == 0
    parked = store.latest(RETRIES, ("subscription", "partition", "offset"), "recorded_at DESC, batch_id DESC")
    seen = Counter((request.path.strip("/"), request.message_id) for request in subscriber.requests + again.requests)
    tables = {}
    for subscription in config.subscriptions:
        name = subscription.id
        undelivered = readout.undelivered(config, subscription, limit=1000)
        counts = readout.metrics(config, subscription)
        rows = [row for row in parked.to_pylist() if row["subscription"] == name]
        tables[name] = {
            "undelivered": sorted((row["partition"], row["offset"], row["status"], row["message"],
                                   invalid(row["reason"])) for row in undelivered),
            "positions": sorted((row["partition"], row["offset"]) for row in readout.offsets(config, subscription)),
            "metrics": {key: readout.metrics(config, subscription).get(key)
                        for key in ("delivered", "discarded", "filtered", "batchesDelivered")},
            "retries": sorted((row["partition"], row["offset"], row["message_id"], row["state"], row["http_status"])
                              for row in rows),
            # attempts the subscriber answered, and attempts it may never have seen (they failed on the way: a
            # connection refused or cut, a timeout), which depend on the machine's load, not on the stack
            "attempts": {row["message_id"]: (row["attempts"], seen[(subscription.name, row["message_id"])])
                         for row in rows},
            "failed": counts["timeouts"] + counts["otherErrors"],
        }
    return {"received": received(subscriber.requests), "again": received(again.requests), "tables": tables}


def test_both_stacks_deliver_and_record_the_same(broker, spark, topic_name, tmp_path):
    require_jars(spark, DELTA_SPARK_CLASS)
    require_jars(spark, SPARK_AVRO_CLASS)
    json_topic, avro_topic = f"{topic_name}.json", f"{topic_name}.avro"
    between = publish(broker, json_topic, avro_topic)
    jvm = deliver(spark, tmp_path, broker, "jvm", json_topic, avro_topic, between)
    python = deliver(spark, tmp_path, broker, "python", json_topic, avro_topic, between)

    # the scenario did what it is meant to, on one stack at least, before both are compared
    tables = jvm["tables"]
    everything = tables[f"{json_topic}.everything"]
    sent = documents("web", 0, 30) + documents("app", 100, 25)
    refused = sum(1 for d in sent if d.get("replies") == [{"status": 400}])
    parked = sum(1 for d in sent if d.get("replies") == [PARKED_REPLY])
    assert refused and parked
    assert everything["metrics"]["delivered"] == len(sent) - refused - parked, everything
    assert everything["metrics"]["discarded"] == refused and len(everything["undelivered"]) >= refused
    assert [row[3] for row in everything["retries"]] == ["PARKED"] * parked, everything["retries"]
    assert tables[f"{json_topic}.from-web"]["metrics"]["filtered"] == 25
    assert tables[f"{json_topic}.batched"]["metrics"]["batchesDelivered"] >= 5
    assert any("could not be decoded" in row[4] for row in tables[f"{avro_topic}.as-avro"]["undelivered"])
    assert sum(len(positions) for positions in (t["positions"] for t in tables.values())) == 4 * 3 + 2 * 2
    assert {name: len(items) for name, items in jvm["received"].items()} == \
        {name: len(items) for name, items in python["received"].items()}

    again = [json.loads(body) for _, body, attempt in jvm["again"].get("paid", []) if attempt == 0]
    assert sorted(d["n"] for d in again) == sorted(d["n"] for d in sent if d["source"] == "app" and d["status"] ==
                                                   "PAID"), "the retransmission did not start at the date"
    assert set(jvm["again"]) == {"paid"}, "only the subscription moved back gets anything in the second run"

    for name in jvm["received"]:
        assert jvm["received"][name] == python["received"][name], f"{name} received something else"
    assert jvm["again"] == python["again"]
    for name in tables:
        for part in ("undelivered", "retries", "positions", "metrics"):
            assert jvm["tables"][name][part] == python["tables"][name][part], f"{name}: its {part} differ"
        for stack in (jvm, python):  # each parked message's attempts: those answered, plus any that failed unseen
            recorded = stack["tables"][name]
            for message_id, (attempts, answered) in recorded["attempts"].items():
                assert answered <= attempts <= answered + recorded["failed"], (name, message_id, recorded)
        if jvm["tables"][name]["failed"] == python["tables"][name]["failed"] == 0:
            assert jvm["tables"][name]["attempts"] == python["tables"][name]["attempts"], f"{name}: attempts differ"
