"""The `herald` command: run, validate, read the tables, manage the local broker, publish, demo.

Commands that only read tables (undelivered, metrics, offsets) or validate never start Spark.
`validate` and `run` refuse an invalid configuration. The read-only commands and suspend/activate load it
leniently: each problem of another file is a warning on stderr, and they answer for every valid subscription.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from herald import logs
from herald.config import ConfigError, HeraldConfig, LoadResult, Subscription, load_config, load_config_lenient


def _load(conf: str) -> HeraldConfig:
    try:
        return load_config(Path(conf))
    except ConfigError as error:
        _refuse(conf, error)


def _refuse(conf: str, error: ConfigError) -> NoReturn:
    print(f"invalid configuration in {conf}:", file=sys.stderr)
    for problem in error.problems:
        print(f"  {problem}", file=sys.stderr)
    raise SystemExit(2) from None


def _load_lenient(conf: str, subscription_id: str) -> tuple[HeraldConfig, Subscription]:
    """The configuration without its invalid files, and the subscription asked for.

    Each problem of another file is printed as `warning: <file>: <key>: <message>`; when the subscription's own
    file is invalid (or herald.yaml is), its problems are printed and the command exits 2."""
    try:
        result: LoadResult = load_config_lenient(Path(conf))
    except ConfigError as error:
        _refuse(conf, error)
    own = result.invalid_file_of(subscription_id)
    own_problems = result.problems_in(own) if own is not None else []
    for problem in result.problems:
        if problem not in own_problems:
            print(f"warning: {problem}", file=sys.stderr)
    if own is not None:
        print(f"{subscription_id}: left out of the configuration, {result.config.shown(own)} is invalid:",
              file=sys.stderr)
        for problem in own_problems:
            print(f"  {problem}", file=sys.stderr)
        raise SystemExit(2)
    return result.config, _subscription(result.config, subscription_id)


def _subscription(config: HeraldConfig, subscription_id: str):
    try:
        return config.subscription(subscription_id)
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        raise SystemExit(2) from None


def cmd_validate(args) -> int:
    if args.json:
        return _validate_json(args.conf)
    config = _load(args.conf)
    for note in config.notes:
        print(f"note: {note}")
    active = sum(1 for s in config.subscriptions if s.active)
    print(f"{args.conf}: valid: {len(config.topics)} topic(s), {len(config.subscriptions)} subscription(s) "
          f"({active} ACTIVE)")
    return 0


def _validate_json(conf: str) -> int:
    """`validate --json`: {valid, topics, subscriptions, active, notes, problems: [{file, key, message}]}; exit 2
    when invalid."""
    from dataclasses import asdict

    try:
        config = load_config(Path(conf))
    except ConfigError as error:
        print(json.dumps({"valid": False, "problems": [asdict(p) for p in error.problems]}, indent=2))
        return 2
    print(json.dumps({"valid": True, "topics": len(config.topics), "subscriptions": len(config.subscriptions),
                      "active": sum(1 for s in config.subscriptions if s.active), "notes": list(config.notes),
                      "problems": []}, indent=2))
    return 0


def cmd_run(args) -> int:
    config = _load(args.conf)  # refuse an invalid configuration before loading the engine (and Spark)
    for subscription_id in args.subscription or []:
        _subscription(config, subscription_id)
    from herald.engine.runner import Runner

    return Runner(config, only=args.subscription, metrics_port=args.metrics_port).run(once=args.once)


def _print_rows(rows: list[dict], columns: list[str]) -> None:
    if not rows:
        return
    widths = {c: max(len(c), *(len(str(row.get(c, ""))) for row in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


def cmd_undelivered(args) -> int:
    from herald.readout import undelivered

    config, subscription = _load_lenient(args.conf, args.id)
    rows = undelivered(config, subscription, 1 if args.last else args.limit)
    if args.json:
        print(json.dumps(rows[0] if args.last and rows else rows, indent=2))
        return 0 if rows or not args.last else 1
    if not rows:
        print(f"{subscription.id}: no undelivered messages")
        return 0
    for row in rows:
        print(f"{row['timestamp']}  {row['topicName']}[{row['partition']}]@{row['offset']}  {row['status']}  "
              f"attempts={row['attempts']}  {row['reason']}")
        print(f"    {row['message']}")
    return 0


def cmd_metrics(args) -> int:
    from herald.readout import metrics

    config, subscription = _load_lenient(args.conf, args.id)
    result = metrics(config, subscription, with_lag=not args.no_lag)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for key, value in result.items():
        if key == "lastMinute":
            value = ", ".join(f"{name} {figure:g}/s" for name, figure in value.items())
        elif key == "lag":
            value = ", ".join(f"{item['partition']}: {item['lag']}" for item in value) or "-"
        elif key == "lagError" and value is None:
            continue
        print(f"{key:>12}  {value}")
    return 0


def cmd_trace(args) -> int:
    from herald.readout import trace

    config, subscription = _load_lenient(args.conf, args.id)
    steps = trace(config, subscription, args.message_id)
    if args.json:
        print(json.dumps(steps, indent=2))
    elif not steps:
        print(f"{subscription.id}: no tracked history of message {args.message_id} "
              f"(trackingMode: {subscription.trackingMode})", file=sys.stderr)
    for step in [] if args.json else steps:
        status = step["status"] + (f" {step['httpStatus']}" if step["httpStatus"] is not None else "")
        reason = f"  {step['reason']}" if step["reason"] else ""
        print(f"{_iso_ms(step['timestamp'])}  {step['topicName']}[{step['partition']}]@{step['offset']}  "
              f"{status}{reason}")
    return 0 if steps else 1


def _iso_ms(epoch_ms: int | None) -> str:
    import datetime as dt

    if epoch_ms is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch_ms / 1000, tz=dt.timezone.utc).isoformat(timespec="milliseconds")


def cmd_oauth(args) -> int:
    """`herald oauth providers`: herald.yaml's OAuth providers, secrets shown as ******."""
    try:
        config = load_config_lenient(Path(args.conf)).config  # only herald.yaml matters here
    except ConfigError as error:
        _refuse(args.conf, error)
    providers = [{**provider.model_dump(exclude={"clientSecret"}), "clientSecret": "******"}
                 for provider in config.settings.oauthProviders]
    if args.json:
        print(json.dumps(providers, indent=2))
    elif providers:
        _print_rows(providers, ["name", "tokenEndpoint", "clientId", "clientSecret", "tokenRequestInitialDelay",
                                "tokenRequestMaxDelay", "requestTimeout", "socketTimeout"])
    else:
        print(f"{args.conf}: no oauthProviders in herald.yaml")
    return 0


def cmd_offsets(args) -> int:
    from herald.readout import last_retransmission, offsets

    config, subscription = _load_lenient(args.conf, args.id)
    rows = offsets(config, subscription)
    last = last_retransmission(config, subscription)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        _print_rows(rows, ["topic", "partition", "offset", "batchId", "committedAt"])
    else:
        print(f"{args.id}: no offsets yet (the subscription has not run)")
    if last is not None and not args.json:
        moved = ", ".join(f"{p['partition']}: {p['from']} -> {p['to']}" for p in last["partitions"])
        print(f"last retransmission: from {_iso(last['date'])}, asked by {last['requestedBy']} at "
              f"{_iso(last['recordedAt'])}; partition {moved}")
    return 0


def _iso(epoch_ms: int | None) -> str:
    import datetime as dt

    if epoch_ms is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.timezone.utc).isoformat(timespec="seconds")


def cmd_retransmit(args) -> int:
    from herald.engine.moves import MoveError, parse_date, retransmit
    from herald.source.kafka_offsets import KafkaOffsetsError
    from herald.storage import DeltaRsStore
    from herald.storage.tables import epoch_ms

    config, subscription = _load_lenient(args.conf, args.id)
    try:
        date = parse_date(args.date)
    except MoveError as error:
        print(f"{args.id}: {error}", file=sys.stderr)
        return 2
    kafka_topic = config.topic_of(subscription).kafka_topic
    store = DeltaRsStore(config.storage_path, config.settings.storage.options or None)
    try:
        current, move = retransmit(store, config.settings.kafka.client_config(), subscription.id, kafka_topic, date,
                                   dry_run=args.dry_run)
    except KafkaOffsetsError as error:
        print(f"{args.id}: {error}", file=sys.stderr)
        return 1
    partitions = [{"partition": p, "from": current.get(p), "to": offset}
                  for p, offset in sorted(move.to_offsets.items())]
    if args.json:
        print(json.dumps({"subscription": subscription.id, "topic": kafka_topic, "date": epoch_ms(date),
                          "dryRun": args.dry_run, "partitions": partitions}, indent=2))
        return 0
    verb = "would move" if args.dry_run else "moved"
    print(f"{subscription.id} {verb} to the first messages at or after {date.isoformat()}"
          f"{' (dry run: nothing changed)' if args.dry_run else ''}:")
    _print_rows(partitions, ["partition", "from", "to"])
    if not args.dry_run:
        print("a running `herald run` picks the move up within streaming.configPollMs; otherwise the next run "
              "(or the activation of a suspended subscription) delivers from there")
    return 0


def cmd_maintain(args) -> int:
    from dataclasses import asdict

    from herald.storage import DeltaRsStore
    from herald.storage.maintenance import maintain_tables

    try:
        config = load_config_lenient(Path(args.conf)).config  # only herald.yaml matters here
    except ConfigError as error:
        _refuse(args.conf, error)
    settings = config.settings.storage
    hours = args.retention_hours if args.retention_hours is not None else settings.maintenanceRetentionHours
    results = maintain_tables(DeltaRsStore(config.storage_path, settings.options or None), hours)
    if args.json:
        print(json.dumps([asdict(result) for result in results], indent=2))
        return 0
    for result in results:
        print(f"{result.table:>12}  {result.files_before} file(s) -> {result.files_after}: {result.files_removed} "
              f"compacted into {result.files_added}, {result.files_deleted} deleted (older than {hours:g} h)")
    return 0


def _broker_for(args):
    from herald.broker import DEFAULT_PORT, EmbeddedBroker

    port = args.port
    if port is None and args.conf and Path(args.conf, "herald.yaml").exists():
        servers = _load(args.conf).settings.kafka.bootstrapServers.split(",")[0]
        port = int(servers.rsplit(":", 1)[1]) if ":" in servers else DEFAULT_PORT
    return EmbeddedBroker(Path(args.data_dir), port=port or DEFAULT_PORT)


def cmd_broker(args) -> int:
    from herald.broker import BrokerError

    broker = _broker_for(args)
    try:
        if args.action == "up":
            broker.up()
            if args.conf and Path(args.conf, "herald.yaml").exists():
                config = _load(args.conf)
                broker.create_topics({topic.kafka_topic: args.partitions for topic in config.topics.values()})
            print(f"embedded broker up on {broker.bootstrap_servers} (data in {broker.data_dir})")
        elif args.action == "down":
            broker.down()
            print(f"embedded broker on {broker.bootstrap_servers} stopped")
        else:
            print(broker.status())
    except BrokerError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


def cmd_publish(args) -> int:
    from herald.publish import publish

    config = _load(args.conf)
    topic = config.topics.get(args.topic)
    if topic is None:
        print(f"topic {args.topic} is not defined in {args.conf}/topics (defined: {', '.join(sorted(config.topics))})",
              file=sys.stderr)
        return 2
    lines: list[str] = list(args.message or [])
    if args.file:
        lines.extend(Path(args.file).read_text(encoding="utf-8").splitlines())
    if not lines:
        lines = sys.stdin.read().splitlines()
    kafka = config.settings.kafka
    encode = None
    if topic.contentType.value == "AVRO":
        from herald.avro.encode import avro_encoder

        encode = avro_encoder(config.avro_source(topic))
    result = publish(kafka.bootstrapServers, topic.kafka_topic, lines, kafka.properties, retries=args.retries,
                     message_timeout_s=args.timeout, encode=encode)
    for number, why in result.rejected:
        print(f"message {number} rejected: {why}", file=sys.stderr)
    for number, why in result.failed:
        print(f"message {number} NOT published after {args.retries} retries: {why}", file=sys.stderr)
    print(f"published {result.sent} message(s) to {topic.kafka_topic}")
    return 0 if not result.rejected and not result.failed else 1


def cmd_state(args) -> int:
    """suspend / activate: set `state:` in the subscription's YAML file, keeping the rest of the file as it is
    (`herald.config.edit`). Other invalid files do not stop it (they are warnings)."""
    from herald.config.edit import EditRefused, set_state

    config, subscription = _load_lenient(args.conf, args.id)
    state = "SUSPENDED" if args.command == "suspend" else "ACTIVE"
    try:
        after = set_state(args.conf, config, subscription.id, state)
    except ConfigError as error:
        _refuse(args.conf, error)
    except EditRefused as refused:
        print(f"{subscription.id}: could not set state {state} in {refused.path} (the file is left as it was):",
              file=sys.stderr)
        for problem in refused.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    print(f"{subscription.id}: {state} ({config.files[subscription.id]}); a running `herald run` applies this "
          f"within streaming.configPollMs ({after.settings.streaming.configPollMs} ms), no restart needed")
    return 0


def cmd_demo(args) -> int:
    from herald.demo import run_demo

    return run_demo(Path(args.conf))


def cmd_schema(args) -> int:
    from herald.config.schemas import write_schemas

    for path in write_schemas(Path(args.out)):
        print(path)
    return 0


def cmd_jars(args) -> int:
    """Fetch (or show) the JVM parts a local SparkSession of Herald uses."""
    from herald import jars

    if args.action == "fetch":
        try:
            found = jars.fetch()
        except RuntimeError as error:
            print(f"herald jars: {error}", file=sys.stderr)
            return 1
    else:
        found = jars.cached_jars()
    print(json.dumps({"packages": jars.packages(), "directory": str(jars.cache_dir()), "jars": len(found)}, indent=2)
          if args.json else f"{len(found)} jar(s) for {', '.join(jars.packages())} in {jars.cache_dir()}")
    return 0 if found else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="herald", description="Push delivery from Kafka to HTTP subscribers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--conf", default="conf", help="configuration directory (default: conf)")
        sub.set_defaults(handler=handler)
        return sub

    validate = command("validate", cmd_validate, "check every file of a configuration directory (exit 2: invalid)")
    validate.add_argument("--json", action="store_true", help="the result and every problem as JSON")

    run = command("run", cmd_run, "deliver every ACTIVE subscription (one streaming query per Kafka topic, "
                                  "shared by its subscriptions)")
    run.add_argument("--once", action="store_true", help="process what is available now, then exit")
    run.add_argument("--subscription", action="append", metavar="ID", help="only this subscription (repeatable)")
    run.add_argument("--metrics-port", type=int, metavar="P", help="serve Prometheus metrics on the driver on port "
                                                                 "P (default: metrics.prometheusPort)")

    undelivered = command("undelivered", cmd_undelivered, "show the last discarded messages of a subscription")
    undelivered.add_argument("id", help="subscription id: group.topic.name")
    which = undelivered.add_mutually_exclusive_group()
    which.add_argument("--last", action="store_true", help="only the last one (the default)")
    which.add_argument("--limit", type=int, default=1, metavar="N", help="the last N")
    undelivered.add_argument("--json", action="store_true", help="Hermes' JSON format")

    for name, handler, help_text in (("metrics", cmd_metrics, "lifetime metrics of a subscription, the last "
                                                               "minute's per-second figures and the lag"),
                                     ("offsets", cmd_offsets, "delivered-through offsets per partition")):
        sub = command(name, handler, help_text)
        sub.add_argument("id", help="subscription id: group.topic.name")
        sub.add_argument("--json", action="store_true")
        if name == "metrics":
            sub.add_argument("--no-lag", action="store_true", help="do not ask Kafka for the lag")

    trace = command("trace", cmd_trace, "a message's history (trackingAll / discardedOnly); exit 1 when none")
    trace.add_argument("id", help="subscription id: group.topic.name")
    trace.add_argument("message_id", help="the message id (Hermes-Message-Id)")
    trace.add_argument("--json", action="store_true", help="Hermes' tracking fields")

    oauth = command("oauth", cmd_oauth, "OAuth providers of herald.yaml (secrets shown as ******)")
    oauth.add_argument("what", choices=["providers"])
    oauth.add_argument("--json", action="store_true")

    for name, help_text in (("suspend", "set a subscription SUSPENDED in its YAML file (not run; nothing lost)"),
                            ("activate", "set a subscription ACTIVE again; it continues where it stopped")):
        command(name, cmd_state, help_text).add_argument("id", help="subscription id: group.topic.name")

    broker = command("broker", cmd_broker, "the embedded Kafka-protocol broker for local work")
    broker.add_argument("action", choices=["up", "down", "status"])
    broker.add_argument("--data-dir", default=".herald/broker")
    broker.add_argument("--port", type=int, help="default: the port of kafka.bootstrapServers in --conf")
    broker.add_argument("--partitions", type=int, default=3, help="partitions of the topics created on 'up'")

    publish = command("publish", cmd_publish, "publish JSON messages (arguments, --file, or stdin; one per line); "
                                              "encoded as Avro for AVRO topics")
    publish.add_argument("topic", help="topic name: group.topic")
    publish.add_argument("message", nargs="*")
    publish.add_argument("--file", help="a file with one JSON message per line")
    publish.add_argument("--retries", type=int, default=3, help="rounds of retries for failed messages")
    publish.add_argument("--timeout", type=float, default=10.0, help="producer delivery timeout per round, s")

    retransmit = command("retransmit", cmd_retransmit, "deliver a subscription's messages again from a date "
                                                      "(moves its position; running or suspended alike)")
    retransmit.add_argument("id", help="subscription id: group.topic.name")
    retransmit.add_argument("--date", required=True, help="ISO-8601 (UTC without an offset) or -30m / -6h / -2d")
    retransmit.add_argument("--dry-run", action="store_true", help="print the offsets per partition, change nothing")
    retransmit.add_argument("--json", action="store_true")

    maintain = command("maintain", cmd_maintain, "compact the tables and delete files no recent version needs")
    maintain.add_argument("--retention-hours", type=float, metavar="H",
                          help="delete unreferenced files older than H hours (default: "
                               "storage.maintenanceRetentionHours, 168)")
    maintain.add_argument("--json", action="store_true")

    command("demo", cmd_demo, "broker, demo subscriber, sample events and one delivery run, then a report")

    schema = commands.add_parser("schema", help="write JSON Schemas of the configuration files, for editors",
                                 description="write JSON Schemas of herald.yaml, topic and subscription files "
                                             "(generated from Herald's config models), for YAML editors")
    schema.add_argument("--out", default="conf/schemas", help="directory to write them to (default: conf/schemas)")
    schema.set_defaults(handler=cmd_schema)

    jar_parser = commands.add_parser("jars", help="fetch or show the jars of Spark's Kafka source and delta-spark "
                                                  "that a local session of Herald then uses")
    jar_parser.add_argument("action", choices=["fetch", "show"], nargs="?", default="show")
    jar_parser.add_argument("--json", action="store_true")
    jar_parser.set_defaults(handler=cmd_jars)
    return parser


def _join_relative_dates(argv: list[str]) -> list[str]:
    """`--date -6h` as `--date=-6h`: argparse would take the relative date for an option."""
    joined: list[str] = []
    for arg in argv:
        if joined and joined[-1] == "--date" and arg.startswith("-"):
            joined[-1] = f"--date={arg}"
        else:
            joined.append(arg)
    return joined


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(_join_relative_dates(sys.argv[1:] if argv is None else argv))
    logs.configure(args.verbose)
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
