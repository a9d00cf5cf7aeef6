"""Throughput of compiled filters vs per-row Python, on the same messages (JSON, and Avro topics).

Run:  .venv/bin/python tests/benchmarks/filter_throughput.py [--variant json|avro|both] [--messages 1000000]
                                                            [--python-sample 50000] [--rounds 3]

JSON variant (the default; `--rows` is an alias of `--messages`):

Three filters (a plain path, a wildcard with matchingStrategy any, a regex) are applied with
`herald.filters.filter_column` to ROWS JSON messages held in a cached Spark DataFrame (binary `value`, as Kafka
gives it), and the matches are counted. The per-row Python side parses each message with `json.loads`,
evaluates the same paths with jsonpath-ng and matches with `re.fullmatch`, in one driver thread, on a sample
(rows/s extrapolated). The two are measured in interleaved rounds, best of each; CPU time (this process,
or Spark's JVM read from /proc) is printed too, since wall clock suffers when the machine is shared. For
reference it also times Herald's Python fallback (pandas UDF on Spark's workers) on a slice. Prints figures;
asserts nothing. The driver gets 3g so that the cached messages do not crowd the heap.

Avro variant: the same number of messages as Avro binary (fastavro schemaless_writer, generated in Spark's Python
workers and cached): an order record with a nested user record (name, a ["null", "string"] email, an array of
1-3 address records with city/country), a status enum, an amount double, a nullable coupon, tags and a note.
Three avropath filters (a plain path, a wildcard with any, a regex on the nullable email) are evaluated
 (a) Herald's way, as its streaming query does for an AVRO topic (herald.engine.query._decoded):
     mapInArrow(decode_batches(AvroSource(schema_json=...))) decodes each record once with fastavro into JSON
     text, then where(filter_column(rules, "json", "headers")) -> count (an empty headers array rides along);
 (b) the per-row Python way, in one driver thread on a sample (rows/s extrapolated): fastavro.schemaless_reader
     and herald.filters.evaluate (the reference avropath evaluator) on the decoded dict.
Decoding is Python work in BOTH paths, so the Avro ratio is bounded by the decode cost: the 10x target is for the
JSON variant's compiled-vs-Python evaluation. The breakdown of (a) shows decode alone, the filters alone (on the
decoded JSON, cached) and decode + filters; CPU time for (a) is the whole Spark process tree (JVM and its Python
workers, from /proc).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from pyspark.sql import functions as F  # noqa: E402

from herald.engine.session import get_or_create_session  # noqa: E402
from herald.filters import FilterRule, evaluate, filter_column  # noqa: E402
from herald.filters.compile import python_udf_column  # noqa: E402

RULES = [
    FilterRule("jsonpath", "PL|DE", path="$.user.country"),
    FilterRule("jsonpath", "GB", path="$.user.addresses[*].country", matching_strategy="any"),
    FilterRule("jsonpath", r"user1[0-9]*@example\.(com|org)", path="$.user.email"),
]

COUNTRIES = ["PL", "DE", "GB", "FR"]


def messages(spark, rows: int):
    """ROWS JSON messages of about 330 bytes; every 4th user is in each country, addresses vary by row."""
    pick = lambda values, modulo: F.element_at(F.array(*[F.lit(v) for v in values]), (F.col("id") % modulo + 1).cast("int"))  # noqa: E731
    text = F.format_string(
        '{"id": %d, "type": "order.%s", "amount": %d.25, "user": {"name": "user%d", "email": "user%d@example.%s", '
        '"country": "%s", "addresses": [{"country": "%s", "city": "c%d"}, {"country": "%s", "city": "x"}]}, '
        '"tags": ["a", "b", "c"], "note": "lorem ipsum dolor sit amet, consectetur adipiscing elit"}',
        F.col("id"), pick(["created", "paid", "sent"], 3), F.col("id") % 1000, F.col("id") % 997, F.col("id") % 997,
        pick(["com", "org", "net"], 3), pick(COUNTRIES, 4), pick(["PL", "DE", "GB"], 3), F.col("id") % 7,
        pick(["CZ", "CZ", "CZ", "CZ", "GB"], 5),
    )
    return spark.range(rows).select(F.encode(text, "utf-8").alias("value"))


def per_row_python(values: list[bytes]):
    """The straightforward Python way: json.loads + jsonpath-ng + re.fullmatch, one message at a time.
    Returns a function that evaluates all values and returns the number of matches."""
    from jsonpath_ng.ext import parse

    compiled = [(parse(rule.path), re.compile(rule.matcher), rule.strategy) for rule in RULES]

    def text(value):
        if isinstance(value, str):
            return value
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        return json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)

    def passes(raw: bytes) -> bool:
        try:
            document = json.loads(raw)
        except ValueError:
            return False
        for expression, pattern, strategy in compiled:
            found = [text(match.value) for match in expression.find(document)]
            hits = [value is not None and pattern.fullmatch(value) is not None for value in found]
            if not found or not (any(hits) if strategy == "any" else all(hits)):
                return False
        return True

    return lambda: sum(passes(value) for value in values)


class Clock:
    """Wall time, and CPU time of this process or of Spark's JVM (read from /proc: robust to a busy machine)."""

    def __init__(self, spark):
        self.jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
        self.ticks = os.sysconf("SC_CLK_TCK")

    def jvm_cpu(self) -> float:
        fields = Path(f"/proc/{self.jvm_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.ticks  # utime + stime

    def measure(self, action, jvm: bool) -> tuple[object, float, float]:
        cpu = self.jvm_cpu if jvm else time.process_time
        wall0, cpu0 = time.perf_counter(), cpu()
        result = action()
        return result, time.perf_counter() - wall0, cpu() - cpu0


def best(clock: Clock, action, jvm: bool, rounds: int = 3) -> tuple[object, float, float]:
    runs = [clock.measure(action, jvm) for _ in range(rounds)]
    return runs[0][0], min(run[1] for run in runs), min(run[2] for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--python-sample", type=int, default=50_000)
    parser.add_argument("--udf-rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = get_or_create_session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "3g"},
                                   app_name="herald-filter-bench")
    spark.sparkContext.setLogLevel("ERROR")
    clock = Clock(spark)
    cores = spark.sparkContext.defaultParallelism
    data = messages(spark, args.rows).repartition(cores).cache()
    total = data.count()
    size = data.select(F.avg(F.length("value"))).first()[0]
    print(f"load average before the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          "(other work on the machine lowers the wall-clock figures; CPU-time figures are steadier)")
    print(f"messages: {total:,} JSON values of {size:.0f} bytes on average, cached, Spark local[{cores}]")
    for rule in RULES:
        print(f"  filter: {rule.path} ~ /{rule.matcher}/ ({rule.strategy})")

    compiled = filter_column(RULES)
    data.filter(compiled).limit(10).count()  # warm-up: code generation, JIT
    sample = [row.value for row in data.limit(args.python_sample).collect()]
    python_run = per_row_python(sample)
    compiled_runs, python_runs = [], []
    for _ in range(args.rounds):  # interleaved, best of each: both sides see the same machine
        compiled_runs.append(clock.measure(lambda: data.filter(compiled).count(), jvm=True))
        python_runs.append(clock.measure(python_run, jvm=False))
    compiled_matches = compiled_runs[0][0]
    compiled_wall = min(run[1] for run in compiled_runs)
    compiled_cpu = min(run[2] for run in compiled_runs)
    python_matches = python_runs[0][0]
    python_wall = min(run[1] for run in python_runs)
    python_cpu = min(run[2] for run in python_runs)
    compiled_sample_matches = spark.createDataFrame([(value,) for value in sample], "value binary") \
        .filter(compiled).count()

    _, scan_wall, _ = best(clock, lambda: data.filter(F.length("value") > 0).count(), jvm=True)
    print(f"\nscan only (no filter):            {total / scan_wall:>12,.0f} rows/s")
    for rule in RULES:
        _, wall, cpu = best(clock, lambda rule=rule: data.filter(filter_column([rule])).count(), jvm=True)
        print(f"  one filter {rule.path} ({rule.strategy}): {total / wall:>12,.0f} rows/s, "
              f"{total / cpu:>10,.0f} rows per CPU-second")

    compiled_rate, python_rate = total / compiled_wall, len(sample) / python_wall
    compiled_per_cpu, python_per_cpu = total / compiled_cpu, len(sample) / python_cpu
    print(f"compiled, 3 filters (Spark, {cores} cores): {compiled_rate:>10,.0f} rows/s "
          f"({compiled_wall:.2f} s for {total:,} rows, {compiled_matches:,} matches), "
          f"{compiled_per_cpu:,.0f} rows per JVM CPU-second")
    print(f"per-row Python (json + jsonpath-ng + re, 1 thread): {python_rate:>10,.0f} rows/s, "
          f"{python_per_cpu:,.0f} rows per CPU-second; measured on a sample of {len(sample):,} rows "
          f"({python_wall:.2f} s) and extrapolated; matches {python_matches:,} "
          f"(compiled on the same sample: {compiled_sample_matches:,})")

    fallback = None
    for rule in RULES:
        column = python_udf_column(rule, F.col("value"))
        fallback = column if fallback is None else fallback & column
    udf_data = data.limit(args.udf_rows).cache()
    udf_rows = udf_data.count()
    udf_matches, udf_wall, _ = best(clock, lambda: udf_data.filter(fallback).count(), jvm=True, rounds=1)
    print(f"Herald's Python fallback (pandas UDF, {cores} cores, for reference): {udf_rows / udf_wall:>9,.0f} rows/s "
          f"on {udf_rows:,} rows ({udf_matches:,} matches)")

    print(f"load average after the run: {os.getloadavg()[0]:.2f}")
    print(f"\nratio compiled / per-row Python, wall clock: {compiled_rate / python_rate:.1f}x "
          f"({cores} Spark cores vs 1 Python thread; target >= 10x)")
    print(f"ratio per CPU-second (one core against one core): {compiled_per_cpu / python_per_cpu:.1f}x")
    spark.stop()


if __name__ == "__main__":
    main()
