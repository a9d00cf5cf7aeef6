"""Several JSON topics in one projection (`projection.project_topics`) give each row what its own topic's
projection (`projection.project`) gives it: the same targets, message ids and columns, and never a subscription
of another topic, even where topics share filter paths and matchers. Real Spark, rows shaped as Kafka gives them.
"""

from __future__ import annotations

import json

import pytest
from pyspark.sql import functions as F

from herald.config import load_config
from herald.config.model import ContentType
from herald.engine.round.projection import project, project_topics
from tests.support.herald_env import write_topics_conf

KAFKA_ROWS = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
              "headers array<struct<key:string,value:binary>>")

# topic -> its subscriptions' filters; `t.alpha` and `t.delta` share a rule, `t.beta` has no filter at all
LAYOUT = {
    "t.alpha": {"one": [{"type": "jsonpath", "path": "$.sub", "matcher": "1"}],
                "eu": [{"type": "jsonpath", "path": "$.user.country", "matcher": "PL|DE"},
                       {"type": "header", "header": "tenant", "matcher": "a"}]},
    "t.beta": {"all": []},
    "t.gamma": {"s0": [{"type": "jsonpath", "path": "$.sub", "matcher": "0"}],
                "s1": [{"type": "jsonpath", "path": "$.sub", "matcher": "1"}],
                "s2": [{"type": "jsonpath", "path": "$.sub", "matcher": "2"}]},
    "t.delta": {"one": [{"type": "jsonpath", "path": "$.sub", "matcher": "1"}],
                "anywhere": [{"type": "jsonpath", "path": "$.tags[*]", "matcher": "x",
                              "matchingStrategy": "any"}]},
}


def _rows(topics: list[str]) -> list[tuple]:
    rows = []
    for place, topic in enumerate(topics):
        for offset in range(24):
            document = {"sub": str(offset % 3), "user": {"country": ["PL", "US", "DE", "FR"][offset % 4]},
                        "tags": ["x"] if offset % 4 == 0 else ["y"], "topic": place}
            headers = [("tenant", bytearray(b"a" if offset % 5 else b"b"))]
            if offset == 5:
                headers.append(("id", bytearray(b"publisher-id")))
            key = bytearray(f"k{offset}".encode()) if offset % 5 else None
            rows.append((key, bytearray(json.dumps(document).encode()), topic, offset % 2, offset, None, headers))
    rows.append((None, bytearray(b'{"sub": "1"}'), "t.other", 0, 0, None, []))  # a topic not asked for
    return rows


@pytest.mark.spark
def test_several_topics_in_one_projection_give_each_row_its_own_topics_projection(spark, tmp_path):
    layout = {topic: {name: {"endpoint": f"http://127.0.0.1:9/{topic}/{name}", "filters": filters}
                      for name, filters in subscriptions.items()} for topic, subscriptions in LAYOUT.items()}
    config = load_config(write_topics_conf(tmp_path, "127.0.0.1:9", layout))
    topics = sorted(LAYOUT)
    rounds = [(config.topics[name], [s for s in config.subscriptions if s.topicName == name]) for name in topics]
    raw = spark.createDataFrame(_rows(topics), KAFKA_ROWS).withColumn(
        "timestamp", F.timestamp_seconds(F.col("offset") + 1_790_000_000))

    together = {(row["round"], row["partition"], row["offset"]): row.asDict()
                for row in project_topics(raw, config, rounds).collect()}
    alone = {}
    for place, (topic, subscriptions) in enumerate(rounds):
        own = raw.where(raw.topic == topic.kafka_topic)
        for row in project(own, config, topic, subscriptions).collect():
            alone[(place, row["partition"], row["offset"])] = {"round": place, **row.asDict()}
    assert len(together) == 24 * len(topics), "every row of the topics asked for, and no other"
    assert together == alone
    # the checks above would pass if both were empty: the filters do select, per topic
    targets = {(place, offset): row["targets"] for (place, _, offset), row in together.items()}
    alpha, beta, gamma, delta = (topics.index(name) for name in ("t.alpha", "t.beta", "t.gamma", "t.delta"))
    one, eu = (rounds[alpha][1].index(config.subscription(f"t.alpha.{name}")) for name in ("one", "eu"))
    assert [targets[(alpha, offset)] for offset in (4, 1, 2, 0)] == [sorted([one, eu]), [one], [eu], []]
    assert [targets[(gamma, offset)] for offset in (3, 4, 5)] == [[0], [1], [2]]
    assert all(targets[(beta, offset)] == [0] for offset in range(24))
    anywhere = rounds[delta][1].index(config.subscription("t.delta.anywhere"))
    assert [targets[(delta, offset)] for offset in (4, 3, 8)] == [[0, 1], [], [anywhere]]
    assert together[(beta, 1, 5)]["position_id"] is not None and together[(alpha, 0, 0)]["value"] is None


@pytest.mark.spark
def test_an_avro_topic_is_not_projected_with_others(spark, tmp_path):
    layout = {"t.json": {"s": {"endpoint": "http://127.0.0.1:9/s"}}}
    config = load_config(write_topics_conf(tmp_path, "127.0.0.1:9", layout))
    topic = config.topics["t.json"]
    avro = topic.model_copy(update={"contentType": ContentType.AVRO})
    raw = spark.createDataFrame([], KAFKA_ROWS)
    with pytest.raises(ValueError, match="AVRO topic"):
        project_topics(raw, config, [(topic, config.subscriptions), (avro, [])])
