"""The JVM parts of the stack users run: Spark's Kafka source, delta-spark and spark-avro, pinned to the installed
pyspark and delta-spark, fetched once into a cache that Herald's own SparkSession uses.

On a cluster the platform provides them (`spark-submit --packages ...`, or a Databricks runtime). For local runs,
the tests and the demo, `herald jars fetch` (run by `make install`) resolves them with Spark's own resolver
(`spark.jars.packages`: Maven Central through Ivy, as `--packages` does) into the cache directory
(`HERALD_JARS_DIR`, default `~/.cache/herald/jars/<versions>`), and `herald.session` adds the cached
files (`spark.jars`) to a session it builds itself, so that `kafka.connector: auto` and `storage.engine: auto`
pick them. `HERALD_JARS=off` leaves them out (the Python Kafka source and delta-rs then run, as where no jar can
be had).

`make install` fetches them. On the machines measured a delta-spark commit of one round's slice takes seconds
(replaceWhere), against milliseconds with delta-rs, so the tests name their stack (`tests/support/herald_env.py`)
and `herald demo` writes delta-rs tables where herald.yaml leaves the engine to `auto`. Only a JVM Herald
launches gets them: under spark-submit, `--packages` decides (`herald.session`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

SCALA = "2.13"


def versions() -> dict[str, str]:
    """The installed pyspark's and delta-spark's versions, which the jars must match."""
    return {"pyspark": version("pyspark"), "delta-spark": version("delta-spark")}


def packages() -> list[str]:
    """Maven coordinates of the jars, at the installed versions."""
    found = versions()
    return [f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{found['pyspark']}",
            f"io.delta:delta-spark_{SCALA}:{found['delta-spark']}",
            f"org.apache.spark:spark-avro_{SCALA}:{found['pyspark']}"]


def cache_dir() -> Path:
    """One directory per package list (versions, then a digest of the list): checkouts that fetch different lists
    (a branch adding a jar) share the cache root without deleting each other's jars."""
    found = versions()
    root = os.environ.get("HERALD_JARS_DIR") or str(Path.home() / ".cache" / "herald" / "jars")
    name = f"spark-{found['pyspark']}_delta-{found['delta-spark']}"
    digest = hashlib.sha256(",".join(packages()).encode()).hexdigest()[:8]
    return Path(root) / f"{name}_{digest}"


def cached_jars() -> list[str]:
    """The cached jar files (none when they were not fetched, or HERALD_JARS=off)."""
    if os.environ.get("HERALD_JARS", "").lower() == "off":
        return []
    manifest = cache_dir() / "jars.json"
    if not manifest.exists():
        return []
    fetched = json.loads(manifest.read_text())
    if fetched.get("packages") != packages():
        return []  # fetched for another set of packages: fetch again
    return fetched["jars"] if all(Path(jar).exists() for jar in fetched["jars"]) else []


_FETCH = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").appName("herald-jars")
         .config("spark.jars.packages", sys.argv[1]).config("spark.jars.ivy", sys.argv[2])
         .config("spark.ui.enabled", "false").getOrCreate())
spark.stop()
"""


def fetch() -> list[str]:
    """Resolve the jars (and what they need) into the cache, unless they are there; returns their paths."""
    jars = cached_jars()
    if jars:
        return jars
    target = cache_dir()
    shutil.rmtree(target, ignore_errors=True)
    ivy = target / "ivy"
    target.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([sys.executable, "-c", _FETCH, ",".join(packages()), str(ivy)], capture_output=True,
                            text=True, timeout=1800, check=False)
    resolved = sorted(str(path) for path in (ivy / "jars").glob("*.jar")) if (ivy / "jars").is_dir() else []
    if result.returncode != 0 or not resolved:
        shutil.rmtree(target, ignore_errors=True)
        raise RuntimeError(f"could not fetch {', '.join(packages())}: {result.stderr.strip()[-2000:]}")
    (target / "jars.json").write_text(json.dumps({"packages": packages(), "jars": resolved}, indent=2))
    return resolved
