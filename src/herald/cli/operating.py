"""Commands that check, run and steer delivery: validate, run, suspend/activate, retransmit, maintain.

validate and run refuse an invalid configuration; suspend/activate and retransmit load it leniently (other
files' problems are warnings). Each handler parses, calls the one function that does the work (the engine's
runner, `herald.config.edit`, `herald.engine.upkeep.moves`, `herald.storage.maintenance`) and prints its result.
"""

from __future__ import annotations

import sys
from pathlib import Path

from herald.cli.loading import load, load_herald_yaml, load_lenient, refuse, subscription_of
from herald.cli.output import print_json, print_rows
from herald.config import ConfigError, load_config


def cmd_validate(args) -> int:
    if args.json:
        return _validate_json(args.conf)
    config = load(args.conf)
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
        print_json({"valid": False, "problems": [asdict(p) for p in error.problems]})
        return 2
    print_json({"valid": True, "topics": len(config.topics), "subscriptions": len(config.subscriptions),
                "active": sum(1 for s in config.subscriptions if s.active), "notes": list(config.notes),
                "problems": []})
    return 0


def cmd_run(args) -> int:
    config = load(args.conf)  # refuse an invalid configuration before loading the engine (and Spark)
    for subscription_id in args.subscription or []:
        subscription_of(config, subscription_id)
    from herald.engine.runner import Runner
    from herald.session import ClassicSessionRequired

    try:
        return Runner(config, only=args.subscription, metrics_port=args.metrics_port).run(once=args.once)
    except ClassicSessionRequired as refused:  # where it runs must change: 2, as for an invalid configuration
        print(f"not started: {refused}", file=sys.stderr)
        return 2


def cmd_state(args) -> int:
    """suspend / activate: set `state:` in the subscription's YAML file, keeping the rest of the file as it is
    (`herald.config.edit`). Other invalid files do not stop it (they are warnings)."""
    from herald.config.edit import EditRefused, set_state

    config, subscription = load_lenient(args.conf, args.id)
    state = "SUSPENDED" if args.command == "suspend" else "ACTIVE"
    try:
        after = set_state(args.conf, config, subscription.id, state)
    except ConfigError as error:
        refuse(args.conf, error)
    except EditRefused as refused:
        print(f"{subscription.id}: could not set state {state} in {refused.path} (the file is left as it was):",
              file=sys.stderr)
        for problem in refused.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    print(f"{subscription.id}: {state} ({config.files[subscription.id]}); a running `herald run` applies this "
          f"within streaming.configPollMs ({after.settings.streaming.configPollMs} ms), no restart needed")
    return 0


def cmd_retransmit(args) -> int:
    from herald.engine.upkeep.moves import MoveError, parse_date, retransmit
    from herald.readout import table_store
    from herald.source.kafka_offsets import KafkaOffsetsError
    from herald.storage.tables import epoch_ms

    config, subscription = load_lenient(args.conf, args.id)
    try:
        date = parse_date(args.date)
    except MoveError as error:
        print(f"{args.id}: {error}", file=sys.stderr)
        return 2
    kafka_topic = config.topic_of(subscription).kafka_topic
    try:
        current, move = retransmit(table_store(config), config.settings.kafka.client_config(), subscription.id,
                                   kafka_topic, date, dry_run=args.dry_run)
    except KafkaOffsetsError as error:
        print(f"{args.id}: {error}", file=sys.stderr)
        return 1
    partitions = [{"partition": p, "from": current.get(p), "to": offset}
                  for p, offset in sorted(move.to_offsets.items())]
    if args.json:
        print_json({"subscription": subscription.id, "topic": kafka_topic, "date": epoch_ms(date),
                    "dryRun": args.dry_run, "partitions": partitions})
        return 0
    verb = "would move" if args.dry_run else "moved"
    print(f"{subscription.id} {verb} to the first messages at or after {date.isoformat()}"
          f"{' (dry run: nothing changed)' if args.dry_run else ''}:")
    print_rows(partitions, ["partition", "from", "to"])
    if not args.dry_run:
        print("a running `herald run` picks the move up within streaming.configPollMs; otherwise the next run "
              "(or the activation of a suspended subscription) delivers from there")
    return 0


def cmd_maintain(args) -> int:
    from dataclasses import asdict

    from herald.readout import table_store
    from herald.storage.lease import LeaseHeld
    from herald.storage.maintenance import MIN_RUNNING_RETENTION_HOURS, maintain_storage

    config = load_herald_yaml(args.conf)
    settings = config.settings.storage
    hours = args.retention_hours if args.retention_hours is not None else settings.maintenanceRetentionHours
    try:
        done = maintain_storage(table_store(config), hours, history=settings.history_retention())
    except LeaseHeld as held:
        print(f"not maintained: a retention under {MIN_RUNNING_RETENTION_HOURS:g} h could delete files a running "
              f"job still reads ({held}); stop it first, or keep --retention-hours at "
              f"{MIN_RUNNING_RETENTION_HOURS:g} or more")
        return 1
    results = done.results
    if done.stopped:
        print(f"the pass stopped after {len(results)} table(s): its lease of the storage path was running out; "
              "run it again for the others", file=sys.stderr)
        return 1
    if args.json:
        print_json([asdict(result) for result in results])
        return 0
    for result in results:
        rows = "" if result.rows_deleted is None else f"{result.rows_deleted} history row(s) deleted; "
        print(f"{result.table:>12}  {rows}{result.files_before} file(s) -> {result.files_after}: "
              f"{result.files_removed} compacted into {result.files_added}, {result.files_deleted} deleted (older "
              f"than {hours:g} h); log {result.log_files_before} file(s) -> {result.log_files_after}")
    return 0
