"""A topic's rows as the delivery tasks read them: decoded once, filtered once for every subscription.

One projection per round, whatever the number of subscriptions: an AVRO topic's records are decoded once
(spark-avro's from_avro, or fastavro over Arrow batches, into JSON text: herald.avro.jvm), the JSON is parsed
once for the union of every subscription's filter paths, and every subscription's filter is a condition in the
same projection, giving `targets`: the indices (into the given subscription list) of the subscriptions each row
goes to. Only rows that go somewhere carry their message to Python; the others carry only their partition and
offset (positions move over them).

Columns: partition, offset, timestamp, headers, targets, key, value (what JSON subscriptions receive), and for
AVRO topics avro (what AVRO subscriptions receive), error, raw (the record's original bytes: for undecodable
records, and for every row when a subscription has a dead-letter topic), schema_id, schema_version; and for
both, position_id: the message id of a row that goes somewhere, unless its `id` header names one
(`position_message_id`).

`project_topics` projects the rows of several JSON topics at once (each topic's filters guarded by its name),
for a delivery job shared by the topics of a micro-batch: its rows are what each topic's own `project` gives,
plus `round`, the topic's place in the list (tests/integration/test_projection_topics.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import functions as F

from herald.avro.jvm import decode
from herald.config import HeraldConfig, Subscription, filter_rules
from herald.config.model import ContentType, Topic
from herald.delivery.message import MESSAGE_ID_NAMESPACE
from herald.filters.sql import lit
from herald.filters.targets import with_targets


def project(raw, config: HeraldConfig, topic: Topic, subscriptions: Sequence[Subscription]):
    """`raw`: Kafka rows (either connector's columns); the result has the columns in the module docs."""
    rule_sets = [filter_rules(subscription) for subscription in subscriptions]
    digest = position_digest(topic.kafka_topic)
    if topic.contentType is not ContentType.AVRO:
        rows = with_targets(raw, rule_sets, "value", "headers")
        goes = F.size("targets") > 0
        return with_position_ids(rows.select(
            "partition", "offset", "timestamp", "headers", "targets",
            F.when(goes, F.col("key")).alias("key"), F.when(goes, F.col("value")).alias("value"),
            F.when(goes, digest).alias("position_id")))
    source = config.avro_source(topic)
    decoded = decode(raw, source, config.settings.avro.decoder)  # from_avro in the JVM, or fastavro
    rows = with_targets(decoded, rule_sets, "json", "headers")
    goes = F.size("targets") > 0
    wants_avro = any(subscription.contentType is ContentType.AVRO for subscription in subscriptions)
    avro = F.when(goes, F.expr(source.payload_sql)) if wants_avro else F.lit(None).cast("binary")
    keeps_raw = F.col("decode_error").isNotNull()
    if any(subscription.onDiscard is not None for subscription in subscriptions):
        keeps_raw = keeps_raw | goes  # a dead-letter topic gets the original bytes
    return with_position_ids(rows.select(
        "partition", "offset", "timestamp", "headers", "targets",
        F.when(goes, F.col("key")).alias("key"),
        F.when(goes, F.col("json").cast("binary")).alias("value"),
        avro.alias("avro"),
        F.col("decode_error").alias("error"),
        F.when(keeps_raw, F.col("value")).alias("raw"),
        "schema_id", "schema_version",
        F.when(goes, digest).alias("position_id"),
    ))


def project_topics(raw, config: HeraldConfig, topics: Sequence[tuple[Topic, Sequence[Subscription]]]):
    """The rows of several JSON topics (`raw`: Kafka rows, either connector's columns, with a `topic` column) in
    one projection: each topic's rows as `project` gives them for its subscriptions, with one more column,
    `round`: the topic's place in `topics`. A row's `targets` are indices into its own topic's subscriptions (each
    topic's filters guarded by its name: a row never goes to another topic's subscription). One parse of the JSON
    per row for every topic's filter paths, rows of other topics left out. Raises ValueError for an AVRO topic
    (each decodes with a schema of its own: `project`)."""
    rule_sets, guards, values, rounds = [], [], [], []
    for place, (topic, subscriptions) in enumerate(topics):
        if topic.contentType is ContentType.AVRO:
            raise ValueError(f"{topic.kafka_topic} is an AVRO topic: it is projected alone")
        guard = f"topic = {lit(topic.kafka_topic)}"
        rounds.append(f"WHEN {guard} THEN {place}")
        for index, subscription in enumerate(subscriptions):
            rule_sets.append(filter_rules(subscription))
            guards.append(guard)
            values.append(index)
    names = [topic.kafka_topic for topic, _ in topics]
    rows = with_targets(raw.where(F.col("topic").isin(names)), rule_sets, "value", "headers", guards=guards,
                        values=values)
    goes = F.size("targets") > 0
    return with_position_ids(rows.select(
        F.expr(f"CASE {' '.join(rounds)} END").cast("int").alias("round"),
        "partition", "offset", "timestamp", "headers", "targets",
        F.when(goes, F.col("key")).alias("key"), F.when(goes, F.col("value")).alias("value"),
        F.when(goes, _digest("concat(topic, '/')")).alias("position_id")))


def position_digest(kafka_topic: str):
    """SHA-1 of the message-id namespace and "<topic>/<partition>/<offset>", as 40 lower-case hex digits: what
    `herald.delivery.message.uuid5_text` hashes for a record without an `id` header. (SQL text: one call to the
    JVM per round, where the same built from functions took some forty.)"""
    return _digest(lit(kafka_topic + "/"))


def _digest(prefix_sql: str):
    """`position_digest` of the rows whose "<topic>/" is the SQL `prefix_sql`."""
    return F.expr(f"sha1(concat(unhex('{MESSAGE_ID_NAMESPACE.hex}'), cast(concat({prefix_sql}, "
                  "cast(partition AS STRING), '/', cast(offset AS STRING)) AS BINARY)))")


# version 5 in digit 13; RFC 4122's variant in digit 17: its two top bits set to 10 (0-f -> 89ab89ab...)
_UUID_TEXT = ("CASE WHEN position_id IS NOT NULL THEN concat_ws('-', substr(position_id, 1, 8), "
              "substr(position_id, 9, 4), concat('5', substr(position_id, 14, 3)), "
              "concat(substr('89ab89ab89ab89ab', cast(conv(substr(position_id, 17, 1), 16, 10) AS INT) + 1, 1), "
              "substr(position_id, 18, 3)), substr(position_id, 21, 12)) END")


def with_position_ids(rows):
    """`rows` with its `position_id` column (a `position_digest`, or null) turned into the message id's text,
    the UUID version 5 `uuid5_text` gives, in the JVM rather than in the delivery tasks' Python. A projection of
    its own: the digest's digits are taken six times, and inside the CASE WHEN that computed it Spark would hash
    six times (a costly expression used more than once keeps its projection apart)."""
    return rows.withColumn("position_id", F.expr(_UUID_TEXT))


def position_message_id(kafka_topic: str, rows):
    """`rows` (with partition and offset) with a `position_id` column: the message id of each row's position."""
    return with_position_ids(rows.withColumn("position_id", position_digest(kafka_topic)))
