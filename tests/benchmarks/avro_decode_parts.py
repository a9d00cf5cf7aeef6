"""Where the time of spark-avro's path goes: from_avro alone, with the bytes-left check, with the JSON text, against
Spark's own to_json of the decoded record and the whole `herald.avro.jvm.decode`.

The order records of `avro_decode.py` (a schema file), cached in Spark local[2]; each part is an aggregate over
all the rows, run with `.first()` (a new query each time: Spark 4 re-runs a `collect()` of the same DataFrame
from the shuffle files of the run before, which times nothing), best of 3 after a warm-up, wall seconds. Last line:
`avro parts: json R x from_avro` (the JSON text's seconds over from_avro's).

    .venv/bin/python tests/benchmarks/avro_decode_parts.py [--messages 200000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pyspark.sql import functions as F  # noqa: E402

from herald.avro.decode import AvroSource  # noqa: E402
from herald.avro.jvm import _DECODED, SchemaPlan, decode  # noqa: E402
from herald.avro.render import finish_json  # noqa: E402
from herald.session import get_or_create_session  # noqa: E402
from tests.benchmarks.avro_decode import ORDER, encoded  # noqa: E402


def best_of(frame, rounds: int = 3) -> float:
    frame.first()  # warm: code generated
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        frame.first()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args()
    spark = get_or_create_session("local[2]", {"spark.driver.memory": "3g"}, app_name="avro-parts")
    data = spark.createDataFrame([(v,) for v in encoded(args.messages, None)], "value binary").repartition(2).cache()
    total = data.count()
    plan = SchemaPlan.of(json.dumps(ORDER))
    value, decoded = F.col("value"), F.col(_DECODED)
    staged = data.select("value", plan.from_avro(value).alias(_DECODED))
    parts = {
        "read the cached values": data.agg(F.sum(F.length("value"))),
        "from_avro": staged.agg(F.count(decoded.getField("id"))),
        "from_avro + bytes-left check": staged.select(plan.error(decoded, value).alias("e")).agg(F.count("e")),
        "from_avro + JSON text": staged.select(plan.json(_DECODED).alias("j"))
        .select(finish_json(F.col("j")).alias("j")).agg(F.sum(F.length("j"))),
        "from_avro + Spark's to_json": staged.select(F.to_json(decoded, {"ignoreNullFields": "false"}).alias("j"))
        .agg(F.sum(F.length("j"))),
        "decode() (all of it)": decode(data, AvroSource(schema_json=json.dumps(ORDER)), "spark")
        .agg(F.sum(F.length("json")), F.count("decode_error")),
    }
    seconds = {}
    for name, frame in parts.items():
        seconds[name] = best_of(frame)
        print(f"{name:30} {seconds[name]:6.2f} s  {total / seconds[name]:>12,.0f} rows/s wall", flush=True)
    json_s = seconds["from_avro + JSON text"] - seconds["from_avro"]
    print(f"avro parts: json {json_s / seconds['from_avro']:.2f} x from_avro")


if __name__ == "__main__":
    main()
