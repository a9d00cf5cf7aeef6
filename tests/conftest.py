"""Shared fixtures: one embedded broker and one SparkSession for the whole test session (both are slow to start),
and Apache Kafka itself for the tests that need the real thing (started on first use only)."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from herald.broker import EmbeddedBroker

# The files that take minutes on a loaded 2-core machine (`--durations`), slowest first: collected before the rest,
# so that `make test`'s two workers (`-n 2 --dist loadfile --no-loadscope-reorder`, files handed out in this
# order) start them early and end together on the short files, instead of one worker starting a file of
# several minutes while the other has nothing left. A file not named keeps its place after these.
SLOW_FILES_FIRST = (
    "test_dist.py",
    "test_cluster.py",
    "test_many_topics.py",
    "test_restart_catch_up.py",
    "test_spark_upkeep.py",
    "test_stack_parity.py",
    "test_filter_compile.py",
    "test_avropath_compile.py",
    "test_batch_e2e.py",
    "test_restart_ctrl_c.py",
    "test_spark_submit_entry.py",
    "test_restart.py",
    "test_avro_registry_outage.py",
    "test_flow_control.py",
    "test_hanging_subscriber.py",
    "test_once_throttled.py",
    "test_kafka_sasl_ssl.py",
    "test_priority_e2e.py",
    "test_fanout_e2e.py",
    "test_cluster_backends.py",
)


def pytest_configure(config) -> None:
    """Faster Spark driver JVMs for the whole run (tests/support/jvm_archive.py): set once, before the xdist workers
    start, so that they, their sessions and every `herald run` or spark-submit they start inherit it. A run of the
    unit tests alone builds nothing; SPARK_SUBMIT_OPTS set by the caller is kept."""
    if hasattr(config, "workerinput") or "SPARK_SUBMIT_OPTS" in os.environ or not config.args \
            or config.option.help or config.option.collectonly:
        return
    if all(Path(arg.split("::")[0]).resolve().is_relative_to(UNIT_TESTS) for arg in config.args):
        return
    from tests.support.jvm_archive import driver_options

    options = driver_options()
    if options:
        os.environ["SPARK_SUBMIT_OPTS"] = options


UNIT_TESTS = Path(__file__).resolve().parent / "unit"


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {name: place for place, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the order within a file is kept


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The broker the integration tests deliver from: Apache Kafka's own (the `kafka_broker` fixture), as production
# runs; HERALD_TEST_BROKER=embedded runs them on noida-db, the small Kafka-protocol broker `make demo` starts.
TEST_BROKER = os.environ.get("HERALD_TEST_BROKER", "kafka")


@pytest.fixture(autouse=True)
def table_engine_of_the_file(request, monkeypatch) -> None:
    """The tables of a file that sets `TABLE_ENGINE` (a file whose subject is not the tables keeps delta-rs, which
    writes in milliseconds), unless HERALD_TEST_ENGINE names one for the whole run (`tests/support/herald_env.py`)."""
    engine = getattr(request.module, "TABLE_ENGINE", None)
    if engine and "HERALD_TEST_ENGINE" not in os.environ:
        from tests.support import herald_env

        monkeypatch.setattr(herald_env, "SUITE_ENGINE", engine)


@pytest.fixture(scope="session")
def broker(request):
    """The suite's Kafka broker, started once per test process: Apache Kafka (the `kafka_broker` fixture), or
    noida-db on a free loopback port with HERALD_TEST_BROKER=embedded. Both have `bootstrap_servers` and
    `create_topics(partitions_by_topic)`."""
    yield request.getfixturevalue("kafka_broker" if TEST_BROKER == "kafka" else "embedded_broker")


@pytest.fixture(scope="session")
def embedded_broker(tmp_path_factory) -> EmbeddedBroker:
    """noida-db, the Kafka-protocol broker `make demo` and `herald broker up` start, on a free loopback port."""
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
    from tests.support.jvm_archive import for_a_long_lived_driver

    os.environ.setdefault("HERALD_TEST", "1")
    with for_a_long_lived_driver():
        session = get_or_create_session("local[2]", {"spark.sql.shuffle.partitions": "2"}, app_name="herald-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """Herald's wheel, built as `make dist` builds it (`pip wheel --no-deps`), from this checkout: once for the
    run, by the first worker that asks (setuptools builds in the checkout's build/: two builds at once fail)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "herald-dist"  # the run's own
    shared.mkdir(exist_ok=True)
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted(shared.glob("herald-*.whl"))
        if not built:
            result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                                     str(shared), str(Path(__file__).resolve().parents[1])], capture_output=True,
                                    text=True, timeout=300)
            assert result.returncode == 0, result.stderr[-3000:]
            built = sorted(shared.glob("herald-*.whl"))
    (wheel_file,) = built
    out = tmp_path_factory.mktemp("dist")
    import shutil

    return Path(shutil.copy(wheel_file, out / wheel_file.name))


@pytest.fixture(scope="session")
def herald_zip(wheel) -> Path:
    """The wheel under the name `make dist` copies it to (`dist/herald-<version>.zip`): spark-submit puts a
    `--py-files` .zip on the executors' Python path, and a .whl on the driver's alone."""
    import shutil

    return Path(shutil.copy(wheel, wheel.with_name(wheel.name.replace("-py3-none-any.whl", ".zip"))))


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
