"""BATCH delivery throughput: Herald end to end against a plain confluent-kafka read of the same topic.

Run:  .venv/bin/python tests/benchmarks/batch_throughput.py [--messages 100000] [--batch-size 100]
      (HERALD_BENCH_LOG=INFO: the Herald runs log their rounds into their logs)

What it does (prints figures, asserts nothing):

1. Starts the same nginx sink as serial_throughput.py (`return 200`, keep-alive, stub_status to count requests;
   a Python sink, loudly, when nginx cannot run) and the embedded broker; produces N JSON messages of ~200
   bytes once to a 4-partition topic, message i to partition i % 4.
2. Runs, each in its own subprocess and in this order: read, Herald, read, Herald, read.
   - read: a confluent-kafka Consumer assigned to the 4 partitions from offset 0, `consume(10000)` in a loop
     until it has N messages (their values touched, nothing else). Timed from creating the consumer to the
     N-th message. The figure is the mean of the three runs.
   - Herald: a conf dir with one subscription, `deliveryType: BATCH`, `batchSize` B (default 100; the other
     batch options at Hermes' defaults, so batchVolume 64000 bytes holds 100 messages of ~200 bytes),
     startingOffsets earliest, no filters; `maxOffsetsPerTrigger` N/4 (four micro-batches);
     `Runner(load_config(conf), spark=session).run(once=True)`. The SparkSession (`local[2]`) is created
     BEFORE the clock starts (JVM start-up is not Herald's delivery). Timed until `run()` returns; the
     metrics table gives messages and batches delivered.
3. Prints each run, the sink's request count per Herald run (about N / B), the rate of the delivery tasks
   alone (N / the summed started_at..finished_at of the rounds in the metrics table: without the query's
   start-up, Spark's scheduling and the table writes), a running job's pace (the messages of the rounds after
   the first / the time from the first round's end to the last one's: the query's start-up and the Python
   workers' first imports left out, scheduling and table writes in), and a last line `batch: ratio R`, R = Herald's
   messages per second (until run() returned) / the read's messages per second (the mean of each).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import serial_throughput as serial  # noqa: E402  (the sink, the broker set-up and the messages)

TOPIC = serial.TOPIC
SUBSCRIPTION = "batch-bench"


# ---------------------------------------------------------------------------------------------------------
# Role: read (a subprocess)
# ---------------------------------------------------------------------------------------------------------
def run_read(args) -> dict:
    from confluent_kafka import Consumer, TopicPartition

    started = time.perf_counter()
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": f"bench-read-{time.time_ns()}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(serial.PARTITIONS)])
    read = volume = 0
    try:
        while read < args.messages:
            for message in consumer.consume(10000, timeout=1.0):
                if message.error() is None:
                    volume += len(message.value())
                    read += 1
        seconds = time.perf_counter() - started
    finally:
        consumer.close()
    return {"seconds": seconds, "messages": read, "bytes": volume}


# ---------------------------------------------------------------------------------------------------------
# Role: herald (a subprocess)
# ---------------------------------------------------------------------------------------------------------
def run_herald(args) -> dict:
    import logging

    from herald.config.loader import load_config
    from herald.engine.runner import Runner
    from herald.session import get_or_create_session
    from herald.storage import DeltaRsStore
    from herald.storage.tables import METRICS
    from tests.support.herald_env import write_conf

    logging.basicConfig(level=os.environ.get("HERALD_BENCH_LOG", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    session_started = time.perf_counter()
    spark = get_or_create_session("local[2]")
    session_s = time.perf_counter() - session_started
    conf = write_conf(
        Path(args.workdir), args.bootstrap, TOPIC,
        {SUBSCRIPTION: {"endpoint": args.url, "deliveryType": "BATCH",
                        "subscriptionPolicy": {"batchSize": args.batch_size}}},
        settings={"streaming": {"maxOffsetsPerTrigger": max(1, args.messages // 4)},
                  "storage": {"engine": "deltalake"}},  # as its figures in README.md were measured
    )
    config = load_config(conf)
    runner = Runner(config, spark=spark)
    started = time.perf_counter()
    code = runner.run(once=True)
    seconds = time.perf_counter() - started
    rows = DeltaRsStore(config.storage_path).read(METRICS, config.subscriptions[0].id).to_pylist()
    spark.stop()
    tasks_s = sum((row["finished_at"] - row["started_at"]).total_seconds() for row in rows
                  if row["read"] and row["started_at"] and row["finished_at"])
    rounds = sorted((row for row in rows if row["read"] and row["finished_at"]), key=lambda row: row["finished_at"])
    steady_s = (rounds[-1]["finished_at"] - rounds[0]["finished_at"]).total_seconds() if len(rounds) > 1 else 0.0
    return {"seconds": seconds, "session_s": session_s, "exit_code": code, "tasks_s": tasks_s,
            "steady_s": steady_s, "steady_messages": sum(row["delivered"] for row in rounds[1:]),
            "delivered": sum(row["delivered"] for row in rows),
            "batches": sum(row["batches_delivered"] or 0 for row in rows),
            "discarded": sum(row["discarded"] for row in rows),
            "rounds": sorted({(row["kind"], row["batch_id"]) for row in rows if row["read"]})}


# ---------------------------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------------------------
def run_child(role: str, args, sink, root: Path, label: str) -> dict:
    slug = label.replace(" ", "-").replace("#", "")
    result_path, log_path = root / f"{slug}.json", root / f"{slug}.log"
    command = [sys.executable, __file__, "--role", role, "--messages", str(args.messages),
               "--batch-size", str(args.batch_size), "--bootstrap", args.bootstrap, "--url", sink.url,
               "--result", str(result_path), "--workdir", str(root / slug)]
    before = sink.count()
    with open(log_path, "wb") as log:
        child = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, timeout=args.timeout)
    requests_seen = sink.count() - before - 1  # the second status request is counted too
    if child.returncode != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        print(f"!! {label} failed (exit {child.returncode}); last lines of its log:\n   " + "\n   ".join(tail))
        return {"label": label, "seconds": float("nan"), "failed_run": True}
    result = json.loads(result_path.read_text())
    result.update(label=label, sink_requests=requests_seen)
    rate = args.messages / result["seconds"]
    extra = (f", {result['delivered']} delivered in {result['batches']} batches, sink counted {requests_seen} "
             f"requests; its delivery tasks took {result['tasks_s']:.1f} s of it; SparkSession start "
             f"{result['session_s']:.1f} s (not counted)") if role == "herald" else ""
    print(f"   {label}: {result['seconds']:.2f} s = {rate:,.0f} messages/s{extra}", flush=True)
    return result


def orchestrate(args) -> None:
    from herald.broker import EmbeddedBroker

    root = Path(tempfile.mkdtemp(prefix="herald-batch-bench-"))
    sink = broker = None
    try:
        sink = serial.start_sink(root, False)
        print(f"sink: {sink.kind} {sink.version} at {sink.url}", flush=True)
        broker = EmbeddedBroker(root / "broker", port=serial.free_port())
        broker.up()
        broker.create_topics({TOPIC: serial.PARTITIONS})
        args.bootstrap = broker.bootstrap_servers
        sizes = serial.produce_messages(args.bootstrap, args.messages, spread=True)
        print(f"produced {args.messages} messages of ~200 bytes to {TOPIC}; records per partition {sizes}",
              flush=True)
        sink.count()
        runs = []
        for role, label in (("read", "read #1"), ("herald", "herald #1"), ("read", "read #2"),
                            ("herald", "herald #2"), ("read", "read #3")):
            print(f"running {label} ...", flush=True)
            runs.append((role, run_child(role, args, sink, root, label)))
        reads = [r["seconds"] for role, r in runs if role == "read" and not r.get("failed_run")]
        heralds = [r for role, r in runs if role == "herald" and not r.get("failed_run")]
        if not reads or not heralds:
            print("batch: ratio - (a run failed)")
            return
        read_rate = args.messages / statistics.mean(reads)
        herald_rate = args.messages / statistics.mean(r["seconds"] for r in heralds)
        complete = all(r["delivered"] == args.messages and r["exit_code"] == 0 for r in heralds)
        print(f"\nplain confluent-kafka read: {read_rate:,.0f} messages/s (mean of {len(reads)} runs)")
        print(f"Herald BATCH (batchSize {args.batch_size}, {sink.kind} sink): {herald_rate:,.0f} messages/s "
              f"(mean of {len(heralds)} runs, until run(once=True) returned)"
              + ("" if complete else "  !! NOT every message was delivered: see the runs above"))
        tasks_rate = args.messages / statistics.mean(r["tasks_s"] for r in heralds)
        print(f"  of which the delivery tasks alone (the metrics table's started_at..finished_at of each round, "
              f"without query start-up and scheduling): {tasks_rate:,.0f} messages/s = "
              f"{tasks_rate / read_rate:.2f} of the read")
        steady = [r for r in heralds if r["steady_s"] > 0]
        if steady:
            steady_rate = sum(r["steady_messages"] for r in steady) / sum(r["steady_s"] for r in steady)
            print(f"  a running job's pace (the rounds after the first: their messages / the time from the first "
                  f"round's end to the last one's, scheduling and table writes included, start-up not): "
                  f"{steady_rate:,.0f} messages/s = {steady_rate / read_rate:.2f} of the read")
        print(f"batch: ratio {herald_rate / read_rate:.2f}")
    finally:
        if sink is not None:
            sink.stop()
        if broker is not None:
            broker.down()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="N messages (default 100000)")
    parser.add_argument("--batch-size", type=int, default=100, help="B: batchSize (default 100)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--role", default="orchestrate", choices=["orchestrate", "read", "herald"],
                        help=argparse.SUPPRESS)
    for internal in ("--bootstrap", "--url", "--result", "--workdir"):
        parser.add_argument(internal, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "orchestrate":
        orchestrate(args)
    else:
        result = {"read": run_read, "herald": run_herald}[args.role](args)
        Path(args.result).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
