"""Shared fixtures: one embedded broker and one SparkSession for the whole test session (both are slow to start),
and Apache Kafka itself for the tests that need the real thing (started on first use only)."""

from __future__ import annotations

import itertools
import os
import socket
import uuid
from pathlib import Path

import pytest

from herald.broker import EmbeddedBroker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def broker(tmp_path_factory) -> EmbeddedBroker:
    """A real Kafka-protocol broker (noida-db) on a free loopback port."""
    embedded = EmbeddedBroker(tmp_path_factory.mktemp("broker"), port=free_port())
    embedded.up()
    yield embedded
    embedded.down()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """Apache Kafka's own broker (KRaft, one node) on free loopback ports, started once, by the first test that asks
    for it (4-5 s; jars fetched by `make install`, or here the first time). Tests may restart it; it keeps its data.
    It listens for PLAINTEXT (`bootstrap_servers`) and SASL_SSL (`sasl_bootstrap_servers`, CA `pki.ca`)."""
    from tests.support.kafka_broker import KafkaBroker

    kafka = KafkaBroker(tmp_path_factory.mktemp("kafka"), sasl_ssl=True)
    kafka.start()
    yield kafka
    kafka.stop()


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession with two cores, as CI has."""
    from herald.session import get_or_create_session

    os.environ.setdefault("HERALD_TEST", "1")
    session = get_or_create_session("local[2]", {"spark.sql.shuffle.partitions": "2"}, app_name="herald-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def source_spark(spark):
    """The session with Herald's Python Kafka Data Source registered (`herald_kafka`)."""
    from herald.source import register_python_source

    register_python_source(spark)
    return spark


_topic_counter = itertools.count()


@pytest.fixture
def topic_name() -> str:
    """A fresh Kafka topic name per test (`group.name` form) so tests never see each other's messages."""
    return f"test.t{next(_topic_counter)}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def workdir(tmp_path) -> Path:
    return tmp_path
