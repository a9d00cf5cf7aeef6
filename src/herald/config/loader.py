"""Loading a conf directory: herald.yaml, topics/*.yaml and subscriptions/*.yaml, validated in one pass.

Every problem is collected, each naming its file and key path (secrets masked). `load_config` (validate, the
start of `herald run`) raises them together as a `ConfigError`; `load_config_lenient` (a running job, the
read-only commands) leaves out the invalid topic and subscription files and returns their problems beside the
rest, and only herald.yaml's problems are fatal. `conf_fingerprint` tells a watcher when to load again.
`${env:NAME}` (or `${env:NAME:-default}`) in any string value is replaced from the environment first.

Example::

    config = load_config(Path("conf"))
    for subscription in config.active_subscriptions():
        ...
    result = load_config_lenient(Path("conf"))   # result.config, result.problems, result.invalid_*_files
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from herald.config.checks import check_subscription, check_topic, filter_rules
from herald.config.files import ConfigError, Problem, load_file, raw_mapping, substitute_env, yaml_files
from herald.config.model import Subscription, Topic
from herald.config.settings import HeraldSettings
from herald.config.tls import check_tls, effective_tls

SETTINGS_FILE = "herald.yaml"
TOPICS_DIR = "topics"
SUBSCRIPTIONS_DIR = "subscriptions"
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")
"""A storage path that starts with a URI scheme (two letters or more: not a Windows drive) is a URI."""

__all__ = ["ConfigError", "HeraldConfig", "LoadResult", "Problem", "conf_fingerprint", "filter_rules", "load_config",
           "load_config_lenient"]

@dataclass(frozen=True)
class HeraldConfig:
    conf_dir: Path
    settings: HeraldSettings
    topics: dict[str, Topic]
    subscriptions: tuple[Subscription, ...]
    files: dict[str, Path] = field(default_factory=dict)  # subscription id -> its YAML file
    notes: tuple[str, ...] = ()  # informational findings `herald validate` prints
    schemas: dict[str, str] = field(default_factory=dict)  # AVRO topic name -> its schemaFile's JSON text
    # subscription files left out by `load_config_lenient` -> the id each names (None when unreadable)
    left_out: dict[Path, str | None] = field(default_factory=dict)

    def avro_source(self, topic: Topic):
        """How an AVRO topic's records are decoded (a picklable `herald.avro.decode.AvroSource`)."""
        from herald.avro.decode import AvroSource

        if topic.name in self.schemas:
            return AvroSource(schema_json=self.schemas[topic.name])
        return AvroSource(registry_url=self.settings.schemaRegistry.url, subject=topic.subject)

    @property
    def storage_path(self) -> str:
        """Where tables and checkpoints live: a URI as given (`s3a://b/x`, `dbfs:/x`, `file:///x`, Hadoop's
        `file:/x`), or a local path (relative to the conf directory)."""
        raw = self.settings.storage.path
        if _URI_SCHEME.match(raw):
            return raw.rstrip("/")
        path = Path(raw)
        return str(path if path.is_absolute() else (self.conf_dir / path).resolve())

    def shown(self, path: Path | str) -> str:
        """A file as problems name it: relative to the conf directory's parent (`conf/subscriptions/a.yaml`)."""
        return _shown(self.conf_dir, Path(path))

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

    def with_subscriptions(
        self,
        kept: Mapping[Path | str, Subscription] | Iterable[Subscription],
        topics: Mapping[Any, Topic] | Iterable[Topic] = (),
        schemas: Mapping[str, str] | None = None,
    ) -> HeraldConfig:
        """This configuration plus definitions kept from an earlier one: a running job keeps the last valid
        version of a file that is now invalid (`load_config_lenient` left it out).

        kept: {subscription file: its last valid Subscription}. Bare Subscriptions are accepted too: each is
            matched to the left-out file that names its id, else to the one named `<name>.yaml`, else to the
            only left-out file still unmatched; ValueError when that is ambiguous.
        topics: last valid Topics of topic files that are now invalid (with `schemas`, their schemaFile texts).
        A kept definition whose id (or topic name) a valid file now defines is dropped: the valid file wins. So
        is a kept subscription whose topic is neither defined nor kept.
        """
        all_topics = dict(self.topics)
        all_schemas = dict(self.schemas)
        for topic in (topics.values() if isinstance(topics, Mapping) else topics):
            if topic.name not in all_topics:
                all_topics[topic.name] = topic
                if schemas and topic.name in schemas:
                    all_schemas[topic.name] = schemas[topic.name]
        pairs = [(Path(path), subscription) for path, subscription in kept.items()] if isinstance(kept, Mapping) \
            else self._files_of(list(kept))
        subscriptions, files = list(self.subscriptions), dict(self.files)
        for path, subscription in pairs:
            if subscription.id in files or subscription.topicName not in all_topics:
                continue
            subscriptions.append(subscription)
            files[subscription.id] = path
        return replace(self, topics=all_topics, subscriptions=tuple(subscriptions), files=files, schemas=all_schemas)

    def _files_of(self, kept: list[Subscription]) -> list[tuple[Path, Subscription]]:
        free = dict(self.left_out)
        pairs: list[tuple[Path, Subscription]] = []
        for matches in (lambda path, s: free[path] == s.id, lambda path, s: path.stem in (s.name, s.id)):
            unmatched = []
            for subscription in kept:
                path = next((path for path in free if matches(path, subscription)), None)
                if path is None:
                    unmatched.append(subscription)
                else:
                    pairs.append((path, subscription))
                    del free[path]
            kept = unmatched
        if len(kept) == 1 and len(free) == 1:
            pairs.append((next(iter(free)), kept.pop()))
        if kept:
            raise ValueError(f"cannot tell which file held {', '.join(s.id for s in kept)}: pass "
                             "{file: subscription}")
        return pairs


@dataclass(frozen=True)
class LoadResult:
    """What `load_config_lenient` found: the valid part of a conf directory and what was left out.

    config: every valid topic and subscription (and herald.yaml, which must be valid).
    problems: every problem of the files left out, each with its file and key (secrets masked).
    invalid_subscription_files / invalid_topic_files: absolute paths of the files whose definition was left out
        (a subscription is also left out when its topic's file is invalid), so that a running job can keep the
        last valid version of each.
    """

    config: HeraldConfig
    problems: tuple[Problem, ...] = ()
    invalid_subscription_files: tuple[Path, ...] = ()
    invalid_topic_files: tuple[Path, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def problems_in(self, path: Path | str) -> list[Problem]:
        """The problems reported for one file (an absolute path, or the file as problems name it)."""
        wanted = {str(path), self.config.shown(path)}
        return [problem for problem in self.problems if problem.file in wanted]

    def invalid_file_of(self, subscription_id: str) -> Path | None:
        """The invalid file that defines `subscription_id`, if any: the one whose topicName and name give that
        id, or else one too broken to name an id that is named after it (`<name>.yaml` or `<id>.yaml`). None
        when a valid file defines the id."""
        if any(subscription.id == subscription_id for subscription in self.config.subscriptions):
            return None
        left_out = self.config.left_out
        for path in self.invalid_subscription_files:
            if left_out.get(path) == subscription_id:
                return path
        for path in self.invalid_subscription_files:
            if left_out.get(path) is None and path.stem in (subscription_id, subscription_id.rsplit(".", 1)[-1]):
                return path
        return None


def load_config(conf_dir: Path | str) -> HeraldConfig:
    """Load and validate a conf directory; raise ConfigError listing every problem."""
    loaded = _load(conf_dir, lenient=False)
    if loaded.problems:
        raise ConfigError(loaded.problems)
    return loaded.config


def load_config_lenient(conf_dir: Path | str) -> LoadResult:
    """Load a conf directory, leaving out the topics and subscriptions whose files are invalid.

    For a running job and the read-only commands: the result holds every valid definition, and the problems of
    the rest, each naming its file and key. Left out, each with a problem: an invalid topic or subscription
    file, a subscription whose topic file is invalid or missing (the problem names both files), and the later
    of two files defining the same topic or subscription id. Problems in herald.yaml (or a missing conf
    directory) are fatal: they raise ConfigError, as `load_config` does.
    """
    return _load(conf_dir, lenient=True)


def _load(conf_dir: Path | str, lenient: bool) -> LoadResult:
    conf_dir = Path(conf_dir).resolve()
    problems: list[Problem] = []
    notes: list[str] = []
    if not conf_dir.is_dir():
        raise ConfigError([Problem(str(conf_dir), "", "configuration directory not found")])

    def shown(path: Path) -> str:
        return _shown(conf_dir, path)

    settings_path = conf_dir / SETTINGS_FILE
    settings = load_file(settings_path, HeraldSettings, shown, problems, required=True)
    if settings is not None:
        problems.extend(check_tls(settings.delivery.tls, conf_dir, shown(settings_path), "delivery.tls"))
        for index, provider in enumerate(settings.oauthProviders):
            problems.extend(check_tls(provider.tls, conf_dir, shown(settings_path), f"oauthProviders[{index}].tls"))
        settings = _providers_with_tls_in_force(settings, conf_dir)
    if lenient and (problems or settings is None):
        raise ConfigError(problems or [Problem(shown(settings_path), "", "file not found")])

    topics: dict[str, Topic] = {}
    schemas: dict[str, str] = {}
    invalid_topics: dict[Path, str | None] = {}  # invalid topic file -> the topic name it names, if readable
    readers: dict[str, tuple[str, Path]] = {}  # Kafka topic -> (the topic reading it, its file)
    for path in yaml_files(conf_dir / TOPICS_DIR):
        found: list[Problem] = []
        topic = load_file(path, Topic, shown, found)
        if topic is not None:
            if topic.name in topics:
                found.append(Problem(shown(path), "name", f"topic {topic.name} is defined twice"))
            elif topic.kafka_topic in readers:
                other, other_path = readers[topic.kafka_topic]
                found.append(Problem(shown(path), "kafkaTopic" if topic.kafkaTopic else "name",
                                     f"topic {topic.name} reads Kafka topic {topic.kafka_topic}, which topic {other} "
                                     f"({shown(other_path)}) reads already: one topic per Kafka topic"))
            else:
                readers[topic.kafka_topic] = (topic.name, path)
            schema: dict[str, str] = {}
            found.extend(check_topic(topic, conf_dir, settings, shown(path), schema))
            if not found or not lenient:
                topics[topic.name] = topic
                schemas.update(schema)
        if found:
            problems.extend(found)
            name = topic.name if topic is not None else raw_mapping(path).get("name")
            invalid_topics[path] = name if isinstance(name, str) else None

    subscriptions: list[Subscription] = []
    files: dict[str, Path] = {}
    invalid_subscriptions: list[Path] = []
    claimed: dict[Path, str] = {}
    for path in yaml_files(conf_dir / SUBSCRIPTIONS_DIR):
        found = []
        subscription = load_file(path, Subscription, shown, found)
        if subscription is not None and subscription.id in files:
            found.append(Problem(shown(path), "name", f"subscription {subscription.id} is also defined in "
                                                       f"{shown(files[subscription.id])}"))
        elif subscription is not None:
            found.extend(check_subscription(
                subscription, topics, shown(path), notes, invalid_topics if lenient else {}, shown,
                {provider.name for provider in settings.oauthProviders} if settings is not None else None))
            found.extend(check_tls(subscription.tls, conf_dir, shown(path), "tls"))
            subscription = _with_tls_in_force(subscription, settings, conf_dir)
        if found:
            problems.extend(found)
            invalid_subscriptions.append(path)
            raw = {"topicName": subscription.topicName, "name": subscription.name} if subscription is not None \
                else raw_mapping(path)
            if isinstance(raw.get("topicName"), str) and isinstance(raw.get("name"), str):
                claimed[path] = f"{raw['topicName']}.{raw['name']}"
        if subscription is not None and (not found or not lenient) and subscription.id not in files:
            subscriptions.append(subscription)
            files[subscription.id] = path

    left_out = {path: claimed.get(path) for path in invalid_subscriptions}
    config = HeraldConfig(conf_dir, settings, topics, tuple(subscriptions), files, tuple(notes), schemas, left_out)
    return LoadResult(config, tuple(problems), tuple(invalid_subscriptions), tuple(invalid_topics))


def _with_tls_in_force(subscription: Subscription, settings: HeraldSettings | None, conf_dir: Path) -> Subscription:
    """The subscription with the TLS settings it delivers with: its own over herald.yaml's, paths absolute."""
    tls = effective_tls(subscription.tls, settings.delivery.tls if settings is not None else None, conf_dir)
    return subscription if tls == subscription.tls else subscription.model_copy(update={"tls": tls})


def _providers_with_tls_in_force(settings: HeraldSettings, conf_dir: Path) -> HeraldSettings:
    """The settings with each OAuth provider's TLS settings in force: its own over delivery.tls, paths absolute."""
    providers = [provider.model_copy(update={"tls": effective_tls(provider.tls, settings.delivery.tls, conf_dir)})
                 for provider in settings.oauthProviders]
    return settings.model_copy(update={"oauthProviders": providers}) if providers else settings


def conf_fingerprint(conf_dir: Path | str) -> tuple:
    """A cheap fingerprint of a conf directory: (path, size, mtime_ns) of herald.yaml, topics/*.yaml,
    subscriptions/*.yaml and the schema files the topics name. It changes when a file is edited, added or
    removed, and not otherwise; a watcher reloads the configuration only when it does. Topic files are parsed
    (for their schemaFile) only when they change."""
    conf_dir = Path(conf_dir).resolve()
    entries: list[tuple[str, int, int]] = []

    def add(path: Path) -> tuple[str, int, int] | None:
        try:
            status = path.stat()
        except OSError:
            return None
        entry = (str(path), status.st_size, status.st_mtime_ns)
        entries.append(entry)
        return entry

    add(conf_dir / SETTINGS_FILE)
    schema_files: set[str] = set()
    for path in yaml_files(conf_dir / TOPICS_DIR):
        entry = add(path)
        if entry is not None:
            schema_file = _schema_file_named(entry)
            if schema_file:
                schema_files.add(schema_file)
    for path in yaml_files(conf_dir / SUBSCRIPTIONS_DIR):
        add(path)
    for schema_file in sorted(schema_files):
        if add((conf_dir / schema_file).resolve()) is None:
            entries.append((str((conf_dir / schema_file).resolve()), -1, -1))  # named but missing
    return tuple(entries)


_SCHEMA_FILES: dict[tuple[str, int, int], str | None] = {}  # topic file (path, size, mtime_ns) -> its schemaFile


def _schema_file_named(entry: tuple[str, int, int]) -> str | None:
    if entry not in _SCHEMA_FILES:
        if len(_SCHEMA_FILES) > 10_000:
            _SCHEMA_FILES.clear()
        value = raw_mapping(Path(entry[0])).get("schemaFile")
        _SCHEMA_FILES[entry] = substitute_env(value, "", "", []) if isinstance(value, str) else None
    return _SCHEMA_FILES[entry]


def _shown(conf_dir: Path, path: Path) -> str:
    """A file as problems name it: relative to the conf directory's parent (`conf/subscriptions/a.yaml`)."""
    try:
        return str(path.relative_to(conf_dir.parent))
    except ValueError:
        return str(path)
