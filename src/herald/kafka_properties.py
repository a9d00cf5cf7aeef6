"""herald.yaml's `kafka.properties` for each of Herald's Kafka clients, which speak two dialects.

Spark's Kafka source is Java's client (`kafka.`-prefixed options); everything else is librdkafka (confluent-kafka):
Herald's Python source, the driver's offset and watermark lookups, the advisories and dead-letter producers,
`herald publish`. Most names are the same in both (`security.protocol`, `sasl.mechanism`, `ssl.key.password`);
the security ones differ. Users may write either dialect, or both: each client gets its own names, translated
from the other dialect's where there is an equivalent, and a name written in the client's own dialect wins.

    Java                                         librdkafka
    sasl.jaas.config (PlainLoginModule or        sasl.username, sasl.password
      ScramLoginModule, username/password)
    ssl.truststore.type=PEM + .location          ssl.ca.location
    ssl.truststore.type=PEM + .certificates      ssl.ca.pem
    ssl.keystore.type=PEM + .key +               ssl.key.pem + ssl.certificate.pem
      .certificate.chain
    ssl.keystore.type=PEM + .location            ssl.key.location + ssl.certificate.location (the same file)
    ssl.keystore.type=PKCS12 + .location         ssl.keystore.location (a PKCS#12 file in librdkafka)
    ssl.endpoint.identification.algorithm=""     ssl.endpoint.identification.algorithm=none

What has no equivalent (a JKS store, a JAAS login module other than PLAIN's and SCRAM's, a client certificate
given as two files to the Java client) raises ValueError naming the properties, never their values: properties
hold secrets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_LOGIN_MODULES = {"PLAIN": PLAIN_LOGIN_MODULE, "SCRAM-SHA-256": SCRAM_LOGIN_MODULE,
                  "SCRAM-SHA-512": SCRAM_LOGIN_MODULE}

# Names only one dialect has (ssl.keystore.location is in both, with different meanings: see above).
JAVA_ONLY = frozenset({
    "sasl.jaas.config", "ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.password",
    "ssl.truststore.certificates", "ssl.keystore.type", "ssl.keystore.key", "ssl.keystore.certificate.chain",
})
LIBRDKAFKA_ONLY = frozenset({
    "sasl.username", "sasl.password", "sasl.mechanisms", "ssl.ca.location", "ssl.ca.pem", "ssl.certificate.location",
    "ssl.key.location", "ssl.certificate.pem", "ssl.key.pem",
})

_JAAS = re.compile(r"\s*(?P<module>[\w.$]+)\s+(?:required|requisite|sufficient|optional)\b(?P<options>.*?);?\s*$",
                   re.DOTALL)
_JAAS_OPTION = re.compile(r'(?P<name>[\w.-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;"]+))')


def for_librdkafka(properties: Mapping[str, str]) -> dict[str, str]:
    """`properties` with librdkafka's names (for confluent-kafka); raises ValueError for what it cannot read."""
    given = {str(key): str(value) for key, value in properties.items()}
    out = {key: value for key, value in given.items() if key not in JAVA_ONLY}
    if "sasl.jaas.config" in given and not {"sasl.username", "sasl.password"} <= given.keys():
        module, options = _parse_jaas(given["sasl.jaas.config"])
        if module not in (PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE) or not {"username", "password"} <= options.keys():
            raise ValueError(
                f"sasl.jaas.config ({module}) has no librdkafka equivalent: confluent-kafka "
                "reads PLAIN's and SCRAM's username and password only; give sasl.username and sasl.password too")
        out.setdefault("sasl.username", options["username"])
        out.setdefault("sasl.password", options["password"])
    if ("ssl.truststore.location" in given or "ssl.truststore.certificates" in given) \
            and not {"ssl.ca.location", "ssl.ca.pem"} & given.keys():
        kind = given.get("ssl.truststore.type", "JKS").upper()
        if kind != "PEM":
            raise ValueError(f"a {kind} trust store (ssl.truststore.type) has no librdkafka equivalent: give the "
                             "CA certificates as PEM (ssl.truststore.type: PEM) or ssl.ca.location")
        if "ssl.truststore.location" in given:
            out["ssl.ca.location"] = given["ssl.truststore.location"]
        else:
            out["ssl.ca.pem"] = given["ssl.truststore.certificates"]
    _keystore_for_librdkafka(given, out)
    if out.get("ssl.endpoint.identification.algorithm", "none").strip() == "":
        out["ssl.endpoint.identification.algorithm"] = "none"
    return out


def _keystore_for_librdkafka(given: dict[str, str], out: dict[str, str]) -> None:
    kind = given.get("ssl.keystore.type", "").upper()
    if not kind or {"ssl.certificate.location", "ssl.certificate.pem"} & given.keys():
        return  # librdkafka's own (ssl.keystore.location is a PKCS#12 file there), or given in its names
    if kind == "PKCS12":
        return  # ssl.keystore.location and ssl.keystore.password mean the same in librdkafka
    if kind != "PEM":
        raise ValueError(f"a {kind} key store (ssl.keystore.type) has no librdkafka equivalent: "
                         "use PEM or PKCS12")
    if "ssl.keystore.location" in given:
        location = out.pop("ssl.keystore.location")
        out["ssl.certificate.location"] = location
        out["ssl.key.location"] = location
    if "ssl.keystore.key" in given:
        out["ssl.key.pem"] = given["ssl.keystore.key"]
    if "ssl.keystore.certificate.chain" in given:
        out["ssl.certificate.pem"] = given["ssl.keystore.certificate.chain"]


def for_java(properties: Mapping[str, str]) -> dict[str, str]:
    """`properties` with the Java client's names (for Spark's Kafka source, each under `kafka.`); raises
    ValueError for what it cannot express."""
    given = {str(key): str(value) for key, value in properties.items()}
    out = {key: value for key, value in given.items() if key not in LIBRDKAFKA_ONLY}
    if "sasl.mechanisms" in given:
        out.setdefault("sasl.mechanism", given["sasl.mechanisms"])
    if {"sasl.username", "sasl.password"} & given.keys() and "sasl.jaas.config" not in given:
        mechanism = out.get("sasl.mechanism", "GSSAPI").strip().upper()
        module = _LOGIN_MODULES.get(mechanism)
        if module is None:
            raise ValueError(f"sasl.username and sasl.password have no Java equivalent for "
                             f"sasl.mechanism {mechanism}: give sasl.jaas.config too")
        out["sasl.jaas.config"] = (f'{module} required username="{_jaas_quote(given.get("sasl.username", ""))}" '
                                   f'password="{_jaas_quote(given.get("sasl.password", ""))}";')
    if not {"ssl.truststore.location", "ssl.truststore.certificates"} & given.keys():
        if "ssl.ca.location" in given:
            out.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": given["ssl.ca.location"]})
        elif "ssl.ca.pem" in given:
            out.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": given["ssl.ca.pem"]})
    if "ssl.keystore.type" not in given and "ssl.keystore.location" not in given:
        if {"ssl.certificate.pem", "ssl.key.pem"} <= given.keys():
            out.update({"ssl.keystore.type": "PEM", "ssl.keystore.key": given["ssl.key.pem"],
                        "ssl.keystore.certificate.chain": given["ssl.certificate.pem"]})
        elif {"ssl.certificate.location", "ssl.key.location"} & given.keys():
            raise ValueError("ssl.certificate.location and ssl.key.location have no Java "
                             "equivalent: give ssl.keystore.type PEM and ssl.keystore.location, a file with the key "
                             "and the certificate chain, which both clients read")
    if out.get("ssl.endpoint.identification.algorithm", "").strip().lower() == "none":
        out["ssl.endpoint.identification.algorithm"] = ""
    return out


def check(properties: Mapping[str, str]) -> None:
    """Raise ValueError when `properties` cannot be given to one of the two dialects."""
    for_librdkafka(properties)
    for_java(properties)


def _parse_jaas(text: str) -> tuple[str, dict[str, str]]:
    """(login module, {option: value}) of a one-module JAAS config; ValueError (without the text) otherwise."""
    found = _JAAS.fullmatch(text)
    if found is None:
        raise ValueError("sasl.jaas.config is not '<LoginModule> required name=\"value\" ...;'")
    options = {}
    for option in _JAAS_OPTION.finditer(found["options"]):
        quoted = option["quoted"]
        options[option["name"]] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else option["bare"]
    return found["module"], options


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
