"""Benchmark: one delta-spark commit of a round's offsets rows, with Delta's default snapshotPartitions (50) and
with the 2 Herald sets for a local session (`herald.session`); or (`--append`) a replace against an append.

    .venv/bin/python tests/benchmarks/delta_commit.py [--commits 12] [--rows 40] [--append]

One local[2] SparkSession with the cached jars (`herald jars fetch`); two `offsets` tables written through
`SparkDeltaStore.replace` (a `replaceWhere` overwrite of one slice, as the table writer does), the two settings
interleaved commit by commit so that JVM warm-up and machine load fall on both alike. It prints each commit's
time and, as its last line:

    delta commit: first T1 s vs F1 s, warm median T2 s vs F2 s, ratio R

(default vs Herald's setting; R is the warm median's ratio). With `--append` both tables have Herald's setting,
one written with `replace` (as the table writer does), the other with `append` (as a new lease holder does), and
the last line is

    delta append: first T1 s vs A1 s, warm median T2 s vs A2 s, ratio R

Nothing is asserted; it is not collected by pytest.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

SETTING = "spark.databricks.delta.snapshotPartitions"


def offsets_rows(round_number: int, count: int):
    import pyarrow as pa

    from herald.storage.tables import OFFSETS, SCHEMAS

    schema = SCHEMAS[OFFSETS]
    row = {field.name: None for field in schema}  # committed_at: null is fine for a write's cost
    rows = [{**row, "subscription": f"bench.topic.s{n % 10}", "topic": "bench.topic", "partition": n % 4,
             "offset": round_number, "batch_id": round_number, "writer": "bench"} for n in range(count)]
    return pa.Table.from_pylist(rows, schema=schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=12, help="commits per setting (default 12)")
    parser.add_argument("--rows", type=int, default=40, help="offsets rows per commit (default 40)")
    parser.add_argument("--append", action="store_true", help="replace against append (both with Herald's 2)")
    args = parser.parse_args()

    from herald.session import get_or_create_session
    from herald.storage.delta_spark import SparkDeltaStore
    from herald.storage.store import Slice
    from herald.storage.tables import OFFSETS

    spark = get_or_create_session("local[2]", {}, app_name="herald-delta-commit-bench")
    root = Path(tempfile.mkdtemp(prefix="herald-delta-commit-"))
    settings = ({"replace": "2", "append": "2"} if args.append
                else {"Delta's default 50": "50", "Herald's 2": "2"})
    stores = {name: SparkDeltaStore(spark, str(root / str(place))) for place, name in enumerate(settings)}
    times: dict[str, list[float]] = {name: [] for name in settings}
    try:
        for number in range(args.commits):
            for name, value in settings.items():
                spark.conf.set(SETTING, value)
                rows = offsets_rows(number, args.rows)
                began = time.perf_counter()
                if name == "append":
                    stores[name].append(OFFSETS, rows)
                else:
                    stores[name].replace(OFFSETS, rows, Slice("bench", number))
                times[name].append(time.perf_counter() - began)
        for name, values in times.items():
            print(f"{name:<20}" + " ".join(f"{value:6.2f}" for value in values), flush=True)
        (default, herald) = (times[name] for name in settings)
        warm_default, warm_herald = statistics.median(default[2:]), statistics.median(herald[2:])
        label = "append" if args.append else "commit"
        print(f"delta {label}: first {default[0]:.1f} s vs {herald[0]:.1f} s, warm median {warm_default:.2f} s vs "
              f"{warm_herald:.2f} s, ratio {warm_default / warm_herald:.2f}")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
