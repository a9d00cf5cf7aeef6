"""Building the SparkSession Herald runs in, and probing which optional JVM parts it has.

Under `spark-submit` (or on Databricks) the session and its master come from the platform, with the jars the
platform provides; `herald run` builds a local one from `spark.master` and `spark.conf` in herald.yaml, with the
jars `herald jars fetch` cached (`herald.jars`: Spark's Kafka source and delta-spark), when it did.

delta-spark writes only in a session with Delta's SQL extension and catalog. Both are static settings, read when
the session is built: when spark-submit put Delta's jars on the classpath (`--packages`/`--jars`) and its command
line did not name them, Herald adds them to the session it builds, so that operations.md's `spark-submit --packages`
line works as it stands (an extension the command line names is kept, Delta's is added after it; a catalog it
names is left alone). Databricks' session exists before Herald runs and is already configured for Delta.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

DEFAULT_LOCAL_MASTER = "local[*]"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
SPARK_CATALOG = "spark.sql.catalog.spark_catalog"

# Settings that keep a local session quiet and small; any of them can be overridden in herald.yaml.
_LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "60s",
    "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN",
    # One projection evaluates every subscription's filter: with tens of subscriptions its generated method
    # passes the JVM's 8000-byte JIT limit and would run interpreted; past this size Spark splits it instead.
    "spark.sql.codegen.hugeMethodLimit": "8000",
    # delta-spark rebuilds a table's state from its log in this many tasks at every commit (default 50): Herald's
    # tables are small, and on 2 local cores 50 tasks made a commit 2.4x slower once warm and the first commits
    # 10x slower (tests/benchmarks/README.md, "delta-spark commits").
    "spark.databricks.delta.snapshotPartitions": "2",
}


def get_or_create_session(master: str | None = None, conf: Mapping[str, str] | None = None, app_name: str = "herald"):
    """Return the active SparkSession, or build one.

    `master` is used only when no master is configured yet (spark-submit sets one). In local mode Spark's
    Python workers must run this interpreter, so PYSPARK_PYTHON defaults to it there, through
    `herald-spark-python` when installed beside it (see `spark_python_worker`). Raises `ClassicSessionRequired`
    when the session would be a Spark Connect one (`refuse_spark_connect_request`); the caller checks the session
    it gets with `require_classic_session`.
    """
    from pyspark.sql import SparkSession

    refuse_spark_connect_request(conf or {})
    active = SparkSession.getActiveSession()
    if active is None and os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        active = SparkSession.builder.getOrCreate()  # the runtime's own session, never a local one of Herald's
    if active is not None:
        warn_about_speculation(active)
        return active
    submitted = _submitted_conf() if _launched_by_spark_submit() else {}
    effective_master = platform_master(submitted, master)
    builder = SparkSession.builder.appName(app_name)
    if "spark.master" not in submitted:
        builder = builder.master(effective_master)
    settings = dict(_LOCAL_DEFAULTS) if effective_master.startswith("local") else {}
    settings.update(conf or {})
    settings.update(delivery_settings(submitted, settings))
    for key, value in settings.items():
        builder = builder.config(key, value)
    if effective_master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", _worker_python())
        if not _launched_by_spark_submit():  # its JVM runs already: jars named now would not be on its classpath
            for key, value in _jar_settings(conf or {}).items():
                builder = builder.config(key, value)
    if _launched_by_spark_submit():
        for key, value in _delta_session_settings(settings, submitted, _delta_on_classpath()).items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


CLASSIC_SESSION_NEEDED = (
    "Herald needs a classic Spark session with its JVM: a dedicated (single-user) access cluster on Databricks; "
    "Spark Connect sessions (standard access mode, serverless) are not supported")


class ClassicSessionRequired(RuntimeError):
    """The session is (or would be) a Spark Connect one. Herald's delivery needs the driver's JVM (py4j): Spark's
    Kafka source and delta-spark are looked up there, and its query's checkpoint and control plane use it. `herald
    run` exits 2 on it, as on an invalid configuration: where the job runs must change, a retry cannot help."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{CLASSIC_SESSION_NEEDED} ({reason})")


def is_spark_connect(spark) -> bool:
    """True for a Spark Connect session (its class lives in `pyspark.sql.connect`, and it has no JVM here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def require_classic_session(spark) -> None:
    """Raise `ClassicSessionRequired` when `spark` is a Spark Connect session."""
    if is_spark_connect(spark):
        raise ClassicSessionRequired(f"this session is a {type(spark).__module__}.{type(spark).__name__}")


def spark_connect_request(conf: Mapping[str, str]) -> str | None:
    """What would make pyspark's builder make a Spark Connect session instead of a classic one, or None: its
    environment variables (`SPARK_REMOTE`, `SPARK_CONNECT_MODE_ENABLED`, `SPARK_API_MODE=connect`), or
    `spark.remote` or `spark.api.mode: connect` in herald.yaml's `spark.conf` (`conf`). Asked before a session
    is built, so that no Spark Connect client is started (or fails to import) first."""
    for variable in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
        if variable in os.environ:
            return f"{variable} is set"
    if "spark.remote" in conf:
        return "spark.conf in herald.yaml names spark.remote"
    if str(conf.get("spark.api.mode", os.environ.get("SPARK_API_MODE", ""))).lower() == "connect":
        return "spark.api.mode is connect"
    return None


def refuse_spark_connect_request(conf: Mapping[str, str]) -> None:
    """Raise `ClassicSessionRequired` when a session built now would be a Spark Connect one (unless this process
    runs a classic SparkContext already: its JVM is there, and the active session is checked on its own)."""
    from pyspark import SparkContext

    if getattr(SparkContext, "_active_spark_context", None) is not None:
        return
    reason = spark_connect_request(conf)
    if reason is not None:
        raise ClassicSessionRequired(reason)


SPECULATION = "spark.speculation"


def delivery_settings(submitted: Mapping[str, str], configured: Mapping[str, str]) -> dict[str, str]:
    """What Herald's delivery needs of the session it builds, whatever spark-submit (`submitted`) or herald.yaml
    (`configured`) asked: no speculation. A speculative copy of a slow delivery task sends its messages again
    beside the first, past the round's inflight and rate (a slow subscriber is exactly what makes a task slow).
    A request for it is logged as overridden. (A session that exists already, Databricks', keeps its own: see
    `warn_about_speculation`.)"""
    for source, values in (("spark-submit", submitted), ("herald.yaml", configured)):
        if str(values.get(SPECULATION, "false")).lower() == "true":
            log.warning("%s=true from %s is overridden: a speculative copy of a delivery task would send its "
                        "messages a second time, past the subscription's inflight and rate", SPECULATION, source)
    return {SPECULATION: "false"}


def warn_about_speculation(spark) -> None:
    """Log when a session Herald did not build (Databricks') runs speculative tasks."""
    try:
        enabled = str(spark.conf.get(SPECULATION, "false")).lower() == "true"
    except Exception:  # noqa: BLE001 - a session that cannot say (Spark Connect): nothing to warn about
        return
    if enabled:
        log.warning("%s is true on this cluster: a speculative copy of a delivery task sends its messages a "
                    "second time, past the subscription's inflight and rate; set it to false", SPECULATION)


def platform_master(submitted: Mapping[str, str], configured: str | None) -> str:
    """The master a new session runs on: spark-submit's (`submitted`, its JVM's conf) whenever it set one, which is
    always; else herald.yaml's `spark.master` (`configured`); else local[*].

    Under spark-submit herald.yaml's master never applies: YARN, Kubernetes and standalone deployments name theirs
    on the command line, and a local master from herald.yaml would run the whole job on the driver's cores. A
    different one in herald.yaml is logged, once, as ignored.
    """
    submitted_master = submitted.get("spark.master")
    if submitted_master is None:
        return configured or DEFAULT_LOCAL_MASTER
    if configured and configured != submitted_master:
        log.warning("spark.master %s in herald.yaml is ignored: spark-submit runs this job on %s",
                    configured, submitted_master)
    return submitted_master


def _submitted_conf() -> dict[str, str]:
    """The conf of the JVM spark-submit started: its master, its `--conf`s and jars (spark-submit passes them to
    that JVM as system properties). Read through the gateway, which is started first: a `SparkConf()` made before
    the gateway exists holds nothing, and would have seen no master."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


WORKER_PYTHON = "herald-spark-python"


def _worker_python() -> str:
    """`herald-spark-python` beside this interpreter (pip installs it with Herald), else the interpreter."""
    launcher = os.path.join(os.path.dirname(sys.executable), WORKER_PYTHON)
    return launcher if os.access(launcher, os.X_OK) else sys.executable


def spark_python_worker() -> None:
    """`herald-spark-python`: this interpreter, for the Python workers of a local session, importing pyspark from
    the installed package instead of Spark's bundled `pyspark.zip`.

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on its workers' PYTHONPATH, and Python compiles every
    module it imports from a zip again in each process (it caches no bytecode there): a worker's start took 1.6-1.9
    s of CPU against 0.6 s from the installed package, 11-19 s on a 2-core machine with a load of 12 (3-6 s from
    the package). Spark waits a fixed 10 s for the planner process of a Python streaming source (Herald's
    `herald_kafka`) to connect back, with no setting to change it (PythonWorkerFactory in Spark 4.2): the query
    failed to start, again and again while the machine stayed that busy. With pip's pyspark, SPARK_HOME is the
    installed package itself, so its zip holds the same files: only that zip is left out (a Spark distribution's
    SPARK_HOME is no Python package, and its zip stays).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = without_bundled_pyspark(env.get("PYTHONPATH", ""))
    os.execve(sys.executable, [sys.executable, *sys.argv[1:]], env)


def without_bundled_pyspark(python_path: str) -> str:
    """`python_path` without the `pyspark.zip` of a SPARK_HOME that is the installed pyspark package."""
    kept = []
    for entry in python_path.split(os.pathsep):
        head, name = os.path.split(entry)
        spark_home = os.path.dirname(os.path.dirname(head))  # SPARK_HOME/python/lib/pyspark.zip
        if name == "pyspark.zip" and os.path.isfile(os.path.join(spark_home, "__init__.py")):
            continue
        kept.append(entry)
    return os.pathsep.join(kept)


def _launched_by_spark_submit() -> bool:
    """True when spark-submit started this Python (it then passes the running JVM's gateway port): the jars are
    the ones its command line named (`--jars`, `--packages`)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _jar_settings(conf: Mapping[str, str]) -> dict[str, str]:
    """The cached jars and Delta's session extension, for a session Herald builds (nothing when the jars were not
    fetched, or when herald.yaml's spark.conf names its own jars or packages)."""
    from herald.jars import cached_jars

    if "spark.jars" in conf or "spark.jars.packages" in conf:
        return {}
    jars = cached_jars()
    if not jars:
        return {}
    return {"spark.jars": ",".join(jars), "spark.sql.extensions": DELTA_EXTENSION, SPARK_CATALOG: DELTA_CATALOG}


def _delta_on_classpath() -> bool:
    """True when the JVM spark-submit started (before any session exists) can load Delta's session extension."""
    from pyspark import SparkContext

    SparkContext._ensure_initialized()
    jvm = SparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        jvm.java.lang.Class.forName(DELTA_EXTENSION, False, loader)
        return True
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        return False


def _delta_session_settings(settings: Mapping[str, str], submitted: Mapping[str, str],
                            delta_loads: bool) -> dict[str, str]:
    """Delta's extension and catalog for a session spark-submit's JVM runs, when its jars are there and neither
    spark-submit's `--conf`s (`submitted`) nor herald.yaml's `spark.conf` (in `settings`) name them."""
    if not delta_loads:
        return {}
    extensions = settings.get("spark.sql.extensions") or submitted.get("spark.sql.extensions") or ""
    named = [name.strip() for name in extensions.split(",") if name.strip()]
    added: dict[str, str] = {}
    if DELTA_EXTENSION not in named:
        added["spark.sql.extensions"] = ",".join([*named, DELTA_EXTENSION])
    if not (settings.get(SPARK_CATALOG) or submitted.get(SPARK_CATALOG)):
        added[SPARK_CATALOG] = DELTA_CATALOG
    return added


def jvm_class_loads(spark, class_name: str) -> bool:
    """True when `class_name` is on the driver's classpath (False on Spark Connect, where there is no JVM here)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return False
    try:
        jvm.java.lang.Class.forName(class_name, False, jvm.java.lang.Thread.currentThread().getContextClassLoader())
        return True
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        return False
