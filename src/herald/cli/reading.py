"""Commands that read and change nothing: undelivered, metrics, trace, offsets (from the tables, `herald.readout`)
and oauth providers (from herald.yaml). They never start Spark, and they load the configuration leniently."""

from __future__ import annotations

import sys

from herald.cli.loading import load_herald_yaml, load_lenient
from herald.cli.output import iso, print_json, print_rows


def cmd_undelivered(args) -> int:
    from herald.readout import undelivered

    config, subscription = load_lenient(args.conf, args.id)
    rows = undelivered(config, subscription, 1 if args.last else args.limit)
    if args.json:
        print_json(rows[0] if args.last and rows else rows)
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

    config, subscription = load_lenient(args.conf, args.id)
    result = metrics(config, subscription, with_lag=not args.no_lag)
    if args.json:
        print_json(result)
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

    config, subscription = load_lenient(args.conf, args.id)
    steps = trace(config, subscription, args.message_id)
    if args.json:
        print_json(steps)
    elif not steps:
        print(f"{subscription.id}: no tracked history of message {args.message_id} "
              f"(trackingMode: {subscription.trackingMode})", file=sys.stderr)
    for step in [] if args.json else steps:
        status = step["status"] + (f" {step['httpStatus']}" if step["httpStatus"] is not None else "")
        reason = f"  {step['reason']}" if step["reason"] else ""
        print(f"{iso(step['timestamp'], 'milliseconds')}  {step['topicName']}[{step['partition']}]@{step['offset']}  "
              f"{status}{reason}")
    return 0 if steps else 1


def cmd_offsets(args) -> int:
    from herald.readout import last_retransmission, offsets

    config, subscription = load_lenient(args.conf, args.id)
    rows = offsets(config, subscription)
    last = last_retransmission(config, subscription)
    if args.json:
        print_json(rows)
    elif rows:
        print_rows(rows, ["topic", "partition", "offset", "batchId", "committedAt"])
    else:
        print(f"{args.id}: no offsets yet (the subscription has not run)")
    if last is not None and not args.json:
        moved = ", ".join(f"{p['partition']}: {p['from']} -> {p['to']}" for p in last["partitions"])
        print(f"last retransmission: from {iso(last['date'])}, asked by {last['requestedBy']} at "
              f"{iso(last['recordedAt'])}; partition {moved}")
    return 0


def cmd_oauth(args) -> int:
    """`herald oauth providers`: herald.yaml's OAuth providers, secrets shown as ******."""
    config = load_herald_yaml(args.conf)
    providers = [{**provider.model_dump(exclude={"clientSecret", "tls"}), "clientSecret": "******",
                  "tls": provider.tls.shown() if provider.tls is not None else None}  # as in force: paths absolute
                 for provider in config.settings.oauthProviders]
    if args.json:
        print_json(providers)
    elif providers:
        print_rows(providers, ["name", "tokenEndpoint", "clientId", "clientSecret", "tokenRequestInitialDelay",
                               "tokenRequestMaxDelay", "requestTimeout", "socketTimeout"])
    else:
        print(f"{args.conf}: no oauthProviders in herald.yaml")
    return 0
