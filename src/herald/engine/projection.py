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
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import functions as F

from herald.avro.jvm import decode
from herald.config import HeraldConfig, Subscription, filter_rules
from herald.config.model import ContentType, Topic
from herald.delivery.message import MESSAGE_ID_NAMESPACE
from herald.filters.targets import with_targets


def project(raw, config: HeraldConfig, topic: Topic, subscriptions: Sequence[Subscription]):
    """`raw`: Kafka rows (either connector's columns); the result has the columns in the module docs."""
    rule_sets = [filter_rules(subscription) for subscription in subscriptions]
    position_id = position_message_id(topic.kafka_topic)
    if topic.contentType is not ContentType.AVRO:
        rows = with_targets(raw, rule_sets, "value", "headers")
        goes = F.size("targets") > 0
        return rows.select("partition", "offset", "timestamp", "headers", "targets",
                           F.when(goes, F.col("key")).alias("key"), F.when(goes, F.col("value")).alias("value"),
                           F.when(goes, position_id).alias("position_id"))
    source = config.avro_source(topic)
    decoded = decode(raw, source, config.settings.avro.decoder)  # from_avro in the JVM, or fastavro
    rows = with_targets(decoded, rule_sets, "json", "headers")
    goes = F.size("targets") > 0
    wants_avro = any(subscription.contentType is ContentType.AVRO for subscription in subscriptions)
    avro = F.when(goes, F.expr(source.payload_sql)) if wants_avro else F.lit(None).cast("binary")
    keeps_raw = F.col("decode_error").isNotNull()
    if any(subscription.onDiscard is not None for subscription in subscriptions):
        keeps_raw = keeps_raw | goes  # a dead-letter topic gets the original bytes
    return rows.select(
        "partition", "offset", "timestamp", "headers", "targets",
        F.when(goes, F.col("key")).alias("key"),
        F.when(goes, F.col("json").cast("binary")).alias("value"),
        avro.alias("avro"),
        F.col("decode_error").alias("error"),
        F.when(keeps_raw, F.col("value")).alias("raw"),
        "schema_id", "schema_version",
        F.when(goes, position_id).alias("position_id"),
    )


def position_message_id(kafka_topic: str):
    """The message id of a record without an `id` header, `herald.delivery.message.uuid5_text` of
    "<topic>/<partition>/<offset>", as a Spark column: the UUID version 5 text, computed in the JVM rather than
    in the delivery tasks' Python (about a fifth of their per-message work there)."""
    name = F.concat(F.lit(f"{kafka_topic}/"), F.col("partition").cast("string"), F.lit("/"),
                    F.col("offset").cast("string")).cast("binary")
    digest = F.sha1(F.concat(F.unhex(F.lit(MESSAGE_ID_NAMESPACE.hex)), name))  # 40 hex digits, lower case
    # (one SHA-1 a row: Spark computes a repeated subexpression once)

    def digits(first: int, count: int):
        return digest.substr(first, count)

    # version 5 in digit 13; RFC 4122's variant in digit 17: its two top bits set to 10 (0-f -> 89ab89ab...)
    variant = F.lit("89ab89ab89ab89ab").substr(F.conv(digits(17, 1), 16, 10).cast("int") + 1, F.lit(1))
    return F.concat_ws("-", digits(1, 8), digits(9, 4), F.concat(F.lit("5"), digits(14, 3)),
                       F.concat(variant, digits(18, 3)), digits(21, 12))
