"""The jars Herald fetches match what pip installed (pyspark, delta-spark) and what docs/operations.md tells clusters to
pass with --packages: a version bump of either package that forgets the other fails here."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from herald import jars

ROOT = Path(__file__).resolve().parents[2]


def test_the_jars_are_pinned_to_the_installed_pyspark_and_delta_spark():
    """spark-avro too: from_avro must be the one built for the installed pyspark."""
    assert jars.packages() == [f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version('pyspark')}",
                               f"io.delta:delta-spark_2.13:{version('delta-spark')}",
                               f"org.apache.spark:spark-avro_2.13:{version('pyspark')}"]
    pins = dict(re.findall(r"^(pyspark|delta-spark)==(\S+)$", (ROOT / "constraints" / "spark-4.2.txt").read_text(),
                           re.MULTILINE))
    if version("pyspark").startswith("4.2."):  # `make install`'s stack (`make compat` runs the others)
        assert pins == {"pyspark": version("pyspark"), "delta-spark": version("delta-spark")}


def test_the_wheel_requires_no_spark_and_its_extra_takes_every_release_herald_runs_on():
    """A cluster's pyspark is the platform's: the wheel never installs another over it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if re.match(r"(pyspark|delta-spark)\b", d)]
    assert project["optional-dependencies"]["spark"] == ["pyspark>=4.0,<4.3", "delta-spark>=4.0,<4.5"]
    assert project["requires-python"] == ">=3.10,<3.14"
    for stack in ("4.0", "4.1", "4.2"):
        text = (ROOT / "constraints" / f"spark-{stack}.txt").read_text()
        assert re.search(rf"^pyspark=={re.escape(stack)}\.\d+$", text, re.MULTILINE), stack


def test_the_documented_spark_submit_line_names_the_same_packages():
    line = next(line for line in (ROOT / "docs" / "operations.md").read_text().splitlines() if "--packages" in line)
    assert re.search(r"--packages (\S+)", line).group(1).split(",") == jars.packages()


def test_jars_can_be_left_out(monkeypatch, tmp_path):
    monkeypatch.setenv("HERALD_JARS_DIR", str(tmp_path))
    assert jars.cached_jars() == [], "nothing fetched into this directory"
    monkeypatch.setenv("HERALD_JARS", "off")
    assert jars.cached_jars() == []


def test_a_session_herald_builds_gets_the_fetched_jars_and_deltas_extension(monkeypatch, tmp_path):
    import json

    from herald.session import _jar_settings

    monkeypatch.setenv("HERALD_JARS_DIR", str(tmp_path))
    monkeypatch.delenv("HERALD_JARS", raising=False)
    target = jars.cache_dir()
    target.mkdir(parents=True)
    files = [tmp_path / "a.jar", tmp_path / "b.jar"]
    for file in files:
        file.write_bytes(b"PK")
    (target / "jars.json").write_text(json.dumps({"packages": jars.packages(), "jars": [str(f) for f in files]}))
    settings = _jar_settings({})
    assert settings["spark.jars"] == ",".join(str(f) for f in files)
    assert settings["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert _jar_settings({"spark.jars.packages": "x:y:1"}) == {}, "herald.yaml's own choice wins"
    (target / "jars.json").write_text(json.dumps({"packages": ["other:pkg:1"], "jars": [str(f) for f in files]}))
    assert _jar_settings({}) == {}, "fetched for other versions: not used"


def test_under_spark_submit_deltas_extension_and_catalog_are_added_when_its_jars_load():
    from herald.session import DELTA_CATALOG, DELTA_EXTENSION, SPARK_CATALOG, _delta_session_settings

    assert _delta_session_settings({}, {}, delta_loads=False) == {}, "no Delta jars: nothing to configure"
    assert _delta_session_settings({}, {}, delta_loads=True) == {"spark.sql.extensions": DELTA_EXTENSION,
                                                                  SPARK_CATALOG: DELTA_CATALOG}
    submitted = {"spark.sql.extensions": "org.example.Ext", SPARK_CATALOG: "org.example.Catalog"}
    assert _delta_session_settings({}, submitted, delta_loads=True) == {
        "spark.sql.extensions": f"org.example.Ext,{DELTA_EXTENSION}"}, "the command line's own are kept"
    both = {"spark.sql.extensions": f"{DELTA_EXTENSION}", SPARK_CATALOG: DELTA_CATALOG}
    assert _delta_session_settings({}, both, delta_loads=True) == {}, "--conf named them already"
    assert _delta_session_settings(both, {}, delta_loads=True) == {}, "herald.yaml's spark.conf named them"


def test_spark_submits_master_is_the_one_a_session_runs_on(caplog):
    from herald.session import platform_master

    assert platform_master({}, None) == "local[*]", "neither spark-submit nor herald.yaml: local"
    assert platform_master({}, "local[2]") == "local[2]", "herald run: herald.yaml's master"
    assert platform_master({"spark.master": "yarn"}, None) == "yarn"
    with caplog.at_level("WARNING", logger="herald.session"):
        assert platform_master({"spark.master": "spark://h:7077"}, "local[*]") == "spark://h:7077"
    assert "spark.master local[*] in herald.yaml is ignored: spark-submit runs this job on spark://h:7077" \
        in caplog.text


def test_sessions_herald_builds_never_speculate(caplog):
    from herald.session import delivery_settings

    assert delivery_settings({}, {}) == {"spark.speculation": "false"}
    with caplog.at_level("WARNING", logger="herald.session"):
        assert delivery_settings({"spark.speculation": "true"}, {}) == {"spark.speculation": "false"}
    assert "spark.speculation=true from spark-submit is overridden" in caplog.text
