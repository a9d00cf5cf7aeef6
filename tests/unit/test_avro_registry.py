"""A schema registry that cannot answer (down, 5xx, 429, refusing the credentials) is not a record that cannot be
decoded: decoding raises `RegistryUnavailableError` (or another `SchemaRegistryError`), which fails the round, so
the position stays and the round is tried again; only an id the registry does not know, or bytes that do not
decode, are a `DecodeError` (discarded). A real registry server on 127.0.0.1, no Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest

from herald.avro import registry as registry_module
from herald.avro.decode import AvroSource, DecodeError, decode_batches
from herald.avro.jvm import SUBJECT_RETRY_S, SUBJECT_TTL_S, RegistryPlans
from herald.avro.registry import RegistryUnavailableError, SchemaRegistryError, clear_cache
from herald.engine.triggers.catchup import failure_backoff_s
from herald.engine.triggers.supervision import outage, short_error
from tests.conftest import free_port
from tests.support.clock import FakeClock
from tests.support.registry import SchemaRegistryServer, wire_bytes
from tests.unit.test_avro_decode import RECORD, USER_V1

SUBJECT = "shop.users-value"
ATTEMPTS = registry_module.ATTEMPTS  # the client's tries of one request before it gives up


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(registry_module, "FIRST_WAIT_S", 0.01)  # the tries' waits: jittered, not asserted on
    clear_cache()
    yield
    clear_cache()


@pytest.mark.parametrize("status", [503, 500, 429])
def test_a_registry_answering_an_outage_fails_the_decode_instead_of_discarding_the_record(status):
    with SchemaRegistryServer() as registry:
        schema_id = registry.register(SUBJECT, USER_V1)
        decoder = AvroSource(registry_url=registry.url, subject=SUBJECT).decoder()
        registry.fail_next(ATTEMPTS, status, path=r"/schemas/ids/\d+")
        with pytest.raises(RegistryUnavailableError) as raised:
            decoder.decode(wire_bytes(schema_id, USER_V1, RECORD))
        assert not isinstance(raised.value, DecodeError)
        assert registry.url in str(raised.value) and f"schema id {schema_id}" in str(raised.value)
        assert str(status) in str(raised.value)
        assert sum(registry.failed.values()) == ATTEMPTS, "retried before giving up"
        # the registry is back: the same record decodes (the failure was not remembered)
        assert decoder.decode(wire_bytes(schema_id, USER_V1, RECORD)).schema_id == schema_id


def test_an_unreachable_registry_fails_the_decode_and_names_it_without_its_password():
    url = f"http://herald:s3cret@127.0.0.1:{free_port()}"
    decoder = AvroSource(registry_url=url, subject=SUBJECT).decoder()
    with pytest.raises(RegistryUnavailableError) as raised:
        decoder.decode(wire_bytes(7, USER_V1, RECORD))
    message = str(raised.value)
    assert "unreachable" in message and "schema id 7" in message and "127.0.0.1" in message
    assert "s3cret" not in message


def test_a_schema_fetched_once_decodes_through_a_later_outage_without_asking_the_registry():
    with SchemaRegistryServer() as registry:
        schema_id = registry.register(SUBJECT, USER_V1)
        AvroSource(registry_url=registry.url, subject=SUBJECT).decoder().decode(wire_bytes(schema_id, USER_V1, RECORD))
        calls = sum(registry.calls.values())
        registry.fail_next(100)
        decoded = AvroSource(registry_url=registry.url, subject=SUBJECT).decoder().decode(
            wire_bytes(schema_id, USER_V1, RECORD))
        assert (decoded.schema_id, decoded.schema_version) == (schema_id, 1)
        assert sum(registry.calls.values()) == calls, "cached per process: no request during the outage"


def test_refused_credentials_fail_the_decode_but_an_unknown_id_is_a_decode_error():
    with SchemaRegistryServer() as registry:
        decoder = AvroSource(registry_url=registry.url, subject=SUBJECT).decoder()
        registry.fail_next(1, 401)
        with pytest.raises(SchemaRegistryError, match="401") as raised:
            decoder.decode(wire_bytes(1, USER_V1, RECORD))
        assert not isinstance(raised.value, DecodeError)
        with pytest.raises(DecodeError, match="schema id 1: .*not found"):  # 40403: the schema does not exist
            decoder.decode(wire_bytes(1, USER_V1, RECORD))


def test_a_404_that_is_not_a_registry_answer_is_not_taken_for_an_unknown_schema():
    with SchemaRegistryServer() as registry:
        registry.register(SUBJECT, USER_V1)
        decoder = AvroSource(registry_url=registry.url + "/not-the-registry", subject=SUBJECT).decoder()
        with pytest.raises(SchemaRegistryError, match="404") as raised:  # the server's 404 for an unknown path...
            decoder.decode(wire_bytes(1, USER_V1, RECORD))
        assert not isinstance(raised.value, DecodeError)


def test_decode_batches_raises_for_an_outage_rather_than_giving_rows_a_decode_error():
    with SchemaRegistryServer() as registry:
        schema_id = registry.register(SUBJECT, USER_V1)
        registry.fail_next(ATTEMPTS)
        batch = pa.RecordBatch.from_pydict({"value": [wire_bytes(schema_id, USER_V1, RECORD)], "offset": [0]})
        with pytest.raises(RegistryUnavailableError):
            list(decode_batches(AvroSource(registry_url=registry.url, subject=SUBJECT))([batch]))
        [out] = list(decode_batches(AvroSource(registry_url=registry.url, subject=SUBJECT))([batch]))
        assert out.column("decode_error").to_pylist() == [None]


def test_the_driver_lists_a_subject_again_soon_after_an_outage_not_at_every_round():
    clock = FakeClock()
    with SchemaRegistryServer() as registry:
        schema_id = registry.register(SUBJECT, USER_V1)
        plans = RegistryPlans(AvroSource(registry_url=registry.url, subject=SUBJECT), clock=clock)
        registry.fail_next(ATTEMPTS, path=f"/subjects/{SUBJECT}/versions")
        assert plans.current() == {}, "the listing failed: its records go to fastavro, which asks again"
        calls = sum(registry.calls.values())
        clock.sleep(SUBJECT_RETRY_S - 1)
        assert plans.current() == {} and sum(registry.calls.values()) == calls
        clock.sleep(1)
        assert plans.current()[schema_id].plan is not None, "listed again after SUBJECT_RETRY_S, not SUBJECT_TTL_S"


def test_the_driver_does_not_keep_an_id_it_could_not_learn():
    clock = FakeClock()
    with SchemaRegistryServer() as registry:
        schema_id = registry.register(SUBJECT, USER_V1)
        plans = RegistryPlans(AvroSource(registry_url=registry.url, subject=SUBJECT), clock=clock)
        registry.fail_next(ATTEMPTS, path=rf"/schemas/ids/{schema_id}")
        assert schema_id not in plans.current()
        clock.sleep(SUBJECT_RETRY_S)
        known = plans.current()[schema_id]
        assert (known.plan is not None, known.version) == (True, 1)
        calls = sum(registry.calls.values())
        clock.sleep(SUBJECT_TTL_S - 1)
        plans.current()
        assert sum(registry.calls.values()) == calls, "all learnt: listed again after SUBJECT_TTL_S only"


def test_a_round_failed_for_a_registry_outage_is_told_apart_and_catch_up_backs_off():
    """What the driver sees of a task's error is its text (`short_error`): the outage is recognised there, and
    logged as one line; catch-up rounds that keep failing wait longer each time."""
    text = ("An exception was thrown from the Python worker:\nTraceback (most recent call last):\n  File ...\n"
            "herald.avro.registry.RegistryUnavailableError: schema id 3: schema registry http://h:8081: "
            "GET /schemas/ids/3 answered 503\n\tat org.apache.spark.api.python.BasePythonRunner...")
    reason = short_error(RuntimeError(text))
    assert reason.startswith("herald.avro.registry.RegistryUnavailableError: schema id 3") and outage(reason)
    assert not outage(short_error(RuntimeError("ValueError: something else")))
    assert [failure_backoff_s(n) for n in (1, 2, 3, 4, 6, 7, 20)] == [2, 4, 8, 16, 60, 60, 60]
