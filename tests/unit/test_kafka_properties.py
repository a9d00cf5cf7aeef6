"""kafka.properties in either dialect reach each client in its own: Java's names for Spark's Kafka source,
librdkafka's for confluent-kafka (herald.kafka_properties); what has no equivalent is refused without the values."""

from __future__ import annotations

import pytest
import yaml
from confluent_kafka import Consumer

from herald.config import ConfigError, load_config
from herald.config.settings import KafkaSettings
from herald.kafka_properties import PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE, for_java, for_librdkafka
from herald.source.options import SourceOptions
from tests.support.config_files import write_conf

SECRET = 'pa"ss\\word'  # a quote and a backslash: JAAS quoting must carry them
JAVA = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.jaas.config": f'{SCRAM_LOGIN_MODULE} required username="herald" password="pa\\"ss\\\\word";',
    "ssl.truststore.type": "PEM",
    "ssl.truststore.location": "/etc/kafka/ca.pem",
}
LIBRDKAFKA = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "SCRAM-SHA-512",
    "sasl.username": "herald",
    "sasl.password": SECRET,
    "ssl.ca.location": "/etc/kafka/ca.pem",
}


def test_java_names_become_librdkafka_names():
    assert for_librdkafka(JAVA) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                    "sasl.username": "herald", "sasl.password": SECRET,
                                    "ssl.ca.location": "/etc/kafka/ca.pem"}


def test_librdkafka_names_become_java_names():
    assert for_java(LIBRDKAFKA) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                    "sasl.jaas.config": JAVA["sasl.jaas.config"], "ssl.truststore.type": "PEM",
                                    "ssl.truststore.location": "/etc/kafka/ca.pem"}


def test_each_dialect_passes_its_own_names_and_the_written_ones_win():
    assert for_java(JAVA) == JAVA
    assert for_librdkafka(LIBRDKAFKA) == LIBRDKAFKA
    both = {**JAVA, "sasl.username": "other", "sasl.password": "other-secret"}
    assert for_librdkafka(both)["sasl.username"] == "other"
    assert for_java(both)["sasl.jaas.config"] == JAVA["sasl.jaas.config"]


def test_plain_and_an_unquoted_jaas_value():
    jaas = f"{PLAIN_LOGIN_MODULE} required username=herald password=secret"
    assert for_librdkafka({"sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas}) == {
        "sasl.mechanism": "PLAIN", "sasl.username": "herald", "sasl.password": "secret"}
    assert for_java({"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"})["sasl.jaas.config"] \
        == f'{PLAIN_LOGIN_MODULE} required username="u" password="p";'


def test_key_stores_and_host_name_checks():
    assert for_librdkafka({"ssl.keystore.type": "PEM", "ssl.keystore.location": "/k.pem", "ssl.key.password": "x",
                           "ssl.endpoint.identification.algorithm": ""}) == {
        "ssl.certificate.location": "/k.pem", "ssl.key.location": "/k.pem", "ssl.key.password": "x",
        "ssl.endpoint.identification.algorithm": "none"}
    assert for_librdkafka({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/k.p12",
                           "ssl.keystore.password": "x"}) == {"ssl.keystore.location": "/k.p12",
                                                              "ssl.keystore.password": "x"}
    assert for_java({"ssl.certificate.pem": "CERT", "ssl.key.pem": "KEY", "ssl.ca.pem": "CA",
                     "ssl.endpoint.identification.algorithm": "none"}) == {
        "ssl.keystore.type": "PEM", "ssl.keystore.key": "KEY", "ssl.keystore.certificate.chain": "CERT",
        "ssl.truststore.type": "PEM", "ssl.truststore.certificates": "CA", "ssl.endpoint.identification.algorithm": ""}


@pytest.mark.parametrize("properties, names", [
    ({"ssl.truststore.location": "/ts.jks", "ssl.truststore.password": "secret"}, "JKS trust store"),
    ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "/ks.jks"}, "JKS key store"),
    ({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config":
      "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required secret=\"secret\";"},
     "OAuthBearerLoginModule"),
    ({"sasl.jaas.config": "password=secret"}, "sasl.jaas.config is not"),
    ({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "secret"}, "GSSAPI"),
    ({"ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem", "ssl.key.password": "secret"},
     "ssl.certificate.location"),
])
def test_what_has_no_equivalent_is_refused_by_name_without_values(tmp_path, properties, names):
    """herald.yaml is refused (`herald validate`, `herald run`) with the names, never the values."""
    settings = yaml.safe_dump({"kafka": {"bootstrapServers": "127.0.0.1:9092", "properties": properties},
                               "storage": {"path": "../state"}})
    with pytest.raises(ConfigError) as refused:
        load_config(write_conf(tmp_path, settings))
    shown = "\n".join(str(problem) for problem in refused.value.problems)
    assert "herald.yaml: kafka.properties: " in shown and names in shown
    assert "secret" not in shown.replace(names, "")


def test_confluent_kafka_accepts_the_translated_java_names():
    """Every name for_librdkafka gives is one librdkafka knows (it refuses unknown ones when a client is made)."""
    config = KafkaSettings(bootstrapServers="127.0.0.1:9", properties=JAVA).client_config()
    Consumer({**config, "group.id": "g", "ssl.ca.location": "probe"}).close()


def test_the_python_source_takes_sparks_options():
    options = SourceOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "t",
                                   **{f"kafka.{key}": value for key, value in JAVA.items()}})
    assert options.client_config == {"bootstrap.servers": "b:9092", **for_librdkafka(JAVA)}
