"""Opening a subscription's Kafka stream with the chosen connector (format dispatch in one place).

Both connectors give the same columns: key, value, topic, partition, offset, timestamp, timestampType, headers.
"""

from __future__ import annotations

import logging

from herald.engine.session import jvm_class_loads
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
    reader = spark.readStream.format("kafka" if connector == "spark" else PYTHON_SOURCE_NAME)
    if connector == "python":
        from herald.source.python_kafka import kafka_schema

        reader = reader.schema(kafka_schema())  # saves Spark a Python process to ask the source for it
    reader = reader.option("kafka.bootstrap.servers", bootstrap_servers)
    for key, value in client_properties.items():
        reader = reader.option(f"kafka.{key}", value)
    reader = reader.option("subscribe", kafka_topic).option("startingOffsets", starting_offsets)
    if connector == "spark":
        reader = reader.option("includeHeaders", "true")
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()
