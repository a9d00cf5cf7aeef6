"""Reading Kafka: Spark's built-in `kafka` source when its jars load, Herald's Python Data Source otherwise."""

PYTHON_SOURCE_NAME = "herald_kafka"


def register_python_source(spark) -> None:
    """Register Herald's Python Kafka Data Source (format name `herald_kafka`) with `spark`."""
    from herald.source.python_kafka import HeraldKafkaDataSource

    spark.dataSource.register(HeraldKafkaDataSource)
