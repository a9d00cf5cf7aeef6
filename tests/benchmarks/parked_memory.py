"""Benchmark: the driver's memory per parked message (issue 32, item 16).

    .venv/bin/python tests/benchmarks/parked_memory.py [--messages N] [--body-bytes B]

A subscriber down for an hour at 400 messages a second parks about 1.4 M messages. Each variant runs in a
process of its own, parks N messages of B-byte bodies for one subscription (in calls of 1,000, as rounds park
them) and reports its resident memory (RSS) growth, then asks what a retry round asks (the next due messages, the
next due time, the count) and times it:

- baseline: the messages in a dict on the heap, as the retry driver kept them before (`ParkedMessage` per key);
- herald: `herald.engine.triggers.parked.ParkedRegistry`, the SQLite file on the driver's disk the retry driver
  uses now.

Last lines:

    parked: driver MiB per 100k parked M (target 20); baseline B
    parked: a round's reads ms R at N parked against S at 10k (flat: R about S)

Nothing is asserted; it is not collected by pytest. Takes about a minute for 1 M on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROUND = 1000


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _messages(count: int, body_bytes: int, start: int = 0):
    from herald.delivery.message import Record, RetryState

    now = int(time.time() * 1000)
    body = b"x" * body_bytes
    for offset in range(start, start + count):
        yield (Record(partition=offset % 12, offset=offset, timestamp_ms=now, message_id=f"id-{offset:012d}",
                      body=body, key=b"key"),
               RetryState(attempts=3, first_read_ms=now, due_ms=now + offset % 60_000, backoff_s=0.1,
                          last_status=503, last_reason="Message sending failed with status code:503"))


def run_variant(variant: str, count: int, body_bytes: int) -> dict:
    from herald.engine.triggers.parked import ParkedMessage, ParkedRegistry

    before = _rss_mib()
    if variant == "baseline":
        parked: dict = {}
        for record, state in _messages(count, body_bytes):
            parked[(record.partition, record.offset)] = ParkedMessage(record, state, "topic")
        started = time.perf_counter()
        due = sorted((m for m in parked.values()), key=lambda m: m.state.due_ms)[:ROUND]
        next_due = min(m.state.due_ms for m in parked.values())
        read_ms = (time.perf_counter() - started) * 1000
        size = len(parked)
    else:
        registry = ParkedRegistry()
        batch = []
        for item in _messages(count, body_bytes):
            batch.append(item)
            if len(batch) == ROUND:
                registry.put("s", "topic", batch)
                batch = []
        registry.put("s", "topic", batch)
        started = time.perf_counter()
        due = registry.due("s", 2**62, ROUND, untried_only=False)
        next_due = registry.next_due("s", False)
        read_ms = (time.perf_counter() - started) * 1000
        size = registry.count("s")
    grown = _rss_mib() - before
    assert size == count and len(due) == min(ROUND, count) and next_due is not None
    return {"variant": variant, "count": count, "rss_mib": grown, "read_ms": read_ms}


def _in_process(variant: str, count: int, body_bytes: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", variant, "--messages", str(count),
                          "--body-bytes", str(body_bytes)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body-bytes", type=int, default=200)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(args.child, args.messages, args.body_bytes)))
        return
    base = _in_process("baseline", args.messages, args.body_bytes)
    herald = _in_process("herald", args.messages, args.body_bytes)
    small = _in_process("herald", 10_000, args.body_bytes)
    for result in (base, herald, small):
        print(f"{result['variant']:>8} {result['count']:>9,} parked: RSS +{result['rss_mib']:.1f} MiB, "
              f"a round's reads {result['read_ms']:.1f} ms")
    per_100k = herald["rss_mib"] / args.messages * 100_000
    print(f"parked: driver MiB per 100k parked {per_100k:.1f} (target 20); baseline "
          f"{base['rss_mib'] / args.messages * 100_000:.1f}")
    print(f"parked: a round's reads ms {herald['read_ms']:.1f} at {args.messages:,} parked against "
          f"{small['read_ms']:.1f} at 10k (flat: about equal)")


if __name__ == "__main__":
    main()
