"""Checks of a topic or subscription that need more than its own file (a topic's schema, a subscription's
topic and filters), and combinations Hermes refuses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from herald.config.files import Problem
from herald.config.model import ContentType, Subscription, Topic
from herald.config.settings import HeraldSettings
from herald.endpoint import placeholders


def check_topic(topic: Topic, conf_dir: Path, settings: HeraldSettings | None, file: str,
                 schemas: dict[str, str]) -> list[Problem]:
    """An AVRO topic needs a readable schema file or a schema registry; a JSON topic needs neither."""
    import json

    import fastavro

    if topic.contentType is ContentType.JSON:
        return [Problem(file, "schemaFile", "only AVRO topics have a schema")] if topic.schemaFile else []
    if topic.schemaFile is None:
        if settings is not None and settings.schemaRegistry is None:
            return [Problem(file, "schemaFile", "an AVRO topic needs a schemaFile, or schemaRegistry.url in "
                                                "herald.yaml")]
        return []
    path = (conf_dir / topic.schemaFile).resolve()
    try:
        text = path.read_text(encoding="utf-8")
        fastavro.parse_schema(json.loads(text))
    except OSError as error:
        return [Problem(file, "schemaFile", f"cannot read {topic.schemaFile}: {error.strerror}")]
    except (ValueError, fastavro.schema.SchemaParseException) as error:
        return [Problem(file, "schemaFile", f"{topic.schemaFile} is not a valid Avro schema: {error}")]
    schemas[topic.name] = text
    return []


_FILTER_FOR = {ContentType.JSON: "jsonpath", ContentType.AVRO: "avropath"}


def check_subscription(subscription: Subscription, topics: dict[str, Topic], file: str, notes: list[str],
                        invalid_topics: dict[Path, str | None] | None = None,
                        shown: Callable[[Path], str] = str, providers: set[str] | None = None) -> list[Problem]:
    """Checks that need more than one file, or that name features not built yet.

    invalid_topics: topic files left out (-> the topic name each names, None when unreadable); a subscription
    of a topic left out gets a problem naming the topic's file. providers: the OAuth provider names herald.yaml
    defines (None: unknown, not checked)."""
    from herald.filters import check_rule

    problems: list[Problem] = []
    topic = topics.get(subscription.topicName)
    invalid_topics = invalid_topics or {}
    named = [shown(path) for path, name in invalid_topics.items() if name == subscription.topicName]
    unnamed = [shown(path) for path, name in invalid_topics.items() if name is None]
    if topic is None and named:
        problems.append(Problem(file, "topicName", f"topic {subscription.topicName} is left out: its file "
                                                   f"{', '.join(named)} is invalid"))
    elif topic is None:
        known = ", ".join(sorted(topics)) or "none"
        maybe = f"; {', '.join(unnamed)}, which may define it, is invalid" if unnamed else ""
        problems.append(Problem(file, "topicName", f"topic {subscription.topicName} is not defined in topics/ "
                                                   f"(defined: {known}){maybe}"))
    policy = subscription.oAuthPolicy
    if policy is not None and providers is not None and policy.providerName not in providers:
        known = ", ".join(sorted(providers)) or "none"
        problems.append(Problem(file, "oAuthPolicy.providerName",
                                f"OAuth provider {policy.providerName} is not in herald.yaml's oauthProviders "
                                f"(defined: {known})"))
    if subscription.deliveryType == "BATCH":
        if subscription.contentType is ContentType.AVRO:
            problems.append(Problem(file, "contentType", "BATCH delivery sends a JSON array: it takes contentType "
                                                         "JSON, not AVRO (as in Hermes)"))
        if subscription.mode == "BROADCAST":
            problems.append(Problem(file, "mode", "BATCH delivery cannot be BROADCAST (as in Hermes): use ANYCAST"))
        if any(placeholders(url) for url in subscription.endpoint_urls):
            problems.append(Problem(file, "endpoint" if subscription.endpoint is not None else "endpoints",
                                    "BATCH delivery cannot fill {json.path} placeholders (a batch holds many "
                                    "messages)"))
    if topic is not None and subscription.contentType is ContentType.AVRO and topic.contentType is ContentType.JSON:
        problems.append(Problem(file, "contentType", f"AVRO delivery needs an AVRO topic; {topic.name} is JSON"))
    for index, spec in enumerate(subscription.filters):
        if topic is not None and spec.type != "header" and spec.type != _FILTER_FOR[topic.contentType]:
            problems.append(Problem(file, f"filters[{index}].type", f"{topic.name} is a {topic.contentType.value} "
                                    f"topic: filter it with {_FILTER_FOR[topic.contentType]} (filters run before any "
                                    "conversion)"))
        else:
            notes.extend(f"{file}: filters[{index}]: {note}" for note in check_rule(spec.rule()))
    return problems


def filter_rules(subscription: Subscription) -> list:
    """The subscription's filters as `herald.filters.FilterRule`s, in declaration order."""
    return [spec.rule() for spec in subscription.filters]
