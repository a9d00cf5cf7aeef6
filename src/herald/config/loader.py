"""Loading a conf directory: herald.yaml, topics/*.yaml and subscriptions/*.yaml, validated in one pass.

Every problem is collected, each naming its file and key path, and raised together as a `ConfigError`.
`${env:NAME}` (or `${env:NAME:-default}`) in any string value is replaced from the environment first.

Example::

    config = load_config(Path("conf"))
    for subscription in config.active_subscriptions():
        ...
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from herald.config.model import ContentType, HeraldSettings, Subscription, Topic
from herald.endpoint import mask_secrets

SETTINGS_FILE = "herald.yaml"
TOPICS_DIR = "topics"
SUBSCRIPTIONS_DIR = "subscriptions"

_ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SECRET_KEYS = ("endpoint", "password", "secret", "properties", "options", "value", "token")

Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True)
class Problem:
    file: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.message}" if self.key else f"{self.file}: {self.message}"


class ConfigError(Exception):
    """The configuration is invalid; `problems` lists every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(problem) for problem in problems))


@dataclass(frozen=True)
class HeraldConfig:
    conf_dir: Path
    settings: HeraldSettings
    topics: dict[str, Topic]
    subscriptions: tuple[Subscription, ...]
    files: dict[str, Path] = field(default_factory=dict)  # subscription id -> its YAML file
    notes: tuple[str, ...] = ()  # informational findings `herald validate` prints
    schemas: dict[str, str] = field(default_factory=dict)  # AVRO topic name -> its schemaFile's JSON text

    def avro_source(self, topic: Topic):
        """How an AVRO topic's records are decoded (a picklable `herald.avro.decode.AvroSource`)."""
        from herald.avro.decode import AvroSource

        if topic.name in self.schemas:
            return AvroSource(schema_json=self.schemas[topic.name])
        return AvroSource(registry_url=self.settings.schemaRegistry.url, subject=topic.subject)

    @property
    def storage_path(self) -> str:
        """Where tables and checkpoints live: a URI as given, or a local path (relative to the conf directory)."""
        raw = self.settings.storage.path
        if "://" in raw or raw.startswith("dbfs:"):
            return raw.rstrip("/")
        path = Path(raw)
        return str(path if path.is_absolute() else (self.conf_dir / path).resolve())

    def subscription(self, subscription_id: str) -> Subscription:
        for subscription in self.subscriptions:
            if subscription.id == subscription_id:
                return subscription
        known = ", ".join(sorted(s.id for s in self.subscriptions)) or "none"
        raise KeyError(f"no subscription {subscription_id!r} in {self.conf_dir} (known: {known})")

    def topic_of(self, subscription: Subscription) -> Topic:
        return self.topics[subscription.topicName]

    def active_subscriptions(self, only: list[str] | None = None) -> list[Subscription]:
        chosen = [self.subscription(sid) for sid in only] if only else list(self.subscriptions)
        return [subscription for subscription in chosen if subscription.active]


def load_config(conf_dir: Path | str) -> HeraldConfig:
    """Load and validate a conf directory; raise ConfigError listing every problem."""
    conf_dir = Path(conf_dir).resolve()
    problems: list[Problem] = []
    notes: list[str] = []
    if not conf_dir.is_dir():
        raise ConfigError([Problem(str(conf_dir), "", "configuration directory not found")])

    def shown(path: Path) -> str:
        try:
            return str(path.relative_to(conf_dir.parent))
        except ValueError:
            return str(path)

    settings_path = conf_dir / SETTINGS_FILE
    settings = _load_file(settings_path, HeraldSettings, shown, problems, required=True)

    topics: dict[str, Topic] = {}
    schemas: dict[str, str] = {}
    for path in _yaml_files(conf_dir / TOPICS_DIR):
        topic = _load_file(path, Topic, shown, problems)
        if topic is None:
            continue
        if topic.name in topics:
            problems.append(Problem(shown(path), "name", f"topic {topic.name} is defined twice"))
        topics[topic.name] = topic
        problems.extend(_check_topic(topic, conf_dir, settings, shown(path), schemas))

    subscriptions: list[Subscription] = []
    files: dict[str, Path] = {}
    for path in _yaml_files(conf_dir / SUBSCRIPTIONS_DIR):
        subscription = _load_file(path, Subscription, shown, problems)
        if subscription is None:
            continue
        if subscription.id in files:
            problems.append(Problem(shown(path), "name",
                                    f"subscription {subscription.id} is also defined in {shown(files[subscription.id])}"))
            continue
        problems.extend(_check_subscription(subscription, topics, shown(path), notes))
        subscriptions.append(subscription)
        files[subscription.id] = path

    if problems or settings is None:
        raise ConfigError(problems)
    return HeraldConfig(conf_dir, settings, topics, tuple(subscriptions), files, tuple(notes), schemas)


def _yaml_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def _load_file(
    path: Path, model: type[Model], shown: Callable[[Path], str], problems: list[Problem], required: bool = False
) -> Model | None:
    name = shown(path)
    if not path.exists():
        if required:
            problems.append(Problem(name, "", "file not found"))
        return None
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problems.append(Problem(name, "", f"invalid YAML{where}: {getattr(error, 'problem', error)}"))
        return None
    if not isinstance(document, dict):
        problems.append(Problem(name, "", "must be a YAML mapping (one definition per file)"))
        return None
    env_problems: list[Problem] = []
    document = _substitute_env(document, name, "", env_problems)
    if env_problems:
        problems.extend(env_problems)
        return None
    try:
        return model.model_validate(document)
    except ValidationError as error:
        problems.extend(_problems_from(error, name))
        return None


def _substitute_env(value: Any, file: str, key: str, problems: list[Problem]) -> Any:
    if isinstance(value, dict):
        return {k: _substitute_env(v, file, _join(key, str(k)), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute_env(v, file, f"{key}[{i}]", problems) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        problems.append(Problem(file, key, f"environment variable {name} is not set"))
        return ""

    return _ENV_REFERENCE.sub(replace, value)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _key_path(location: tuple) -> str:
    path = ""
    for part in location:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, str(part))
    return path


def _problems_from(error: ValidationError, file: str) -> list[Problem]:
    problems = []
    for item in error.errors():
        key = _key_path(item["loc"])
        kind, context = item["type"], item.get("ctx") or {}
        if kind == "extra_forbidden":
            message = "unknown key"
        elif kind == "missing":
            message = "required key is missing"
        elif kind in ("literal_error", "enum"):
            message = f"must be one of {context.get('expected')}"
        elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
            bound = f"{next(iter(context.values())):g}"
            symbol = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
            message = f"must be {symbol} {bound}"
        else:
            message = str(item["msg"]).removeprefix("Value error, ")
        shown_input = item.get("input")
        if isinstance(shown_input, (int, float)) and not isinstance(shown_input, bool) and not _secret(key):
            message += f" (got {shown_input})"
        problems.append(Problem(file, key, mask_secrets(message)))
    return problems


def _secret(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_KEYS)


def _check_topic(topic: Topic, conf_dir: Path, settings: HeraldSettings | None, file: str,
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


def _check_subscription(subscription: Subscription, topics: dict[str, Topic], file: str, notes: list[str]) -> list[Problem]:
    """Checks that need more than one file, or that name features not built yet."""
    from herald.filters import check_rule

    problems: list[Problem] = []
    topic = topics.get(subscription.topicName)
    if topic is None:
        known = ", ".join(sorted(topics)) or "none"
        problems.append(Problem(file, "topicName", f"topic {subscription.topicName} is not defined in topics/ (defined: {known})"))
    for key, value, planned in (
        ("deliveryType", subscription.deliveryType, "SERIAL"),
        ("mode", subscription.mode, "ANYCAST"),
    ):
        if value != planned:
            problems.append(Problem(file, key, f"{value} is not supported yet (only {planned})"))
    if topic is not None and subscription.contentType is ContentType.AVRO and topic.contentType is ContentType.JSON:
        problems.append(Problem(file, "contentType", f"AVRO delivery needs an AVRO topic; {topic.name} is JSON"))
    if subscription.trackingMode != "trackingOff":
        notes.append(f"{file}: trackingMode {subscription.trackingMode}: message tracking is not implemented yet, "
                     "so nothing is tracked (undelivered messages are still stored)")
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
