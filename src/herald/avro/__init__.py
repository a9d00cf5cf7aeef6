"""Avro topics: schemas (an .avsc file or a Confluent-compatible registry), decoding and conversion to JSON."""
