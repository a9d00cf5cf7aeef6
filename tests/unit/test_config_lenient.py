"""Lenient loading (a running job, the read-only commands): invalid files are left out with their problems,
the rest loads; herald.yaml stays fatal. And the conf directory's fingerprint for the watcher."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from herald.config import ConfigError, LoadResult, conf_fingerprint, load_config, load_config_lenient
from tests.support.config_files import SETTINGS, SUBSCRIPTION, TOPIC, write_conf

OTHER = SUBSCRIPTION.replace("name: billing", "name: audit")
BAD = SUBSCRIPTION.replace("http://127.0.0.1:8080/orders", "http://user:topsecret@127.0.0.1/x") + textwrap.dedent("""
    subscriptionPolicy:
      rate: 0
      requestTimeout: 50
    colour: blue
    """)
USERS_TOPIC = "name: shop.users\ncontentType: JSON\n"
USERS_SUBSCRIPTION = SUBSCRIPTION.replace("shop.orders", "shop.users").replace("name: billing", "name: crm")


def strings(result: LoadResult) -> list[str]:
    return [str(problem) for problem in result.problems]


def test_a_valid_directory_loads_the_same_as_strictly(tmp_path):
    conf = write_conf(tmp_path, subscriptions={"billing": SUBSCRIPTION, "audit": OTHER})
    result = load_config_lenient(conf)
    assert result.ok and result.problems == () and result.invalid_subscription_files == ()
    strict = load_config(conf)
    assert result.config.subscriptions == strict.subscriptions and result.config.files == strict.files
    assert result.config.topics == strict.topics and result.config.settings == strict.settings


def test_an_invalid_subscription_file_is_left_out_with_every_problem_and_no_secret(tmp_path):
    conf = write_conf(tmp_path, subscriptions={"billing": BAD, "audit": OTHER})
    result = load_config_lenient(conf)
    assert [s.id for s in result.config.subscriptions] == ["shop.orders.audit"]
    file = "conf/subscriptions/billing.yaml"
    assert set(strings(result)) == {f"{file}: subscriptionPolicy.rate: must be >= 1 (got 0)",
                                    f"{file}: subscriptionPolicy.requestTimeout: must be >= 100 (got 50)",
                                    f"{file}: colour: unknown key"}
    assert all((p.file, p.key) != (file, "") for p in result.problems)
    assert "topsecret" not in "\n".join(strings(result)) + repr(result)
    assert result.invalid_subscription_files == (conf / "subscriptions" / "billing.yaml",)
    assert result.invalid_file_of("shop.orders.billing") == conf / "subscriptions" / "billing.yaml"
    assert result.invalid_file_of("shop.orders.audit") is None and result.invalid_file_of("shop.orders.x") is None
    assert [str(p) for p in result.problems_in(conf / "subscriptions" / "billing.yaml")] == strings(result)
    assert result.problems_in(file) == list(result.problems)
    with pytest.raises(ConfigError):  # strict loading still refuses the directory, with the same problems
        load_config(conf)


def test_an_unreadable_subscription_file_is_found_by_its_name(tmp_path):
    conf = write_conf(tmp_path, subscriptions={"billing": "topicName: [unclosed\n", "audit": OTHER})
    result = load_config_lenient(conf)
    assert [s.id for s in result.config.subscriptions] == ["shop.orders.audit"]
    assert strings(result)[0].startswith("conf/subscriptions/billing.yaml: invalid YAML at line")
    assert result.invalid_file_of("shop.orders.billing") == conf / "subscriptions" / "billing.yaml"


def test_an_invalid_topic_file_leaves_out_its_subscriptions_naming_both_files(tmp_path):
    conf = write_conf(tmp_path, topics={"orders": TOPIC + "schemaFile: x.avsc\n", "users": USERS_TOPIC},
                      subscriptions={"billing": SUBSCRIPTION, "crm": USERS_SUBSCRIPTION})
    result = load_config_lenient(conf)
    assert list(result.config.topics) == ["shop.users"]
    assert [s.id for s in result.config.subscriptions] == ["shop.users.crm"]
    assert strings(result) == [
        "conf/topics/orders.yaml: schemaFile: only AVRO topics have a schema",
        "conf/subscriptions/billing.yaml: topicName: topic shop.orders is left out: its file "
        "conf/topics/orders.yaml is invalid",
    ]
    assert result.invalid_topic_files == (conf / "topics" / "orders.yaml",)
    assert result.invalid_subscription_files == (conf / "subscriptions" / "billing.yaml",)


def test_a_topic_file_that_cannot_be_read_is_named_as_the_possible_definition(tmp_path):
    conf = write_conf(tmp_path, topics={"orders": "name: [", "users": USERS_TOPIC},
                      subscriptions={"billing": SUBSCRIPTION, "crm": USERS_SUBSCRIPTION})
    result = load_config_lenient(conf)
    assert [s.id for s in result.config.subscriptions] == ["shop.users.crm"]
    assert strings(result)[1] == ("conf/subscriptions/billing.yaml: topicName: topic shop.orders is not defined in "
                                  "topics/ (defined: shop.users); conf/topics/orders.yaml, which may define it, "
                                  "is invalid")


def test_a_missing_topic_leaves_the_subscription_out(tmp_path):
    conf = write_conf(tmp_path, subscriptions={"billing": SUBSCRIPTION.replace("shop.orders", "shop.none"),
                                               "audit": OTHER})
    result = load_config_lenient(conf)
    assert [s.id for s in result.config.subscriptions] == ["shop.orders.audit"]
    assert strings(result) == ["conf/subscriptions/billing.yaml: topicName: topic shop.none is not defined in "
                               "topics/ (defined: shop.orders)"]


def test_duplicates_leave_out_the_later_file(tmp_path):
    conf = write_conf(tmp_path, topics={"a": TOPIC, "b": TOPIC + "description: again\n"},
                      subscriptions={"a": SUBSCRIPTION, "b": SUBSCRIPTION.replace("orders for", "again for")})
    result = load_config_lenient(conf)
    assert result.config.topics["shop.orders"].description == ""
    [subscription] = result.config.subscriptions
    assert subscription.description == "orders for billing"
    assert result.config.files[subscription.id] == conf / "subscriptions" / "a.yaml"
    assert strings(result) == [
        "conf/topics/b.yaml: name: topic shop.orders is defined twice",
        "conf/subscriptions/b.yaml: name: subscription shop.orders.billing is also defined in "
        "conf/subscriptions/a.yaml",
    ]
    assert result.invalid_subscription_files == (conf / "subscriptions" / "b.yaml",)
    assert result.invalid_topic_files == (conf / "topics" / "b.yaml",)
    assert result.invalid_file_of("shop.orders.billing") is None  # a valid file defines it


def test_two_topics_on_one_kafka_topic_leave_out_the_later_file(tmp_path):
    """One read serves every topic of a job, keyed by Kafka topic: a second topic reading the same Kafka topic
    (through `kafkaTopic:`) would never be delivered, so it is refused, naming both files."""
    mirror = TOPIC.replace("name: shop.orders", "name: shop.mirror") + "kafkaTopic: shop.orders\n"
    conf = write_conf(tmp_path, topics={"a": TOPIC, "b": mirror})
    result = load_config_lenient(conf)
    assert list(result.config.topics) == ["shop.orders"]
    assert strings(result) == ["conf/topics/b.yaml: kafkaTopic: topic shop.mirror reads Kafka topic shop.orders, "
                               "which topic shop.orders (conf/topics/a.yaml) reads already: one topic per Kafka topic"]
    with pytest.raises(ConfigError, match="one topic per Kafka topic"):
        load_config(conf)


def test_unsupported_features_are_left_out_too(tmp_path):
    conf = write_conf(tmp_path, subscriptions={"billing": SUBSCRIPTION + "deliveryType: BATCH\nmode: BROADCAST\n",
                                               "audit": OTHER})
    result = load_config_lenient(conf)
    assert [s.id for s in result.config.subscriptions] == ["shop.orders.audit"]
    assert strings(result) == ["conf/subscriptions/billing.yaml: mode: BATCH delivery cannot be BROADCAST (as in "
                               "Hermes): use ANYCAST"]


@pytest.mark.parametrize("settings, expected", [
    (SETTINGS + "colour: red\n", "conf/herald.yaml: colour: unknown key"),
    (SETTINGS.replace("127.0.0.1:9092", "${env:HERALD_SURELY_UNSET}"),
     "conf/herald.yaml: kafka.bootstrapServers: environment variable HERALD_SURELY_UNSET is not set"),
    (SETTINGS + "kafka: [", None),
])
def test_problems_in_herald_yaml_stay_fatal(tmp_path, settings, expected):
    conf = write_conf(tmp_path, settings=settings, subscriptions={"billing": BAD})
    with pytest.raises(ConfigError) as caught:
        load_config_lenient(conf)
    problems = [str(problem) for problem in caught.value.problems]
    assert all(p.startswith("conf/herald.yaml: ") for p in problems), problems
    if expected:
        assert problems == [expected]


def test_missing_herald_yaml_and_directory_are_fatal(tmp_path):
    conf = write_conf(tmp_path)
    (conf / "herald.yaml").unlink()
    with pytest.raises(ConfigError, match="conf/herald.yaml: file not found"):
        load_config_lenient(conf)
    with pytest.raises(ConfigError, match="configuration directory not found"):
        load_config_lenient(tmp_path / "nowhere")


def test_secrets_in_herald_yaml_are_never_echoed(tmp_path):
    settings = SETTINGS + "schemaRegistry:\n  url: ftp://user:hunter2@registry\n"
    with pytest.raises(ConfigError) as caught:
        load_config_lenient(write_conf(tmp_path, settings=settings))
    assert "hunter2" not in str(caught.value) and "*****" in str(caught.value)


def test_a_running_job_keeps_the_last_valid_version_of_an_invalid_file(tmp_path):
    conf = write_conf(tmp_path, subscriptions={"billing": SUBSCRIPTION, "audit": OTHER})
    before = load_config(conf)
    last_valid = before.subscription("shop.orders.billing")
    (conf / "subscriptions" / "billing.yaml").write_text(textwrap.dedent(BAD))
    result = load_config_lenient(conf)
    path = result.invalid_subscription_files[0]
    for kept in ({path: last_valid}, {str(path): last_valid}, [last_valid]):
        config = result.config.with_subscriptions(kept)
        assert sorted(s.id for s in config.subscriptions) == ["shop.orders.audit", "shop.orders.billing"]
        assert config.files["shop.orders.billing"] == path
        assert config.subscription("shop.orders.billing") == last_valid
    # a kept version never replaces a valid file's definition, nor outlives its topic
    assert result.config.with_subscriptions({path: before.subscription("shop.orders.audit")}).subscriptions == \
        result.config.subscriptions
    gone = last_valid.model_copy(update={"topicName": "shop.gone"})
    assert result.config.with_subscriptions({path: gone}).subscriptions == result.config.subscriptions


def test_kept_topics_keep_their_subscriptions(tmp_path):
    conf = write_conf(tmp_path, topics={"orders": TOPIC, "users": USERS_TOPIC},
                      subscriptions={"billing": SUBSCRIPTION, "crm": USERS_SUBSCRIPTION})
    before = load_config(conf)
    (conf / "topics" / "users.yaml").write_text("name: shop.users\ncolour: red\n")
    result = load_config_lenient(conf)
    assert "shop.users" not in result.config.topics
    assert result.invalid_subscription_files == (conf / "subscriptions" / "crm.yaml",)
    kept = {conf / "subscriptions" / "crm.yaml": before.subscription("shop.users.crm")}
    assert len(result.config.with_subscriptions(kept).subscriptions) == 1  # its topic is gone
    config = result.config.with_subscriptions(kept, topics=[before.topics["shop.users"]])
    assert config.topic_of(config.subscription("shop.users.crm")) == before.topics["shop.users"]


def test_bare_kept_subscriptions_that_cannot_be_matched_to_a_file_are_refused(tmp_path):
    conf = write_conf(tmp_path, subscriptions={"x": BAD, "y": "[", "audit": OTHER})
    result = load_config_lenient(conf)
    stranger = load_config(write_conf(tmp_path / "other", subscriptions={"z": OTHER.replace("audit", "zed"),
                                                                         "w": OTHER.replace("audit", "wat")}))
    with pytest.raises(ValueError, match="cannot tell which file"):
        result.config.with_subscriptions(list(stranger.subscriptions))


# -- conf_fingerprint -----------------------------------------------------------------------------------------
AVRO_TOPIC = "name: shop.users\ncontentType: AVRO\nschemaFile: schemas/users.avsc\n"


def touch_later(path: Path) -> None:
    status = path.stat()
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))


def test_fingerprint_is_stable_while_nothing_changes(tmp_path):
    conf = write_conf(tmp_path)
    first = conf_fingerprint(conf)
    load_config(conf)
    (conf / "notes.txt").write_text("not configuration")
    (conf / "subscriptions" / "README.md").write_text("not a subscription")
    (tmp_path / "state").mkdir()
    assert conf_fingerprint(conf) == first == conf_fingerprint(str(conf))


@pytest.mark.parametrize("change", ["edit", "same-size edit", "touch", "add", "remove", "add topic", "settings"])
def test_fingerprint_changes_on_every_edit_addition_and_removal(tmp_path, change):
    conf = write_conf(tmp_path)
    before = conf_fingerprint(conf)
    billing = conf / "subscriptions" / "billing.yaml"
    if change == "edit":
        billing.write_text(billing.read_text() + "state: SUSPENDED\n")
    elif change == "same-size edit":
        billing.write_text(billing.read_text().replace("billing", "billinG"))
        touch_later(billing)
    elif change == "touch":
        touch_later(billing)
    elif change == "add":
        (conf / "subscriptions" / "audit.yml").write_text(textwrap.dedent(OTHER))
    elif change == "remove":
        billing.unlink()
    elif change == "add topic":
        (conf / "topics" / "users.yaml").write_text(USERS_TOPIC)
    else:
        touch_later(conf / "herald.yaml")
    assert conf_fingerprint(conf) != before


def test_fingerprint_follows_the_schema_files_topics_name(tmp_path):
    conf = write_conf(tmp_path, topics={"users": AVRO_TOPIC}, subscriptions={})
    before = conf_fingerprint(conf)
    (conf / "schemas").mkdir()
    schema = conf / "schemas" / "users.avsc"
    schema.write_text('{"type": "record", "name": "U", "fields": []}')
    created = conf_fingerprint(conf)
    assert created != before, "a schema file that appears"
    (conf / "schemas" / "unrelated.avsc").write_text("{}")
    assert conf_fingerprint(conf) == created, "a schema file no topic names"
    touch_later(schema)
    assert conf_fingerprint(conf) != created, "an edited schema file"
