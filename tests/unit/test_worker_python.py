"""`herald-spark-python`, the Python of a local session's workers: pyspark comes from the installed package, not
from the bundled pyspark.zip that Python compiles again in every worker (a planner process that starts in time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark

from herald.session import WORKER_PYTHON, without_bundled_pyspark


def test_only_the_zip_of_an_installed_pyspark_package_is_left_out(tmp_path):
    package = tmp_path / "site-packages" / "pyspark"  # pip's pyspark: SPARK_HOME is the package itself
    (package / "python" / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    distribution = tmp_path / "spark-4.2.0-bin-hadoop3"  # a Spark download: no Python package
    (distribution / "python" / "lib").mkdir(parents=True)
    entries = [str(package / "python" / "lib" / "pyspark.zip"), str(package / "python" / "lib" / "py4j-src.zip"),
               "/opt/app", str(distribution / "python" / "lib" / "pyspark.zip"), ""]
    assert without_bundled_pyspark(os.pathsep.join(entries)).split(os.pathsep) == entries[1:]
    assert without_bundled_pyspark("") == ""


def test_the_installed_launcher_runs_this_interpreter_with_the_installed_pyspark():
    launcher = Path(sys.executable).with_name(WORKER_PYTHON)
    bundled = Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"
    assert bundled.is_file(), "pip's pyspark bundles the zip Spark puts on its workers' path"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bundled), "/opt/app"])}
    out = subprocess.run([str(launcher), "-c", "import sys, pyspark; print(sys.executable); print(pyspark.__file__);"
                          "print(sys.path)"], capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    executable, imported, path = out.splitlines()
    assert executable == sys.executable
    assert imported == pyspark.__file__, "pyspark from the installed package"
    assert str(bundled) not in path and "/opt/app" in path
