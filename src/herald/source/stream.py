"""Reading a Kafka topic with the chosen connector, as a stream or as explicit offset ranges (format dispatch in
one place).

Both connectors give the same columns: key, value, topic, partition, offset, timestamp, timestampType, headers.
"""

from __future__ import annotations

import json
import logging

from herald import kafka_properties
from herald.session import jvm_class_loads
from herald.source import PYTHON_SOURCE_NAME, register_python_source

log = logging.getLogger(__name__)

SPARK_KAFKA_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def choose_connector(spark, setting: str) -> str:
    """'spark' or 'python' for herald.yaml's kafka.connector ('auto' | 'spark' | 'python')."""
    if setting not in ("auto", "spark", "python"):
        raise ValueError(f"kafka.connector must be auto, spark or python, not {setting!r}")
    has_spark_kafka = jvm_class_loads(spark, SPARK_KAFKA_CLASS)
    if setting == "spark" and not has_spark_kafka:
        raise RuntimeError("kafka.connector is 'spark' but spark-sql-kafka is not on Spark's classpath "
                           "(add org.apache.spark:spark-sql-kafka-0-10 to spark.jars.packages, or use 'auto')")
    chosen = "spark" if setting == "spark" or (setting == "auto" and has_spark_kafka) else "python"
    if chosen == "python":
        register_python_source(spark)
    log.info("kafka source: %s", "Spark's built-in kafka connector" if chosen == "spark"
             else f"Herald's Python Data Source ({PYTHON_SOURCE_NAME}, confluent-kafka)")
    return chosen


def open_kafka_stream(
    spark,
    connector: str,
    bootstrap_servers: str,
    client_properties: dict[str, str],
    kafka_topic: str,
    starting_offsets: str,
    max_offsets_per_trigger: int | None,
):
    """A streaming DataFrame of `kafka_topic`; `starting_offsets` is 'earliest', 'latest' or Spark's JSON."""
    reader = _with_client_options(spark.readStream, connector, bootstrap_servers, client_properties)
    # Records retention deleted before they were read must not stop the topic: the rounds find and record them
    # (`herald.engine.round.steps.lost_in`).
    reader = (reader.option("subscribe", kafka_topic).option("startingOffsets", starting_offsets)
              .option("failOnDataLoss", "false"))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()


def read_kafka_range(
    spark,
    connector: str,
    bootstrap_servers: str,
    client_properties: dict[str, str],
    kafka_topic: str,
    start: dict[int, int],
    end: dict[int, int],
):
    """A batch DataFrame of the records of `kafka_topic` with ``start[p] <= offset < end[p]`` for each partition p.

    `start` and `end` name the same partitions (only those are read, through Spark's `assign` option); an empty
    range (``start[p] == end[p]``) reads nothing, and no partition at all gives an empty DataFrame. Records gone
    from Kafka are skipped (failOnDataLoss=false: the caller finds them from what was read). Raises ValueError for
    mismatched partitions or a start after its end. Offsets 10..19 of partition 0 and 0..4 of partition 1::

        read_kafka_range(spark, "python", "127.0.0.1:19092", {}, "orders", {0: 10, 1: 0}, {0: 20, 1: 5})
    """
    if set(start) != set(end):
        raise ValueError(f"start and end must name the same partitions, not {sorted(start)} and {sorted(end)}")
    backwards = [f"{p}: [{start[p]}, {end[p]})" for p in sorted(start) if not 0 <= start[p] <= end[p]]
    if backwards:
        raise ValueError(f"{kafka_topic}: offset ranges must have 0 <= start <= end, not {', '.join(backwards)}")
    if not start:
        from herald.source.python_kafka import kafka_schema

        return spark.createDataFrame([], kafka_schema())
    partitions = sorted(start)
    reader = _with_client_options(spark.read, connector, bootstrap_servers, client_properties)
    return (
        reader.option("assign", json.dumps({kafka_topic: partitions}))
        .option("failOnDataLoss", "false")
        .option("startingOffsets", json.dumps({kafka_topic: {str(p): start[p] for p in partitions}}))
        .option("endingOffsets", json.dumps({kafka_topic: {str(p): end[p] for p in partitions}}))
        .load()
    )


def _with_client_options(reader, connector: str, bootstrap_servers: str, client_properties: dict[str, str]):
    """`reader` (spark.read or spark.readStream) on the connector's format, with the Kafka client options."""
    if connector not in ("spark", "python"):
        raise ValueError(f"connector must be 'spark' or 'python', not {connector!r}")
    reader = reader.format("kafka" if connector == "spark" else PYTHON_SOURCE_NAME)
    if connector == "python":
        from herald.source.python_kafka import kafka_schema

        reader = reader.schema(kafka_schema())  # saves Spark a Python process to ask the source for it
    else:
        reader = reader.option("includeHeaders", "true")
    reader = reader.option("kafka.bootstrap.servers", bootstrap_servers)
    if connector == "spark":  # Java's client: the properties in its names (the Python source translates its own)
        client_properties = kafka_properties.for_java(client_properties)
    for key, value in client_properties.items():
        reader = reader.option(f"kafka.{key}", value)
    return reader
