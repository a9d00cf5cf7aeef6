"""Throughput of compiled filters vs per-row Python, on the same messages (JSON, and Avro topics).

Run:  .venv/bin/python tests/benchmarks/filter_throughput.py [--variant json|avro|targets|both]
                                                            [--messages 1000000] [--python-sample 50000] [--rounds 3]

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
 (a) Herald's way, as its streaming query does for an AVRO topic (herald.engine.round.projection.project):
     mapInArrow(decode_batches(AvroSource(schema_json=...))) decodes each record once with fastavro into JSON
     text, then filter_column(rules, "json", "headers") as a projected column -> count (an empty headers array
     rides along);
 (b) the per-row Python way, in one driver thread on a sample (rows/s extrapolated): fastavro.schemaless_reader
     and herald.filters.evaluate (the reference avropath evaluator) on the decoded dict.
Decoding is Python work in BOTH paths, so the Avro ratio is bounded by the decode cost: the 10x target is for the
JSON variant's compiled-vs-Python evaluation. The breakdown of (a) shows decode alone, the filters alone (on the
decoded JSON, cached) and decode + filters; CPU time for (a) is the whole Spark process tree (JVM and its Python
workers, from /proc).

Targets variant (not part of `both`): the cost of one topic's subscriptions evaluated together with
herald.filters.targets.with_targets, for S = 1, 10 and 50 rule sets over the same cached JSON messages (each with
a `kind` no set asks for). Set i is `$.kind` equal to a value of its own, plus `$.user.country ~ PL|DE` (the same
rule in every set), so nothing matches and every row pays for every set. Rows with a target are counted (zero),
which evaluates `targets` for every row. Prints rows/s and rows per JVM CPU-second for each S (best of
interleaved rounds), filter_column with set 0 for reference, and the time ratio S=50 / S=1 (the fan-out budget
is 1.5x).
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

from herald.filters import FilterRule, evaluate, filter_column  # noqa: E402
from herald.filters.compile import python_udf_column  # noqa: E402
from herald.filters.targets import with_targets  # noqa: E402
from herald.session import get_or_create_session  # noqa: E402

RULES = [
    FilterRule("jsonpath", "PL|DE", path="$.user.country"),
    FilterRule("jsonpath", "GB", path="$.user.addresses[*].country", matching_strategy="any"),
    FilterRule("jsonpath", r"user1[0-9]*@example\.(com|org)", path="$.user.email"),
]

COUNTRIES = ["PL", "DE", "GB", "FR"]


def herald_matches(frame, condition):
    """Rows passing `condition`, evaluated the way Herald's query does: as a projected `matched` column (a
    projection lets Spark evaluate a JSON parse shared by several rules once; a bare filter would not)."""
    return frame.select(condition.alias("matched")).where("matched")


def messages(spark, rows: int, kind: bool = False):
    """ROWS JSON messages of about 330 bytes; every 4th user is in each country, addresses vary by row. With
    `kind`, each starts with a `"kind": "event.<n>"` member (n < 20)."""
    def pick(values, modulo):
        return F.element_at(F.array(*[F.lit(v) for v in values]), (F.col("id") % modulo + 1).cast("int"))
    head, head_args = ('{"kind": "event.%d", ', [F.col("id") % 20]) if kind else ("{", [])
    text = F.format_string(
        head + '"id": %d, "type": "order.%s", "amount": %d.25, "user": {"name": "user%d", '
        '"email": "user%d@example.%s", "country": "%s", "addresses": [{"country": "%s", "city": "c%d"}, '
        '{"country": "%s", "city": "x"}]}, "tags": ["a", "b", "c"], '
        '"note": "lorem ipsum dolor sit amet, consectetur adipiscing elit"}',
        *head_args, F.col("id"), pick(["created", "paid", "sent"], 3), F.col("id") % 1000, F.col("id") % 997,
        F.col("id") % 997, pick(["com", "org", "net"], 3), pick(COUNTRIES, 4), pick(["PL", "DE", "GB"], 3),
        F.col("id") % 7, pick(["CZ", "CZ", "CZ", "CZ", "GB"], 5),
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

    def tree_cpu(self) -> float:
        """CPU time of the JVM and all its descendants (Spark's Python daemon and workers), children that have
        exited and been waited for included (cutime + cstime of their parents)."""
        parents, times = {}, {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # the process ended while we looked
                continue
            pid = int(stat.parent.name)
            parents[pid] = int(fields[1])
            times[pid] = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
        tree, frontier = {self.jvm_pid}, [self.jvm_pid]
        while frontier:
            pid = frontier.pop()
            children = [child for child, parent in parents.items() if parent == pid and child not in tree]
            tree.update(children)
            frontier.extend(children)
        return sum(times.get(pid, 0) for pid in tree) / self.ticks

    def measure(self, action, jvm: bool | str) -> tuple[object, float, float]:
        """jvm: True for the JVM's CPU time, "tree" for the JVM and its Python workers, False for this process."""
        cpu = self.tree_cpu if jvm == "tree" else self.jvm_cpu if jvm else time.process_time
        wall0, cpu0 = time.perf_counter(), cpu()
        result = action()
        return result, time.perf_counter() - wall0, cpu() - cpu0


def best(clock: Clock, action, jvm: bool | str, rounds: int = 3) -> tuple[object, float, float]:
    runs = [clock.measure(action, jvm) for _ in range(rounds)]
    return runs[0][0], min(run[1] for run in runs), min(run[2] for run in runs)


def json_variant(spark, clock: Clock, args) -> None:
    cores = spark.sparkContext.defaultParallelism
    data = messages(spark, args.messages).repartition(cores).cache()
    total = data.count()
    size = data.select(F.avg(F.length("value"))).first()[0]
    print(f"\n=== JSON variant ===\nload average before the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          "(other work on the machine lowers the wall-clock figures; CPU-time figures are steadier)")
    print(f"messages: {total:,} JSON values of {size:.0f} bytes on average, cached, Spark local[{cores}]")
    for rule in RULES:
        print(f"  filter: {rule.path} ~ /{rule.matcher}/ ({rule.strategy})")

    compiled = filter_column(RULES)
    herald_matches(data, compiled).limit(10).count()  # warm-up: code generation, JIT
    sample = [row.value for row in data.limit(args.python_sample).collect()]
    python_run = per_row_python(sample)
    compiled_runs, python_runs = [], []
    for _ in range(args.rounds):  # interleaved, best of each: both sides see the same machine
        compiled_runs.append(clock.measure(lambda: herald_matches(data, compiled).count(), jvm=True))
        python_runs.append(clock.measure(python_run, jvm=False))
    compiled_matches = compiled_runs[0][0]
    compiled_wall = min(run[1] for run in compiled_runs)
    compiled_cpu = min(run[2] for run in compiled_runs)
    python_matches = python_runs[0][0]
    python_wall = min(run[1] for run in python_runs)
    python_cpu = min(run[2] for run in python_runs)
    compiled_sample_matches = herald_matches(spark.createDataFrame([(value,) for value in sample], "value binary"),
                                             compiled).count()

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
    data.unpersist()
    udf_data.unpersist()


# ------------------------------------------------------------------------------------------------ Avro variant

AVRO_SCHEMA = {
    "type": "record", "name": "Order", "namespace": "bench.herald",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "type", "type": "string"},
        {"name": "status",
         "type": {"type": "enum", "name": "Status", "symbols": ["CREATED", "PAID", "SENT", "CANCELLED"]}},
        {"name": "amount", "type": "double"},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [
            {"name": "name", "type": "string"},
            {"name": "email", "type": ["null", "string"], "default": None},
            {"name": "country", "type": "string"},
            {"name": "addresses", "type": {"type": "array", "items": {
                "type": "record", "name": "Address",
                "fields": [{"name": "city", "type": "string"}, {"name": "country", "type": "string"}]}}},
        ]}},
        {"name": "coupon", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "note", "type": "string"},
    ],
}
AVRO_SCHEMA_JSON = json.dumps(AVRO_SCHEMA)

AVRO_RULES = [
    FilterRule("avropath", "user[0-9]*[02468]", path=".user.name"),
    FilterRule("avropath", "GB", path=".user.addresses[*].country", matching_strategy="any"),
    FilterRule("avropath", r"user1[0-9]*@example\.(com|org)", path=".user.email"),
]

HEADERS_DDL = "array<struct<key:string,value:binary>>"


def avro_record(i: int) -> dict:
    """Order i: every 10th has no email (the union's null), every 2nd no coupon, 1-3 addresses."""
    address_countries = ["PL", "DE", "GB", "CZ", "CZ"]
    return {
        "id": i,
        "type": ("order.created", "order.paid", "order.sent")[i % 3],
        "status": ("CREATED", "PAID", "SENT", "CANCELLED")[i % 4],
        "amount": i % 1000 + 0.25,
        "user": {
            "name": f"user{i % 997}",
            "email": None if i % 10 == 0 else f"user{i % 997}@example.{('com', 'org', 'net')[i % 3]}",
            "country": COUNTRIES[i % 4],
            "addresses": [{"city": f"c{(i + k) % 7}", "country": address_countries[(i + 2 * k) % 5]}
                          for k in range(1 + i % 3)],
        },
        "coupon": None if i % 2 else f"C{i % 100}",
        "tags": ["a", "b", "c"],
        "note": "lorem ipsum dolor sit amet",
    }


def avro_encode_batches(batches):
    """mapInArrow over spark.range: the Avro binary of record `id`, plus an empty headers array."""
    import fastavro
    import pyarrow as pa

    schema = fastavro.parse_schema(json.loads(AVRO_SCHEMA_JSON))
    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    for batch in batches:
        values = []
        for i in batch.column("id").to_pylist():
            out = io.BytesIO()
            fastavro.schemaless_writer(out, schema, avro_record(i))
            values.append(out.getvalue())
        yield pa.RecordBatch.from_arrays(
            [pa.array(values, pa.binary()), pa.array([[]] * len(values), headers_type)], names=["value", "headers"])


def avro_messages(spark, rows: int):
    return spark.range(rows).mapInArrow(avro_encode_batches, f"value binary, headers {HEADERS_DDL}")


def herald_decoded(frame):
    """What Herald's query does to an AVRO topic's records before the filters (engine.query._decoded)."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    from herald.avro.decode import DECODED_FIELDS, AvroSource, decode_batches

    schema = StructType(frame.schema.fields + [StructField(f.name, from_arrow_type(f.type)) for f in DECODED_FIELDS])
    return frame.mapInArrow(decode_batches(AvroSource(schema_json=AVRO_SCHEMA_JSON)), schema)


def avro_per_row_python(values: list[bytes], filters: bool = True):
    """The straightforward Python way: fastavro.schemaless_reader + herald.filters.evaluate, one message at a time
    (filters=False: decode only). Returns a function that evaluates all values and returns the number of matches."""
    import fastavro

    from herald.avro.convert import plain_schema

    schema = fastavro.parse_schema(plain_schema(json.loads(AVRO_SCHEMA_JSON)))
    reader = fastavro.schemaless_reader

    if not filters:
        return lambda: sum(reader(io.BytesIO(value), schema) is not None for value in values)
    return lambda: sum(evaluate(AVRO_RULES, reader(io.BytesIO(value), schema)) for value in values)


def decode_stages(clock: Clock, values: list[bytes], rounds: int) -> list[tuple[str, float]]:
    """CPU microseconds per record of the parts of Herald's decode stage, run here on plain lists (no Spark)."""
    import fastavro
    import pyarrow as pa

    from herald.avro.convert import plain_schema, to_json
    from herald.avro.decode import AvroSource, decode_batches

    source = AvroSource(schema_json=AVRO_SCHEMA_JSON)
    schema = fastavro.parse_schema(plain_schema(json.loads(AVRO_SCHEMA_JSON)))
    records = [fastavro.schemaless_reader(io.BytesIO(value), schema) for value in values]
    batches = [pa.RecordBatch.from_arrays([pa.array(values[start:start + 10_000], pa.binary())], names=["value"])
               for start in range(0, len(values), 10_000)]  # Spark's default arrow.maxRecordsPerBatch
    parts = [
        # results dropped as they come: holding 50k decoded dicts would time the garbage collector too
        ("fastavro read", lambda: sum(fastavro.schemaless_reader(io.BytesIO(value), schema) is not None
                                      for value in values)),
        ("to_json", lambda: sum(len(to_json(record)) for record in records)),
        ("decode_batches in all", lambda: sum(1 for _ in decode_batches(source)(iter(batches)))),
    ]
    return [(label, best(clock, action, jvm=False, rounds=rounds)[2] / len(values) * 1e6) for label, action in parts]


def avro_variant(spark, clock: Clock, args) -> None:
    cores = spark.sparkContext.defaultParallelism
    data = avro_messages(spark, args.messages).repartition(cores).cache()
    total = data.count()
    size = data.select(F.avg(F.length("value"))).first()[0]
    print(f"\n=== Avro variant ===\nload average before the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          "(other work on the machine lowers the wall-clock figures; CPU-time figures are steadier)")
    print(f"messages: {total:,} Avro binary values of {size:.0f} bytes on average (fastavro schemaless_writer), "
          f"cached, Spark local[{cores}]")
    for rule in AVRO_RULES:
        print(f"  filter: avropath {rule.path} ~ /{rule.matcher}/ ({rule.strategy})")
    print("NOTE: decoding is Python work in both paths (fastavro in Spark's Python workers for Herald, in the driver "
          "thread for per-row Python),\n      so the Avro ratio is bounded by the decode cost; the 10x target is for "
          "the JSON variant's compiled-vs-Python filter evaluation.")

    compiled = filter_column(AVRO_RULES, "json", "headers")
    decoded = herald_decoded(data)
    herald_run = lambda: herald_matches(decoded, compiled).count()  # noqa: E731
    sample = [row.value for row in data.limit(args.python_sample).collect()]
    # Herald's way on the sample: the match check, and the warm-up (Python workers, code generation, JIT). Not
    # a limit() on the decoded frame: that closes the Python workers' pipes early (BrokenPipeError noise).
    sample_frame = spark.createDataFrame([(value, []) for value in sample], f"value binary, headers {HEADERS_DDL}")
    herald_sample_matches = herald_matches(herald_decoded(sample_frame), compiled).count()
    python_run = avro_per_row_python(sample)
    herald_runs, python_runs = [], []
    for _ in range(args.rounds):  # interleaved, best of each: both sides see the same machine
        herald_runs.append(clock.measure(herald_run, jvm="tree"))
        python_runs.append(clock.measure(python_run, jvm=False))
    herald_matched = herald_runs[0][0]
    herald_wall = min(run[1] for run in herald_runs)
    herald_cpu = min(run[2] for run in herald_runs)
    python_matches = python_runs[0][0]
    python_wall = min(run[1] for run in python_runs)
    python_cpu = min(run[2] for run in python_runs)

    # where the time goes in (a)
    _, scan_wall, _ = best(clock, lambda: data.filter(F.length("value") > 0).count(), jvm="tree", rounds=args.rounds)
    _, decode_wall, decode_cpu = best(clock, lambda: decoded.count(), jvm="tree", rounds=args.rounds)
    decoded_cache = decoded.select("json", "headers").cache()
    decoded_cache.count()
    _, filter_wall, filter_cpu = best(clock, lambda: herald_matches(decoded_cache, compiled).count(), jvm="tree",
                                      rounds=args.rounds)
    decoded_cache.unpersist()
    python_decode = avro_per_row_python(sample, filters=False)
    _, python_decode_wall, python_decode_cpu = best(clock, python_decode, jvm=False, rounds=args.rounds)
    stages = decode_stages(clock, sample, args.rounds)

    herald_rate, python_rate = total / herald_wall, len(sample) / python_wall
    herald_per_cpu, python_per_cpu = total / herald_cpu, len(sample) / python_cpu
    print("\nbreakdown of (a), Herald's way (best of each; CPU = JVM + Spark's Python workers):")
    print(f"  scan only (no decode, no filter):        {total / scan_wall:>12,.0f} rows/s")
    print(f"  decode only (mapInArrow -> count):       {total / decode_wall:>12,.0f} rows/s "
          f"({decode_wall:.2f} s), {total / decode_cpu:,.0f} rows per CPU-second")
    print(f"  3 filters only (on the decoded JSON, cached): {total / filter_wall:>7,.0f} rows/s "
          f"({filter_wall:.2f} s), {total / filter_cpu:,.0f} rows per CPU-second")
    print(f"  decode + 3 filters:                      {herald_rate:>12,.0f} rows/s "
          f"({herald_wall:.2f} s), {herald_per_cpu:,.0f} rows per CPU-second; decode is "
          f"{decode_wall / herald_wall:.0%} of the wall time")
    print("  inside the decode, per record, in this process on the sample (1 thread, CPU time): "
          + ", ".join(f"{label} {micros:.1f} us" for label, micros in stages))
    print(f"breakdown of (b), per-row Python: decode only (fastavro.schemaless_reader) "
          f"{len(sample) / python_decode_wall:,.0f} rows/s, decode + evaluate {python_rate:,.0f} rows/s; decode is "
          f"{python_decode_wall / python_wall:.0%} of the time")

    print(f"\n(a) Herald (mapInArrow decode + compiled avropath, Spark {cores} cores): {herald_rate:>10,.0f} rows/s "
          f"({herald_wall:.2f} s for {total:,} rows, {herald_matched:,} matches), "
          f"{herald_per_cpu:,.0f} rows per CPU-second (JVM + Python workers)")
    print(f"(b) per-row Python (fastavro + herald.filters.evaluate, 1 thread): {python_rate:>10,.0f} rows/s, "
          f"{python_per_cpu:,.0f} rows per CPU-second; measured on a sample of {len(sample):,} rows "
          f"({python_wall:.2f} s) and extrapolated")
    agree = "agree" if herald_sample_matches == python_matches else "DISAGREE"
    print(f"matches on the sample of {len(sample):,}: per-row Python {python_matches:,}, "
          f"Herald {herald_sample_matches:,} ({agree})")
    print(f"load average after the run: {os.getloadavg()[0]:.2f}")
    print(f"\nAvro ratio Herald / per-row Python, wall clock: {herald_rate / python_rate:.1f}x "
          f"({cores} Spark cores vs 1 Python thread)")
    print(f"Avro ratio per CPU-second (one core against one core): {herald_per_cpu / python_per_cpu:.1f}x")
    print("  (bounded by decoding, Python work in both paths; the 10x target is the JSON variant's)")
    data.unpersist()


# ------------------------------------------------------------------------------------------------ Targets variant

FANOUT_SIZES = (1, 10, 50)


def fanout_rule_sets(count: int) -> list[list[FilterRule]]:
    """`count` rule sets that match none of the messages (whose kinds are event.0 to event.19)."""
    return [[FilterRule("jsonpath", f"subscription-{i}", path="$.kind"),
             FilterRule("jsonpath", "PL|DE", path="$.user.country")] for i in range(count)]


def targets_variant(spark, clock: Clock, args) -> None:
    cores = spark.sparkContext.defaultParallelism
    data = (messages(spark, args.messages, kind=True).repartition(cores)
            .withColumn("headers", F.lit(None).cast(HEADERS_DDL)).cache())
    total = data.count()
    print(f"\n=== Targets variant ===\nload average before the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} "
          f"CPUs\nmessages: {total:,} cached JSON values, Spark local[{cores}]; set i: $.kind ~ subscription-i "
          "(a literal: an equality test) AND $.user.country ~ PL|DE (a regex, the same rule in every set)")

    def count_targets(frame):
        return frame.where(F.size("targets") > 0).count()

    runs = {size: with_targets(data, fanout_rule_sets(size), "value", "headers") for size in FANOUT_SIZES}
    reference = herald_matches(data, filter_column(fanout_rule_sets(1)[0]))
    for frame in runs.values():
        assert count_targets(frame) == 0  # warm-up (code generation, JIT), and nothing matches
    times = {size: [] for size in [*FANOUT_SIZES, "filter_column"]}
    for _ in range(args.rounds):  # interleaved: every S sees the same machine
        for size, frame in runs.items():
            times[size].append(clock.measure(lambda frame=frame: count_targets(frame), jvm=True))
        times["filter_column"].append(clock.measure(lambda: reference.count(), jvm=True))
    wall = {key: min(run[1] for run in measured) for key, measured in times.items()}
    cpu = {key: min(run[2] for run in measured) for key, measured in times.items()}
    print(f"\nfilter_column, set 0 alone (reference): {total / wall['filter_column']:>10,.0f} rows/s, "
          f"{total / cpu['filter_column']:>10,.0f} rows per JVM CPU-second")
    for size in FANOUT_SIZES:
        print(f"with_targets, S={size:<3}: {total / wall[size]:>10,.0f} rows/s ({wall[size]:.2f} s), "
              f"{total / cpu[size]:>10,.0f} rows per JVM CPU-second")
    first, last = FANOUT_SIZES[0], FANOUT_SIZES[-1]
    print(f"load average after the run: {os.getloadavg()[0]:.2f}")
    print(f"\ntime ratio S={last} / S={first}: {wall[last] / wall[first]:.2f}x wall clock, "
          f"{cpu[last] / cpu[first]:.2f}x JVM CPU (budget 1.5x)")
    data.unpersist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=["json", "avro", "targets", "both"], default="json")
    parser.add_argument("--messages", "--rows", dest="messages", type=int, default=1_000_000)
    parser.add_argument("--python-sample", type=int, default=50_000)
    parser.add_argument("--udf-rows", type=int, default=200_000, help="JSON variant: rows for the pandas UDF run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = get_or_create_session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "3g"},
                                   app_name="herald-filter-bench")
    spark.sparkContext.setLogLevel("ERROR")
    clock = Clock(spark)
    if args.variant in ("json", "both"):
        json_variant(spark, clock, args)
    if args.variant in ("avro", "both"):
        avro_variant(spark, clock, args)
    if args.variant == "targets":
        targets_variant(spark, clock, args)
    spark.stop()


if __name__ == "__main__":
    main()
