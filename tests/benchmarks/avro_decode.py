"""Decoding an AVRO topic: spark-avro's from_avro (Herald's JVM decoder, herald.avro.jvm) against per-row fastavro,
on the same messages, per CPU-second.

Run:  .venv/bin/python tests/benchmarks/avro_decode.py [--messages 200000] [--python-sample 50000] [--rounds 3]
                                                      [--wire]

The messages: an order record (int id, a nested user record with a ["null", "string"] email and an array of 1-3
address records, a status enum, a double amount, a decimal price, a timestamp-millis, a nullable coupon, an array
of tags, a note), written with fastavro on the driver, held in a cached Spark DataFrame (binary `value`, as
Kafka gives it). With --wire they are in Confluent's wire format with two schema ids (a registry server on
127.0.0.1, tests/support/registry.py), half with each.

- JVM: `herald.avro.jvm.decode(..., "spark")` (from_avro, the JSON text built in the JVM), the sum of the JSON
  texts' lengths and the count of errors aggregated, so every row's JSON is made; CPU time of the whole Spark
  process tree (JVM and Python workers, from /proc), best of `--rounds`.
- per-row fastavro: `AvroDecoder.decode` (fastavro.schemaless_reader and herald.avro.convert.to_json, what
  Herald's Python decoder does for each record) in this process, one thread, on a sample; CPU time of this
  process.
- for reference, Herald's fastavro decoder in Spark (`decode(..., "fastavro")`: mapInArrow over Arrow batches),
  CPU time of the process tree.

Last line: `avro: ratio R per CPU-second` (JVM rows per CPU-second over per-row fastavro's). Asserts nothing.
"""

from __future__ import annotations

import argparse
import decimal
import io
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import fastavro  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from herald.avro.decode import AvroSource  # noqa: E402
from herald.avro.jvm import decode  # noqa: E402
from herald.session import get_or_create_session  # noqa: E402
from tests.benchmarks.filter_throughput import Clock  # noqa: E402

ADDRESS = {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"},
                                                             {"name": "country", "type": "string"}]}
ORDER = {
    "type": "record", "name": "Order", "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [
            {"name": "name", "type": "string"},
            {"name": "email", "type": ["null", "string"], "default": None},
            {"name": "addresses", "type": {"type": "array", "items": ADDRESS}}]}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SENT"]}},
        {"name": "amount", "type": "double"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "coupon", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "note", "type": "string"},
    ],
}
ORDER_V2 = {**ORDER, "fields": ORDER["fields"] + [{"name": "priority", "type": "int", "default": 0}]}
CITIES = [("Krakow", "PL"), ("Berlin", "DE"), ("Paris", "FR"), ("Zürich", "CH"), ("Gdańsk", "PL")]


def order(i: int, rng: random.Random) -> dict:
    return {
        "id": i, "user": {"name": f"user-{i % 997}", "email": None if i % 3 else f"u{i}@example.com",
                          "addresses": [dict(zip(("city", "country"), rng.choice(CITIES)))
                                        for _ in range(1 + i % 3)]},
        "status": ("NEW", "PAID", "SENT")[i % 3], "amount": round(rng.uniform(1, 5000), 2),
        "price": decimal.Decimal(rng.randint(100, 10**7)).scaleb(-2), "created": 1_700_000_000_000 + i,
        "coupon": None if i % 5 else "SPRING", "tags": ["a", "b"][: i % 3], "note": "leave at the door" * (i % 2),
    }


def encoded(n: int, ids: tuple[int, int] | None) -> list[bytes]:
    rng = random.Random(1)
    parsed = [fastavro.parse_schema(ORDER), fastavro.parse_schema(ORDER_V2)]
    out = []
    for i in range(n):
        buffer = io.BytesIO()
        version = i % 2 if ids else 0
        record = order(i, rng) if version == 0 else {**order(i, rng), "priority": i % 7}
        fastavro.schemaless_writer(buffer, parsed[version], record)
        prefix = b"" if ids is None else b"\x00" + ids[version].to_bytes(4, "big")
        out.append(prefix + buffer.getvalue())
    return out


def run(args, source: AvroSource, values: list[bytes]) -> None:
    spark = get_or_create_session(f"local[{os.cpu_count()}]", {"spark.driver.memory": "3g"}, app_name="avro-bench")
    clock = Clock(spark)
    cores = spark.sparkContext.defaultParallelism
    data = spark.createDataFrame([(value,) for value in values], "value binary").repartition(cores).cache()
    total = data.count()
    print(f"load average before the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {total:,} messages of "
          f"{sum(map(len, values)) / len(values):.0f} bytes on average, cached, Spark local[{cores}]"
          f"{', wire format with two schema ids' if source.registry_url else ', a schema file'}", flush=True)

    def spark_decode(decoder: str):
        frame = decode(data, source, decoder)
        return lambda: frame.agg(F.sum(F.length("json")), F.count("decode_error")).first()

    results = {}
    for decoder in ("spark", "fastavro"):
        action = spark_decode(decoder)
        action()  # warm: code generated, Python workers started
        runs = [clock.measure(action, "tree") for _ in range(args.rounds)]
        results[decoder] = (runs[0][0], min(r[1] for r in runs), min(r[2] for r in runs))
        (length, errors), wall, cpu = results[decoder]
        print(f"  {decoder:>8} in Spark: {total / wall:>10,.0f} rows/s wall, {total / cpu:>10,.0f} rows per CPU-second "
              f"(process tree), json chars {length:,}, errors {errors}", flush=True)
    assert results["spark"][0] == results["fastavro"][0], "both decoders must give the same JSON lengths and errors"

    sample = values[: args.python_sample]
    decoder = source.decoder()
    began_cpu, began = time.process_time(), time.perf_counter()
    for value in sample:
        decoder.decode(value)
    cpu, wall = time.process_time() - began_cpu, time.perf_counter() - began
    python_rate = len(sample) / cpu
    print(f"  per-row fastavro (1 thread, {len(sample):,} rows): {len(sample) / wall:>10,.0f} rows/s wall, "
          f"{python_rate:>10,.0f} rows per CPU-second", flush=True)
    jvm_rate = total / results["spark"][2]
    in_spark = total / results["fastavro"][2]
    print(f"  from_avro vs Herald's fastavro decoder in Spark, per CPU-second: {jvm_rate / in_spark:.2f}")
    print(f"avro: ratio {jvm_rate / python_rate:.2f} per CPU-second")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--python-sample", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wire", action="store_true", help="Confluent wire format, two schema ids")
    args = parser.parse_args()
    if not args.wire:
        run(args, AvroSource(schema_json=json.dumps(ORDER)), encoded(args.messages, None))
        return
    from tests.support.registry import SchemaRegistryServer

    with SchemaRegistryServer() as registry:
        ids = (registry.register("bench-value", ORDER), registry.register("bench-value", ORDER_V2))
        run(args, AvroSource(registry_url=registry.url, subject="bench-value"), encoded(args.messages, ids))


if __name__ == "__main__":
    main()
