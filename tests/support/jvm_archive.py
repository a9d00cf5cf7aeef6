"""Faster JVM starts for the test suite: a class-data-sharing archive of the Spark driver's classes, and C1 only.

Every `herald run` a test starts as a process of its own (kill -9, Ctrl-C, spark-submit) starts a new Spark driver
JVM, which loads and compiles Spark's and delta-spark's classes again: on 2 cores a new session with its first
Delta commits took 35-38 s, of which 22 s with an archive of those classes (`-XX:SharedArchiveFile`, JDK 13+) and the
JIT's first tier only (`-XX:TieredStopAtLevel=1`: the tests' data is small, C2's compile time is not paid back; not
for the test workers' own sessions, which live for the whole run: `for_a_long_lived_driver`).
Measured in tests/benchmarks/README.md (`jvm_start.py`).

The options reach every driver JVM the tests start through SPARK_SUBMIT_OPTS, which spark-submit (and so PySpark's
own gateway launch) adds to the driver's command line, not to its launcher's. The archive is built once per Java
runtime and set of Spark jars (`archive_path`) by a spark-submit run of `_WARM_UP` that dumps the classes it loaded
at exit. A JVM whose class path differs from the archive's ignores it and starts as before; its CDS warning
is silenced. Users' jobs get none of this: it is the suite's, set in tests/conftest.py.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

C1_ONLY = "-XX:TieredStopAtLevel=1"
FAST_START_OPTIONS = (C1_ONLY, "-Xlog:cds=off,cds+dynamic=off")
BUILD_TIMEOUT_S = 600.0

# What a test's job does first: a session with the cached jars, Delta tables created, appended to, replaced in and
# read, and a Python (Arrow) task, so that their classes are in the archive.
_WARM_UP = """
import sys, tempfile
from herald.session import get_or_create_session
spark = get_or_create_session("local[2]")
table = tempfile.mkdtemp()
rows = spark.createDataFrame([(i, "s%d" % (i % 3)) for i in range(10)], "i int, s string")
rows.write.format("delta").save(table)
rows.write.format("delta").mode("append").save(table)
rows.filter("s = 's1'").write.format("delta").mode("overwrite").option("replaceWhere", "s = 's1'").save(table)
spark.read.format("delta").load(table).mapInArrow(lambda batches: batches, "i int, s string").count()
spark.sql(f"SHOW TBLPROPERTIES delta.`{table}`").collect()
spark.stop()
"""


@contextmanager
def for_a_long_lived_driver():
    """SPARK_SUBMIT_OPTS without C1 while a driver that lives for the whole run starts (a test worker's session):
    its hot code runs for many minutes, where the full JIT pays back; the archive still speeds its start."""
    options = os.environ.get("SPARK_SUBMIT_OPTS")
    if options is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = " ".join(o for o in options.split() if o != C1_ONLY)
    try:
        yield
    finally:
        if options is not None:
            os.environ["SPARK_SUBMIT_OPTS"] = options


def _java() -> str:
    """The `java` Spark's launcher runs: JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def archive_path() -> Path:
    """The archive beside the cached jars, named after what the JVM checks it against: the Java runtime, and the
    path, size and time of every jar of Spark's class path (a new virtualenv, or another checkout sharing the jar
    cache, gets its own archive instead of one the JVM would ignore)."""
    import pyspark

    from herald.jars import cache_dir

    java = subprocess.run([_java(), "-version"], capture_output=True, text=True, check=False).stderr
    jars = sorted((Path(pyspark.__file__).resolve().parent / "jars").glob("*.jar"))
    stamp = "\n".join([java, *(f"{jar}:{jar.stat().st_size}:{jar.stat().st_mtime_ns}" for jar in jars)])
    return cache_dir() / f"test-driver-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}.jsa"


def driver_options() -> str:
    """SPARK_SUBMIT_OPTS for the suite: the archive (built now when missing) and C1; "" when the jars were not
    fetched or anything here fails (the JVMs then start as they always did, only slower)."""
    from herald.jars import cached_jars

    try:
        jars = cached_jars()
        if not jars:
            return ""
        archive = archive_path()
        failed = archive.with_suffix(".failed")  # a build that made no archive is not tried at every run
        if not archive.exists() and not failed.exists():
            _build(archive, failed, jars)
    except Exception as error:  # noqa: BLE001 - a faster start is not worth a failed test run
        print(f"no JVM class archive for the tests: {error!r}", file=sys.stderr)
        return ""
    options = list(FAST_START_OPTIONS)
    if archive.exists():
        options.insert(0, f"-XX:SharedArchiveFile={archive}")
    return " ".join(options)


def _build(archive: Path, failed: Path, jars: list[str]) -> None:
    """Dump the warm-up's classes into `archive` (written under a temporary name, then renamed: two suites
    starting at once each build one, and the last rename wins); `failed` records a build that made none."""
    import pyspark

    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    with tempfile.TemporaryDirectory(dir=archive.parent) as work:
        partial = Path(work) / archive.name
        script = Path(work) / "warm_up.py"
        script.write_text(_WARM_UP)
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
                   SPARK_SUBMIT_OPTS=f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial}")
        build = subprocess.Popen([str(spark_submit), "--master", "local[2]", "--jars", ",".join(jars), str(script)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                 start_new_session=True)
        try:
            _, errors = build.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(build.pid, signal.SIGKILL)  # the JVM and the Python driver it started
            build.communicate()
            raise
        if build.returncode == 0 and partial.exists():
            os.replace(partial, archive)
        else:  # the suite runs anyway, only slower: say why
            failed.write_text(errors[-4000:])
            print(f"no JVM class archive for the tests (spark-submit exit {build.returncode}; {failed}):\n"
                  f"{errors[-2000:]}", file=sys.stderr)
