"""Herald: push delivery engine (Kafka -> filters -> HTTP) on Spark Structured Streaming."""

__version__ = "0.1.0"
