"""Herald's Kafka source as a PySpark Python Data Source (format ``herald_kafka``), over confluent-kafka.

Used where Spark's built-in ``kafka`` source is unavailable (its jars come only from Maven). It is a drop-in for
``spark.readStream.format("kafka").option("includeHeaders", "true")`` and for the batch
``spark.read.format("kafka")``: same columns, same option names, same offsets JSON in the checkpoint::

    register_python_source(spark)
    stream = (spark.readStream.format("herald_kafka")
              .option("kafka.bootstrap.servers", "127.0.0.1:19092")
              .option("subscribe", "orders.created,orders.paid")
              .option("startingOffsets", "earliest")        # or "latest", or '{"orders.created": {"0": 23, "1": -2}}'
              .option("maxOffsetsPerTrigger", "10000")
              .load())
    ranges = (spark.read.format("herald_kafka")
              .option("kafka.bootstrap.servers", "127.0.0.1:19092")
              .option("subscribe", "orders.created")
              .option("startingOffsets", '{"orders.created": {"0": 23, "1": -2}}')
              .option("endingOffsets", '{"orders.created": {"0": 40, "1": -1}}')
              .load())

The options are listed in `herald.source.options`. The modules behind this one: `options` (parsing),
`stream_reader` and `batch_reader` (planning, beside the driver), `planning` (what both share), `fetch` (reading a
range in Spark's Python workers) and `consumers` (the per-process consumer cache).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from herald.source import PYTHON_SOURCE_NAME
from herald.source.batch_reader import HeraldKafkaBatchReader
from herald.source.options import SourceOptions
from herald.source.stream_reader import HeraldKafkaStreamReader


def kafka_schema() -> StructType:
    """The columns of Spark's kafka source with includeHeaders=true."""
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )


class HeraldKafkaDataSource(DataSource):
    """Kafka as a PySpark Data Source, streaming and batch; see `herald.source.options` for the options."""

    @classmethod
    def name(cls) -> str:
        return PYTHON_SOURCE_NAME

    def schema(self) -> StructType:
        return kafka_schema()

    def streamReader(self, schema: StructType) -> HeraldKafkaStreamReader:
        _check_schema(schema)
        return HeraldKafkaStreamReader(SourceOptions.parse(self.options))

    def reader(self, schema: StructType) -> HeraldKafkaBatchReader:
        _check_schema(schema)
        return HeraldKafkaBatchReader(SourceOptions.parse(self.options, batch=True))


def _check_schema(schema: StructType) -> None:
    if schema != kafka_schema():
        raise ValueError(
            f"{PYTHON_SOURCE_NAME} has a fixed schema ({kafka_schema().simpleString()}); "
            f"do not pass another one ({schema.simpleString()})"
        )
