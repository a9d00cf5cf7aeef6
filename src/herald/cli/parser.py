"""The `herald` command line: the sub-commands, declared by group as their handlers are (`herald.cli`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from herald.cli.discovering import cmd_endpoints
from herald.cli.local import cmd_broker, cmd_demo, cmd_jars, cmd_publish, cmd_schema
from herald.cli.operating import (
    cmd_maintain,
    cmd_retransmit,
    cmd_run,
    cmd_state,
    cmd_validate,
)
from herald.cli.priority import cmd_priority, cmd_unpin
from herald.cli.reading import (
    cmd_metrics,
    cmd_oauth,
    cmd_offsets,
    cmd_trace,
    cmd_undelivered,
)

SUBSCRIPTION_ID = "subscription id: group.topic.name"


class Commands:
    """The sub-commands being declared; `add` makes one whose parsed arguments go to `handler`."""

    def __init__(self, parser: argparse.ArgumentParser):
        self._subparsers = parser.add_subparsers(dest="command", required=True)

    def add(self, name: str, handler: Callable[[argparse.Namespace], int], help_text: str, *,
            description: str | None = None, conf: bool = True) -> argparse.ArgumentParser:
        """`conf`: the command takes `--conf DIR` (default: conf), the configuration directory."""
        sub = self._subparsers.add_parser(name, help=help_text, description=description or help_text)
        if conf:
            sub.add_argument("--conf", default="conf", help="configuration directory (default: conf)")
        sub.set_defaults(handler=handler)
        return sub


def _hours(text: str) -> float:
    """A number of hours, 0 or more (`herald maintain --retention-hours`)."""
    try:
        hours = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of hours: {text!r}") from None
    if not hours >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more hours, not {text}")
    return hours


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="herald", description="Push delivery from Kafka to HTTP subscribers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = Commands(parser)
    _operating_commands(commands)
    _reading_commands(commands)
    _endpoint_commands(commands)
    _local_commands(commands)
    return parser


def _operating_commands(commands: Commands) -> None:
    """validate, run, suspend, activate, retransmit, maintain (`herald.cli.operating`)."""
    validate = commands.add("validate", cmd_validate,
                            "check every file of a configuration directory (exit 2: invalid)")
    validate.add_argument("--json", action="store_true", help="the result and every problem as JSON")

    run = commands.add("run", cmd_run, "deliver every ACTIVE subscription (one streaming query per Kafka topic, "
                                       "shared by its subscriptions)")
    run.add_argument("--once", action="store_true", help="process what is available now, then exit")
    run.add_argument("--subscription", action="append", metavar="ID", help="only this subscription (repeatable)")
    run.add_argument("--metrics-port", type=int, metavar="P", help="serve Prometheus metrics on the driver on port "
                                                                 "P (default: metrics.prometheusPort)")

    for name, help_text in (("suspend", "set a subscription SUSPENDED in its YAML file (not run; nothing lost)"),
                            ("activate", "set a subscription ACTIVE again; it continues where it stopped")):
        commands.add(name, cmd_state, help_text).add_argument("id", help=SUBSCRIPTION_ID)

    retransmit = commands.add("retransmit", cmd_retransmit, "deliver a subscription's messages again from a "
                                                           "date (moves its position; running or suspended alike)")
    retransmit.add_argument("id", help=SUBSCRIPTION_ID)
    retransmit.add_argument("--date", required=True, help="ISO-8601 (UTC without an offset) or -30m / -6h / -2d")
    retransmit.add_argument("--dry-run", action="store_true", help="print the offsets per partition, change nothing")
    retransmit.add_argument("--json", action="store_true")

    maintain = commands.add("maintain", cmd_maintain, "compact the tables and delete files no recent version needs")
    maintain.add_argument("--retention-hours", type=_hours, metavar="H",
                          help="delete unreferenced files older than H hours (default: "
                               "storage.maintenanceRetentionHours, 168); under 1 only while no job runs on the "
                               "tables (a job's reads may still need the files a compaction has just replaced), "
                               "and no job may start until the pass ends")
    maintain.add_argument("--json", action="store_true")


def _reading_commands(commands: Commands) -> None:
    """undelivered, metrics, offsets, trace, oauth (`herald.cli.reading`)."""
    undelivered = commands.add("undelivered", cmd_undelivered,
                               "show the last discarded messages of a subscription")
    undelivered.add_argument("id", help=SUBSCRIPTION_ID)
    which = undelivered.add_mutually_exclusive_group()
    which.add_argument("--last", action="store_true", help="only the last one (the default)")
    which.add_argument("--limit", type=int, default=1, metavar="N", help="the last N")
    undelivered.add_argument("--json", action="store_true", help="Hermes' JSON format")

    for name, handler, help_text in (("metrics", cmd_metrics, "metrics totals of a subscription (over "
                                                               "storage.historyRetentionHours), the last minute's "
                                                               "per-second figures and the lag"),
                                     ("offsets", cmd_offsets, "delivered-through offsets per partition")):
        sub = commands.add(name, handler, help_text)
        sub.add_argument("id", help=SUBSCRIPTION_ID)
        sub.add_argument("--json", action="store_true")
        if name == "metrics":
            sub.add_argument("--no-lag", action="store_true", help="do not ask Kafka for the lag")

    trace = commands.add("trace", cmd_trace,
                         "a message's history (trackingAll / discardedOnly); exit 1 when none")
    trace.add_argument("id", help=SUBSCRIPTION_ID)
    trace.add_argument("message_id", help="the message id (Hermes-Message-Id)")
    trace.add_argument("--json", action="store_true", help="Hermes' tracking fields")

    oauth = commands.add("oauth", cmd_oauth, "OAuth providers of herald.yaml (secrets shown as ******)")
    oauth.add_argument("what", choices=["providers"])
    oauth.add_argument("--json", action="store_true")


def _endpoint_commands(commands: Commands) -> None:
    """unpin, priority (`herald.cli.priority`) and endpoints (`herald.cli.discovering`): each takes a
    subscription id and --json."""
    for name, handler, help_text in (
            ("unpin", cmd_unpin, "move a pinned subscription's pin to its next endpoint (running, suspended or "
                                 "offline alike)"),
            ("priority", cmd_priority, "a subscription's priority group: policy, pinned endpoint (password masked), "
                                       "pin id, pinned since"),
            ("endpoints", cmd_endpoints, "a subscription's endpoints now: its discovered set and the lookup that "
                                         "named each (passwords masked)")):
        sub = commands.add(name, handler, help_text)
        sub.add_argument("id", help=SUBSCRIPTION_ID)
        sub.add_argument("--json", action="store_true")


def _local_commands(commands: Commands) -> None:
    """broker, publish, demo, schema, jars (`herald.cli.local`); schema and jars take no --conf."""
    broker = commands.add("broker", cmd_broker, "the embedded Kafka-protocol broker for local work")
    broker.add_argument("action", choices=["up", "down", "status"])
    broker.add_argument("--data-dir", default=".herald/broker")
    broker.add_argument("--port", type=int, help="default: the port of kafka.bootstrapServers in --conf")
    broker.add_argument("--partitions", type=int, default=3, help="partitions of the topics created on 'up'")

    publish = commands.add("publish", cmd_publish, "publish JSON messages (arguments, --file, or stdin; one per "
                                                   "line); encoded as Avro for AVRO topics")
    publish.add_argument("topic", help="topic name: group.topic")
    publish.add_argument("message", nargs="*")
    publish.add_argument("--file", help="a file with one JSON message per line")
    publish.add_argument("--retries", type=int, default=3, help="rounds of retries for failed messages")
    publish.add_argument("--timeout", type=float, default=10.0, help="producer delivery timeout per round, s")

    commands.add("demo", cmd_demo, "broker, demo subscriber, sample events and one delivery run, then a report")

    schema = commands.add("schema", cmd_schema, "write JSON Schemas of the configuration files, for editors",
                          description="write JSON Schemas of herald.yaml, topic and subscription files (generated "
                                      "from Herald's config models), for YAML editors", conf=False)
    schema.add_argument("--out", default="conf/schemas", help="directory to write them to (default: conf/schemas)")

    jars = commands.add("jars", cmd_jars, "fetch or show the jars of Spark's Kafka source and delta-spark that a "
                                          "local session of Herald then uses", conf=False)
    jars.add_argument("action", choices=["fetch", "show"], nargs="?", default="show")
    jars.add_argument("--json", action="store_true")



def join_relative_dates(argv: list[str]) -> list[str]:
    """`--date -6h` as `--date=-6h`: argparse would take the relative date for an option."""
    joined: list[str] = []
    for arg in argv:
        if joined and joined[-1] == "--date" and arg.startswith("-"):
            joined[-1] = f"--date={arg}"
        else:
            joined.append(arg)
    return joined
