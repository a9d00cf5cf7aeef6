"""Loading and validating a conf directory: defaults, units, and every problem named by file and key."""

from __future__ import annotations

import textwrap

import pytest

from herald.config import load_config
from tests.support.config_files import SETTINGS, SUBSCRIPTION, TOPIC, problems_of, write_conf


def test_minimal_conf_gets_hermes_defaults(tmp_path):
    config = load_config(write_conf(tmp_path))
    subscription = config.subscription("shop.orders.billing")
    policy = subscription.subscriptionPolicy
    assert (policy.rate, policy.messageTtl, policy.messageBackoff, policy.backoffMultiplier) == (400, 3600, 100, 1)
    assert (policy.backoffMaxIntervalInSec, policy.requestTimeout, policy.socketTimeout) == (600, 1000, 0)
    assert (policy.inflightSize, policy.sendingDelay, policy.retryClientErrors) == (100, 0, False)
    assert subscription.state == "ACTIVE" and subscription.startingOffsets == "latest"
    assert config.settings.kafka.connector == "auto" and config.settings.storage.engine == "auto"
    assert config.storage_path == str((tmp_path / "state").resolve())


def test_units_are_converted_to_seconds_once():
    from herald.config.model import Subscription
    from herald.config.policies import SerialPolicy

    subscription = Subscription(topicName="a.b", name="c", endpoint="http://h/", subscriptionPolicy=SerialPolicy(
        messageTtl=60, messageBackoff=250, backoffMaxIntervalInSec=30, backoffMultiplier=2, maxAttempts=5))
    policy = subscription.retry_policy()
    assert (policy.message_ttl_s, policy.backoff_s, policy.max_backoff_s) == (60.0, 0.25, 30.0)
    assert (policy.backoff_multiplier, policy.max_attempts) == (2, 5)


def test_every_problem_is_reported_with_file_and_key(tmp_path):
    bad = SUBSCRIPTION + textwrap.dedent("""
        colour: blue
        subscriptionPolicy:
          rate: 0
          messageTtl: 7201
          backoffMultiplier: 11
          backoffMaxIntervalInSec: 601
          requestTimeout: 50
          sendingDelay: 6000
          inflightSize: 0
        headers:
          - {name: X-Ok, value: "a\\r\\nInjected: 1"}
        """)
    problems = problems_of(write_conf(tmp_path, subscriptions={"billing": bad}))
    file = "conf/subscriptions/billing.yaml"
    expected = {
        f"{file}: colour: unknown key",
        f"{file}: subscriptionPolicy.rate: must be >= 1 (got 0)",
        f"{file}: subscriptionPolicy.messageTtl: must be <= 7200 (got 7201)",
        f"{file}: subscriptionPolicy.backoffMultiplier: must be <= 10 (got 11)",
        f"{file}: subscriptionPolicy.backoffMaxIntervalInSec: must be <= 600 (got 601)",
        f"{file}: subscriptionPolicy.requestTimeout: must be >= 100 (got 50)",
        f"{file}: subscriptionPolicy.sendingDelay: must be <= 5000 (got 6000)",
        f"{file}: subscriptionPolicy.inflightSize: must be >= 1 (got 0)",
        f"{file}: headers[0].value: must not contain CR or LF",
    }
    assert expected <= set(problems), problems


def test_topic_must_be_defined_and_names_must_be_valid(tmp_path):
    other = SUBSCRIPTION.replace("shop.orders", "shop.missing").replace("billing", "bad name!")
    problems = problems_of(write_conf(tmp_path, subscriptions={"other": other}))
    assert any("subscriptions/other.yaml: name: must contain only letters" in p for p in problems), problems


def test_a_kafka_topic_name_kafka_would_refuse_is_named_by_file_and_key(tmp_path):
    problems = problems_of(write_conf(tmp_path, topics={"orders": TOPIC + "kafkaTopic: orders v2\n"}))
    assert any("topics/orders.yaml: kafkaTopic: must be a Kafka topic name" in p for p in problems), problems
    long_name = "shop." + "o" * 245
    problems = problems_of(write_conf(tmp_path / "long", topics={"orders": TOPIC.replace("shop.orders", long_name)},
                                      subscriptions={}))
    assert any("topics/orders.yaml: name: must be at most 249 characters" in p for p in problems), problems
    assert load_config(write_conf(tmp_path / "ok", topics={"orders": TOPIC + "kafkaTopic: legacy_Orders-v2.eu\n"}))
    problems = problems_of(write_conf(tmp_path / "nl", topics={"orders": TOPIC + 'kafkaTopic: "orders\\n"\n'}))
    assert any("kafkaTopic: must be a Kafka topic name" in p for p in problems), problems
    long_but_not_kafkas = TOPIC.replace("shop.orders", long_name) + "kafkaTopic: orders\n"  # then only kafkaTopic is
    assert load_config(write_conf(tmp_path / "mapped", topics={"orders": long_but_not_kafkas}, subscriptions={}))


def test_undefined_topic(tmp_path):
    problems = problems_of(write_conf(tmp_path, subscriptions={"x": SUBSCRIPTION.replace("shop.orders", "shop.none")}))
    assert problems == ["conf/subscriptions/x.yaml: topicName: topic shop.none is not defined in topics/ "
                        "(defined: shop.orders)"]


def test_bad_url_is_reported_without_its_password(tmp_path):
    bad = SUBSCRIPTION.replace("http://127.0.0.1:8080/orders", "ftp://user:topsecret@host/x")
    problems = problems_of(write_conf(tmp_path, subscriptions={"billing": bad}))
    assert len(problems) == 1 and "endpoint: not an http(s) URL" in problems[0]
    assert "topsecret" not in problems[0] and "*****" in problems[0]


def test_bad_filters(tmp_path):
    bad = SUBSCRIPTION + textwrap.dedent("""
        filters:
          - {type: jsonpath, path: "$.a", matcher: "(unclosed"}
          - {type: jsonpath, path: "$.[", matcher: "x"}
          - {type: jsonpath, matcher: "x"}
          - {type: header, matcher: "x"}
          - {type: jsonpath, path: "$.a", matcher: "x", matchingStrategy: some}
        """)
    problems = problems_of(write_conf(tmp_path, subscriptions={"billing": bad}))
    joined = "\n".join(problems)
    assert "filters[0]" in joined and "filters[1]" in joined
    assert "filters[2].path: required for a jsonpath filter" in joined
    assert "filters[3].header: required for a header filter" in joined
    assert "filters[4].matchingStrategy: must be 'all' or 'any'" in joined


def test_environment_substitution(tmp_path, monkeypatch):
    monkeypatch.setenv("HERALD_TEST_KAFKA", "kafka:9093")
    settings = (SETTINGS.replace("127.0.0.1:9092", "${env:HERALD_TEST_KAFKA}")
                .replace("../state", "${env:HERALD_NOPE:-/tmp/x}"))
    config = load_config(write_conf(tmp_path, settings=settings))
    assert config.settings.kafka.bootstrapServers == "kafka:9093" and config.storage_path == "/tmp/x"


def test_missing_environment_variable(tmp_path):
    settings = SETTINGS.replace("127.0.0.1:9092", "${env:HERALD_SURELY_UNSET}")
    assert problems_of(write_conf(tmp_path, settings=settings)) == [
        "conf/herald.yaml: kafka.bootstrapServers: environment variable HERALD_SURELY_UNSET is not set"]


def test_invalid_yaml_and_missing_settings(tmp_path):
    conf = write_conf(tmp_path, subscriptions={"broken": "topicName: [unclosed\n"})
    (conf / "herald.yaml").unlink()
    problems = problems_of(conf)
    assert "conf/herald.yaml: file not found" in problems
    assert any(p.startswith("conf/subscriptions/broken.yaml: invalid YAML at line") for p in problems)


def test_duplicate_subscription(tmp_path):
    problems = problems_of(write_conf(tmp_path, subscriptions={"a": SUBSCRIPTION, "b": SUBSCRIPTION}))
    assert problems == ["conf/subscriptions/b.yaml: name: subscription shop.orders.billing is also defined in "
                        "conf/subscriptions/a.yaml"]


def test_a_batch_subscription_gets_hermes_batch_defaults_in_seconds_and_bytes(tmp_path):
    config = load_config(write_conf(tmp_path, subscriptions={"billing": SUBSCRIPTION + "deliveryType: BATCH\n"}))
    subscription = config.subscription("shop.orders.billing")
    policy = subscription.subscriptionPolicy
    assert (policy.batchSize, policy.batchTime, policy.batchVolume, policy.messageTtl, policy.messageBackoff,
            policy.retryClientErrors, policy.requestTimeout) == (100, 30_000, 64_000, 3600, 500, False, 30_000)
    spec = subscription.delivery_spec
    assert (spec.batch.size, spec.batch.time_s, spec.batch.volume_bytes) == (100, 30.0, 64_000)
    assert (spec.retry.backoff_s, spec.request_timeout_s, spec.ordered) == (0.5, 30.0, True)
    tuned = SUBSCRIPTION + ("deliveryType: BATCH\nsubscriptionPolicy: {batchSize: 10, batchTime: 1500, "
                            "batchVolume: 2048, backoffMultiplier: 2, backoffJitter: 0.2, maxAttempts: 5}\n")
    spec = load_config(write_conf(tmp_path / "b", subscriptions={"billing": tuned})).subscriptions[0].delivery_spec
    assert (spec.batch.size, spec.batch.time_s, spec.batch.volume_bytes) == (10, 1.5, 2048)
    assert (spec.retry.backoff_multiplier, spec.retry.backoff_jitter, spec.retry.max_attempts) == (2.0, 0.2, 5)


def test_batch_refuses_avro_broadcast_and_serial_options_each_named_with_file_and_key(tmp_path):
    batch = SUBSCRIPTION + ("deliveryType: BATCH\nmode: BROADCAST\ncontentType: AVRO\n"
                            "subscriptionPolicy: {inflightSize: 5, rate: 10, batchSize: 0}\n")
    problems = problems_of(write_conf(tmp_path, subscriptions={"billing": batch}))
    file = "conf/subscriptions/billing.yaml"
    assert f"{file}: subscriptionPolicy.inflightSize: a SERIAL option; deliveryType BATCH does not take it (got 5)" \
        in problems
    assert f"{file}: subscriptionPolicy.rate: a SERIAL option; deliveryType BATCH does not take it (got 10)" in problems
    assert f"{file}: subscriptionPolicy.batchSize: must be >= 1 (got 0)" in problems
    serial = SUBSCRIPTION + "subscriptionPolicy: {batchTime: 100}\n"
    assert problems_of(write_conf(tmp_path / "s", subscriptions={"billing": serial})) == [
        f"{file}: subscriptionPolicy.batchTime: a BATCH option; deliveryType SERIAL does not take it (got 100)"]
    batch = SUBSCRIPTION + "deliveryType: BATCH\nmode: BROADCAST\ncontentType: AVRO\n"
    problems = problems_of(write_conf(tmp_path / "m", subscriptions={"billing": batch}))
    assert f"{file}: mode: BATCH delivery cannot be BROADCAST (as in Hermes): use ANYCAST" in problems
    assert f"{file}: contentType: BATCH delivery sends a JSON array: it takes contentType JSON, not AVRO (as in " \
           "Hermes)" in problems


def test_suspended_subscriptions_are_not_active(tmp_path):
    config = load_config(write_conf(tmp_path, subscriptions={"billing": SUBSCRIPTION + "state: SUSPENDED\n"}))
    assert config.active_subscriptions() == []
    with pytest.raises(KeyError, match="known: shop.orders.billing"):
        config.subscription("shop.orders.nope")


def test_repr_never_shows_the_password(tmp_path):
    secret = SUBSCRIPTION.replace("http://127.0.0.1", "http://u:hunter2@127.0.0.1")
    subscription = load_config(write_conf(tmp_path, subscriptions={"billing": secret})).subscriptions[0]
    assert "hunter2" not in repr(subscription) and "hunter2" not in str(subscription)


AVRO_TOPIC = """
name: shop.users
contentType: AVRO
schemaFile: schemas/users.avsc
"""


def test_avro_content_type_needs_an_avro_topic_and_filters_match_the_topic(tmp_path):
    bad = SUBSCRIPTION + textwrap.dedent("""
        contentType: AVRO
        filters:
          - {type: avropath, path: ".user.name", matcher: "x"}
        """)
    problems = problems_of(write_conf(tmp_path, subscriptions={"billing": bad}))
    file = "conf/subscriptions/billing.yaml"
    assert f"{file}: contentType: AVRO delivery needs an AVRO topic; shop.orders is JSON" in problems
    assert any(p.startswith(f"{file}: filters[0].type: shop.orders is a JSON topic: filter it with jsonpath")
               for p in problems), problems


def test_avro_topics_need_a_readable_schema(tmp_path):
    conf = write_conf(tmp_path, topics={"orders": TOPIC, "users": AVRO_TOPIC,
                                        "events": "name: shop.events\ncontentType: AVRO\n"})
    (conf / "schemas").mkdir()
    (conf / "schemas" / "users.avsc").write_text('{"type": "record", "name": "U", "fields": [{"name": "a"}]}')
    problems = problems_of(conf)
    assert any(p.startswith("conf/topics/users.yaml: schemaFile: schemas/users.avsc is not a valid Avro schema")
               for p in problems), problems
    assert "conf/topics/events.yaml: schemaFile: an AVRO topic needs a schemaFile, or schemaRegistry.url in " \
           "herald.yaml" in problems


def test_avro_topic_with_schema_file_loads(tmp_path):
    avro_subscription = SUBSCRIPTION.replace("shop.orders", "shop.users") + textwrap.dedent("""
        contentType: AVRO
        filters:
          - {type: avropath, path: ".addresses[*].city", matcher: "Krakow", matchingStrategy: any}
        """)
    conf = write_conf(tmp_path, topics={"users": AVRO_TOPIC}, subscriptions={"billing": avro_subscription})
    (conf / "schemas").mkdir()
    (conf / "schemas" / "users.avsc").write_text('{"type": "record", "name": "U", "fields": [{"name": "a", '
                                                 '"type": "string"}]}')
    config = load_config(conf)
    source = config.avro_source(config.topics["shop.users"])
    assert source.schema_json.startswith('{"type": "record"') and source.registry_url is None


@pytest.mark.parametrize(("written", "storage_path"), [
    ("s3a://bucket/herald/", "s3a://bucket/herald"),
    ("abfss://c@account.dfs.core.windows.net/herald", "abfss://c@account.dfs.core.windows.net/herald"),
    ("dbfs:/herald", "dbfs:/herald"),
    ("file:///data/herald", "file:///data/herald"),
    ("file:/data/herald", "file:/data/herald"),  # Hadoop's form: not a path under the conf directory
    ("/data/herald", "/data/herald"),
])
def test_a_storage_uri_is_taken_as_written_and_a_path_as_a_path(tmp_path, written, storage_path):
    config = load_config(write_conf(tmp_path, SETTINGS.replace("path: ../state", f"path: {written}")))
    assert config.storage_path == storage_path
