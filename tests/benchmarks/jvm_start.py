"""A new Spark driver's first seconds, with the test suite's JVM options (tests/support/jvm_archive.py) and without.

Each run is a new Python process that builds Herald's local session (the cached jars), creates a Delta table,
appends to it four times, replaces a slice three times and reads it: what a test's `herald run` child process
pays before and around its first round. The runs alternate (without, with), so that load moves both alike.
Last line: `jvm start: ratio R` (median seconds without the options over median seconds with them).

    .venv/bin/python tests/benchmarks/jvm_start.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

_WORKLOAD = """
import json, tempfile, time
t0 = time.monotonic()
from herald.session import get_or_create_session
spark = get_or_create_session("local[2]")
t1 = time.monotonic()
table = tempfile.mkdtemp()
rows = spark.createDataFrame([(i, "s%d" % (i % 3)) for i in range(10)], "i int, s string")
rows.write.format("delta").save(table)
for _ in range(4):
    rows.write.format("delta").mode("append").save(table)
for _ in range(3):
    rows.filter("s = 's1'").write.format("delta").mode("overwrite").option("replaceWhere", "s = 's1'").save(table)
spark.read.format("delta").load(table).count()
t2 = time.monotonic()
print(json.dumps({"session_s": t1 - t0, "tables_s": t2 - t1, "total_s": t2 - t0}))
"""


def run_once(options: str) -> dict:
    env = dict(os.environ, SPARK_SUBMIT_OPTS=options)
    result = subprocess.run([sys.executable, "-c", _WORKLOAD], capture_output=True, text=True, env=env,
                            timeout=600, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from tests.support.jvm_archive import driver_options

    options = driver_options()
    if not options:
        raise SystemExit("no cached jars: run `make install` first")
    print(f"options: {options}")
    totals: dict[str, list[float]] = {"without": [], "with": []}
    for run in range(args.runs):
        for name, value in (("without", ""), ("with", options)):
            figures = run_once(value)
            totals[name].append(figures["total_s"])
            print(f"run {run + 1} {name:7}: session {figures['session_s']:5.1f} s, "
                  f"tables {figures['tables_s']:5.1f} s, total {figures['total_s']:5.1f} s", flush=True)
    without, with_options = statistics.median(totals["without"]), statistics.median(totals["with"])
    print(f"median total: {without:.1f} s without, {with_options:.1f} s with")
    print(f"jvm start: ratio {without / with_options:.2f}")


if __name__ == "__main__":
    main()
