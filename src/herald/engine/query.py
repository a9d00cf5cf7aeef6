"""One streaming query per ACTIVE subscription, and its micro-batch handler (`foreachBatch`).

A micro-batch is finished only when every message in it is delivered or discarded: `handle_batch` returns
after the senders have run and the tables are written, and only then does Spark commit the batch's offsets.
A crash at any point means the batch is read again and redelivered (at least once), never lost; the table
writes are keyed by (subscription, batch) so a replayed batch is not counted twice.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import StructField, StructType

from herald.avro.decode import DECODED_FIELDS, decode_batches
from herald.config import HeraldConfig, Subscription, filter_rules
from herald.config.model import ContentType
from herald.delivery.flow import FlowState
from herald.delivery.report import REPORT_DDL, summarize
from herald.delivery.task import delivery_task
from herald.engine.planner import plan_task, task_count
from herald.filters import filter_column
from herald.source.kafka_offsets import resolve_offsets
from herald.source.stream import open_kafka_stream
from herald.storage import BatchTxn, TableStore
from herald.storage.tables import (
    METRICS,
    OFFSETS,
    UNDELIVERED,
    BatchContext,
    metrics_row,
    offsets_rows,
    undelivered_rows,
)

log = logging.getLogger(__name__)

START_BATCH_ID = -1  # offsets rows holding the position a subscription started from


def checkpoint_location(storage_path: str, subscription_id: str) -> str:
    return f"{storage_path.rstrip('/')}/checkpoints/{subscription_id}"


class SubscriptionStream:
    """The streaming query of one subscription."""

    def __init__(self, spark, config: HeraldConfig, subscription: Subscription, store: TableStore, connector: str):
        self.spark = spark
        self.config = config
        self.subscription = subscription
        self.topic = config.topic_of(subscription)
        self.store = store
        self.connector = connector
        self.flow_state = FlowState()
        self.query = None
        self._query_id: str | None = None
        self._started = threading.Event()

    # -- starting ---------------------------------------------------------------------------------------------
    def client_config(self) -> dict[str, str]:
        kafka = self.config.settings.kafka
        return {"bootstrap.servers": kafka.bootstrapServers, **kafka.properties}

    def starting_offsets(self) -> str:
        """Where a new subscription starts. 'latest' is resolved once, when the subscription first runs, and kept
        in the offsets table, so a subscriber gets every message published after that (as in Hermes), even if
        the first run found nothing to deliver."""
        if self.subscription.startingOffsets == "earliest":
            return "earliest"
        pinned = self.store.read(OFFSETS, self.subscription.id).to_pylist()
        start = {row["partition"]: row["offset"] for row in pinned if row["batch_id"] == START_BATCH_ID}
        if not start:
            resolved = resolve_offsets(self.client_config(), [self.topic.kafka_topic], "latest")
            start = {int(p): offset for p, offset in resolved[self.topic.kafka_topic].items()}
            positions = {(self.topic.kafka_topic, p): offset for p, offset in start.items()}
            self.store.append(OFFSETS, offsets_rows(positions, self.subscription.id, START_BATCH_ID),
                              BatchTxn(f"herald-start:{self.subscription.id}", 0))
            log.info("%s starts at the latest offsets %s", self.subscription.id, start)
        return json.dumps({self.topic.kafka_topic: {str(p): offset for p, offset in sorted(start.items())}})

    def stream(self):
        """The subscription's Kafka records, decoded once when the topic is AVRO, with the filter verdict in
        `matched` and the body to deliver in `value` (kept only when matched)."""
        settings = self.config.settings
        raw = open_kafka_stream(
            self.spark,
            self.connector,
            settings.kafka.bootstrapServers,
            settings.kafka.properties,
            self.topic.kafka_topic,
            self.starting_offsets(),
            settings.streaming.maxOffsetsPerTrigger,
        )
        if self.topic.contentType is ContentType.AVRO:
            records, filtered_column, delivery = self._decoded(raw)
        else:
            records, filtered_column = raw, "value"
            delivery = {"body": F.col("value"), "text": F.lit(None).cast("string"),
                        "error": F.lit(None).cast("string"), "raw": F.lit(None).cast("binary"),
                        "schema_id": F.lit(None).cast("int"), "schema_version": F.lit(None).cast("int")}
        matched = filter_column(filter_rules(self.subscription), filtered_column, "headers")
        keys = ["topic", "partition", "offset", "timestamp", "key", "headers"]
        return records.select(*keys, matched.alias("matched"), *(column.alias(name) for name, column in delivery.items())) \
            .select(*keys, "matched", F.when(F.col("matched"), F.col("body")).alias("value"),
                    F.when(F.col("matched"), F.col("text")).alias("text"),
                    "error", "raw", "schema_id", "schema_version")

    def _decoded(self, raw):
        """An AVRO topic: every record decoded once (JSON text for the filters), and what to deliver."""
        source = self.config.avro_source(self.topic)
        schema = StructType(raw.schema.fields + [StructField(f.name, from_arrow_type(f.type)) for f in DECODED_FIELDS])
        decoded = raw.mapInArrow(decode_batches(source), schema)
        avro_delivery = self.subscription.contentType is ContentType.AVRO
        delivery = {
            "body": F.expr(source.payload_sql) if avro_delivery else F.col("json").cast("binary"),
            "text": F.col("json") if avro_delivery else F.lit(None).cast("string"),
            "error": F.col("decode_error"),
            "raw": F.when(F.col("decode_error").isNotNull(), F.col("value")),
            "schema_id": F.col("schema_id"),
            "schema_version": F.col("schema_version"),
        }
        return decoded, "json", delivery

    def start(self, once: bool):
        writer = (
            self.stream().writeStream.queryName(self.subscription.id)
            .option("checkpointLocation", checkpoint_location(self.config.storage_path, self.subscription.id))
            .foreachBatch(self.handle_batch)
        )
        if once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=self.config.settings.streaming.triggerInterval)
        self.query = writer.start()
        self._query_id = str(self.query.id)
        self._started.set()
        log.info("%s: streaming to %s", self.subscription.id, self.subscription.target.masked)
        return self.query

    # -- one micro-batch --------------------------------------------------------------------------------------
    def handle_batch(self, batch_df, batch_id: int) -> None:
        self._started.wait()
        subscription = self.subscription
        started = time.monotonic()
        partitions = batch_df.rdd.getNumPartitions()
        tasks = task_count(partitions, subscription.subscriptionPolicy.inflightSize,
                           self.spark.sparkContext.defaultParallelism, self.flow_state)
        plan = plan_task(subscription, tasks, self.config.settings.rateControl.flow_settings(), self.flow_state)
        frame = batch_df.coalesce(tasks) if tasks < partitions else batch_df
        # The only action on this batch: the senders run exactly once per task.
        outcome = frame.mapInArrow(delivery_task(plan), REPORT_DDL).toArrow()
        summary = summarize(outcome)
        self.flow_state = FlowState.combine(summary.flow_states, self.flow_state)
        self._store(summary, batch_id)
        counters = summary.counters
        log.info(
            "%s batch %d: read %d, delivered %d, discarded %d, filtered %d, %d attempts in %.1f s over %d task(s); "
            "flow %s", subscription.id, batch_id, counters.read, counters.delivered, counters.discarded,
            counters.filtered, counters.attempts, time.monotonic() - started, tasks, self.flow_state.mode.value)

    def _store(self, summary, batch_id: int) -> None:
        context = BatchContext(self.subscription.id, self.subscription.topicName,
                               self.config.settings.kafka.cluster, batch_id)
        txn = BatchTxn(f"herald:{self.subscription.id}:{self._query_id}", batch_id)
        if summary.discarded:
            self.store.append(UNDELIVERED, undelivered_rows(summary, context), txn)
        flow_rate = self.flow_state.rate_per_s
        self.store.append(METRICS, metrics_row(summary, context, self.flow_state.mode.value, flow_rate), txn)
        if summary.positions:
            self.store.append(OFFSETS, offsets_rows(summary.positions, self.subscription.id, batch_id), txn)
