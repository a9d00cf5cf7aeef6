"""Apache Kafka's own broker (`org.apache.kafka:kafka_2.13`) for the tests that need a real one, fetched once.

The jars come from Maven Central with the Ivy that pyspark ships (Spark's own resolver; Ivy's default settings,
so no repository is named here) into `~/.cache/herald/kafka/<version>` (`HERALD_KAFKA_DIR` overrides the root).
`make install` runs `python -m tests.support.kafka_dist`; a second run finds the cache and returns at once, and
the `kafka_broker` fixture fetches too when the cache is empty.

Kafka 4.x runs in KRaft mode only and needs Java 17, which the machine has for Spark anyway.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

KAFKA_VERSION = "4.4.0"
SCALA = "2.13"
# Kafka's server logs through slf4j 1.x; its POM names no binding (the release tarball adds one), so the
# matching log4j2 binding is fetched with it: the broker's warnings and errors go to a file the tests show.
MODULES = (("org.apache.kafka", f"kafka_{SCALA}", KAFKA_VERSION),
           ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.5"))

_IVY_XML = """<ivy-module version="2.0">
  <info organisation="herald" module="herald-kafka-broker"/>
  <dependencies>
{dependencies}
  </dependencies>
</ivy-module>
"""


def cache_dir() -> Path:
    root = os.environ.get("HERALD_KAFKA_DIR") or str(Path.home() / ".cache" / "herald" / "kafka")
    return Path(root) / KAFKA_VERSION


def _coordinates() -> list[str]:
    return [":".join(module) for module in MODULES]


def cached_jars() -> list[str]:
    """The cached broker jars (none when they were not fetched, or were fetched for other modules)."""
    manifest = cache_dir() / "jars.json"
    if not manifest.exists():
        return []
    fetched = json.loads(manifest.read_text())
    if fetched.get("modules") != _coordinates():
        return []
    return fetched["jars"] if all(Path(jar).exists() for jar in fetched["jars"]) else []


def ivy_jar() -> Path:
    """The Ivy jar pyspark ships (Spark resolves `--packages` with it)."""
    import pyspark

    found = sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
    if not found:
        raise RuntimeError("pyspark ships no Ivy jar here: cannot resolve Kafka's broker")
    return found[-1]


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("no java on PATH (Kafka 4 needs Java 17)")
    return found


def fetch(timeout_s: float = 900.0) -> list[str]:
    """Resolve Kafka's broker and what it needs into the cache, unless it is there; returns the jar paths.

    Takes about 30 s the first time (44 jars, 43 MB), milliseconds after. Raises RuntimeError when Ivy fails.
    """
    jars = cached_jars()
    if jars:
        return jars
    target = cache_dir()
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    dependencies = "\n".join(f'    <dependency org="{org}" name="{name}" rev="{rev}" conf="default->default"/>'
                             for org, name, rev in MODULES)
    (target / "ivy.xml").write_text(_IVY_XML.format(dependencies=dependencies))
    command = [java(), "-cp", str(ivy_jar()), "org.apache.ivy.Main", "-ivy", str(target / "ivy.xml"),
               "-confs", "default", "-types", "jar", "bundle", "-m2compatible", "-cache", str(target / "ivy-cache"),
               "-retrieve", str(target / "jars" / "[organisation]_[artifact]-[revision](-[classifier]).[ext]")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    resolved = sorted(str(path) for path in (target / "jars").glob("*.jar"))
    if result.returncode != 0 or not resolved:
        shutil.rmtree(target, ignore_errors=True)
        raise RuntimeError(f"could not fetch {', '.join(_coordinates())}: {(result.stdout + result.stderr)[-2000:]}")
    shutil.rmtree(target / "ivy-cache", ignore_errors=True)  # the retrieved copies are all that is used
    (target / "jars.json").write_text(json.dumps({"modules": _coordinates(), "jars": resolved}, indent=2))
    return resolved


if __name__ == "__main__":
    try:
        print(f"{len(fetch())} jar(s) for Apache Kafka {KAFKA_VERSION} (the tests' real broker) in {cache_dir()}")
    except RuntimeError as error:
        print(f"kafka broker jars: {error}", file=sys.stderr)
        sys.exit(1)
