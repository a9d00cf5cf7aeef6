"""Commands for local work and setup: the embedded broker, publishing test messages, the demo, the JVM jars
and the configuration files' JSON Schemas."""

from __future__ import annotations

import sys
from pathlib import Path

from herald.cli.loading import load
from herald.cli.output import print_json


def _broker_for(args):
    from herald.broker import DEFAULT_PORT, EmbeddedBroker

    port = args.port
    if port is None and args.conf and Path(args.conf, "herald.yaml").exists():
        servers = load(args.conf).settings.kafka.bootstrapServers.split(",")[0]
        port = int(servers.rsplit(":", 1)[1]) if ":" in servers else DEFAULT_PORT
    return EmbeddedBroker(Path(args.data_dir), port=port or DEFAULT_PORT)


def cmd_broker(args) -> int:
    from herald.broker import BrokerError

    broker = _broker_for(args)
    try:
        if args.action == "up":
            broker.up()
            if args.conf and Path(args.conf, "herald.yaml").exists():
                config = load(args.conf)
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
    from herald.kafka_properties import for_librdkafka
    from herald.publish import publish

    config = load(args.conf)
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
    result = publish(kafka.bootstrapServers, topic.kafka_topic, lines, for_librdkafka(kafka.properties),
                     retries=args.retries, message_timeout_s=args.timeout, encode=encode)
    for number, why in result.rejected:
        print(f"message {number} rejected: {why}", file=sys.stderr)
    for number, why in result.failed:
        print(f"message {number} NOT published after {args.retries} retries: {why}", file=sys.stderr)
    print(f"published {result.sent} message(s) to {topic.kafka_topic}")
    return 0 if not result.rejected and not result.failed else 1


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
    if args.json:
        print_json({"packages": jars.packages(), "directory": str(jars.cache_dir()), "jars": len(found)})
    else:
        print(f"{len(found)} jar(s) for {', '.join(jars.packages())} in {jars.cache_dir()}")
    return 0 if found else 1
