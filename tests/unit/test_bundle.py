"""The Databricks Asset Bundle (databricks.yml and the resources it includes) agrees with the repository: the
files it names exist, its artifact is the wheel `make dist` builds, its task's entry point fails the run when
Herald fails, its runtime is the one docs/operations.md names, and the Kafka bootstrap servers come from a secret that
conf/herald.yaml reads. Read with pyyaml, as the Databricks CLI would see it (no CLI, no network)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.support.spark_connect import ConnectSession, conf_dir

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
FILE_PATH = "${workspace.file_path}"
"""Where the bundle uploads the repository's files (the bundle root) in the workspace."""


def load_bundle() -> tuple[dict, dict[str, Path]]:
    """databricks.yml and its included files merged (their `resources`), and the file each job came from (paths in a
    resource file are relative to it)."""
    bundle = yaml.safe_load((REPO / "databricks.yml").read_text())
    jobs_from: dict[str, Path] = {}
    for pattern in bundle.get("include", []):
        included = sorted(REPO.glob(pattern))
        assert included, f"include {pattern} names no file"
        for path in included:
            resources = yaml.safe_load(path.read_text())["resources"]
            for kind, items in resources.items():
                bundle.setdefault("resources", {}).setdefault(kind, {}).update(items)
            jobs_from.update({key: path for key in resources.get("jobs", {})})
    return bundle, jobs_from


BUNDLE, JOBS_FROM = load_bundle()


def resolved(value: str) -> str:
    """`value` with each `${var.NAME}` replaced by the variable's default, as a deploy without --var resolves it."""
    variables = BUNDLE.get("variables", {})
    return re.sub(r"\$\{var\.([A-Za-z0-9_]+)\}", lambda match: str(variables[match.group(1)]["default"]), value)


def the_job() -> tuple[str, dict]:
    (key, job), = BUNDLE["resources"]["jobs"].items()
    return key, job


def the_task() -> dict:
    (task,) = the_job()[1]["tasks"]
    return task


def the_cluster() -> dict:
    key = the_task()["job_cluster_key"]
    (cluster,) = [c["new_cluster"] for c in the_job()[1]["job_clusters"] if c["job_cluster_key"] == key]
    return cluster


def expected_wheel() -> str:
    """The file `make dist` (pip wheel of this pure-Python project) writes: the name as a wheel spells it, the version,
    any Python 3, no ABI, any platform."""
    name = re.sub(r"[-_.]+", "_", PYPROJECT["name"]).lower()
    return f"{name}-{PYPROJECT['version']}-py3-none-any.whl"


def test_the_artifact_is_the_wheel_make_dist_builds():
    (artifact,) = BUNDLE["artifacts"].values()
    assert artifact["type"] == "whl"
    assert artifact["build"] == "make dist"
    assert (REPO / artifact["path"]).resolve() == REPO
    assert [f["source"] for f in artifact["files"]] == [f"dist/{expected_wheel()}"]
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^dist:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe is not None, "the Makefile has no dist target"
    assert re.search(r"pip wheel .*--no-deps --wheel-dir dist \.$", recipe.group(1), re.MULTILINE), recipe.group(1)
    assert "ext_modules" not in (REPO / "pyproject.toml").read_text(), "a built extension would not be py3-none-any"


def test_the_task_installs_that_wheel():
    libraries = the_task()["libraries"]
    source = JOBS_FROM[the_job()[0]].parent
    wheels = [(source / library["whl"]).resolve() for library in libraries if "whl" in library]
    assert wheels == [REPO / "dist" / expected_wheel()]


def test_every_file_the_bundle_names_exists_in_the_repository():
    parameters = the_task()["python_wheel_task"]["parameters"]
    named = [value.removeprefix(FILE_PATH + "/") for value in parameters if value.startswith(FILE_PATH + "/")]
    assert named == ["conf"], parameters
    for relative in named:
        assert (REPO / relative).is_dir(), relative
    assert (REPO / "conf" / "herald.yaml").is_file()
    assert parameters[parameters.index("--conf") + 1] == f"{FILE_PATH}/conf"
    for key, source in JOBS_FROM.items():
        assert source.is_file(), key


def test_the_entry_point_is_a_console_script_of_the_package():
    task = the_task()["python_wheel_task"]
    assert task["package_name"] == PYPROJECT["name"]
    assert task["entry_point"] in PYPROJECT["scripts"], f"{task['entry_point']} is not in [project.scripts]"
    assert task["parameters"][0] == "run"


def entry_point_function():
    module, function = PYPROJECT["scripts"][the_task()["python_wheel_task"]["entry_point"]].split(":")
    return getattr(importlib.import_module(module), function)


def test_the_entry_point_raises_the_exit_code_when_the_run_fails(tmp_path, capsys):
    """Databricks' python_wheel_task calls the function itself: a run that fails must raise SystemExit with its code
    (a returned code would count as success). The task's own parameters, on a conf directory that is not valid."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "herald.yaml").write_text("kafka: {}\n")
    parameters = [value.replace(FILE_PATH, str(tmp_path)) for value in the_task()["python_wheel_task"]["parameters"]]
    with pytest.raises(SystemExit) as failed:
        entry_point_function()(parameters)
    assert failed.value.code == 2
    assert "invalid configuration" in capsys.readouterr().err


def test_the_entry_point_raises_the_code_a_failed_run_returns(tmp_path, monkeypatch, capsys):
    """`herald run` returns 2 (not raises) on a Spark Connect session: the entry point raises it."""
    monkeypatch.setattr("herald.engine.runner.get_or_create_session", lambda *args, **kwargs: ConnectSession())
    parameters = the_task()["python_wheel_task"]["parameters"]
    conf = conf_dir(tmp_path)
    with pytest.raises(SystemExit) as failed:
        entry_point_function()([value.replace(f"{FILE_PATH}/conf", str(conf)) for value in parameters])
    assert failed.value.code == 2
    assert "Herald needs a classic Spark session" in capsys.readouterr().err


def test_the_entry_point_returns_when_the_command_succeeds(capsys):
    assert entry_point_function()(["validate", "--conf", str(REPO / "conf")]) is None
    assert "valid" in capsys.readouterr().out


def test_the_runtime_is_one_the_operations_guide_names_for_databricks():
    guide = (REPO / "docs" / "operations.md").read_text()
    section = guide[guide.index("## Databricks"):guide.index("## Tables")]
    named = set(re.findall(r"`(\d+\.\d+\.x-scala2\.13)`", section))
    assert the_cluster()["spark_version"] in named, named


def test_a_dedicated_access_cluster_runs_it_continuously():
    _, job = the_job()
    assert job["continuous"] == {"pause_status": "UNPAUSED"}
    assert job["max_concurrent_runs"] == 1
    cluster = the_cluster()
    assert cluster["data_security_mode"] == "SINGLE_USER"
    assert cluster["spark_conf"]["spark.speculation"] == "false"


def test_dev_and_prod_targets():
    targets = BUNDLE["targets"]
    assert set(targets) == {"dev", "prod"}
    assert targets["dev"]["mode"] == "development" and targets["dev"]["default"] is True
    prod = targets["prod"]
    assert prod["mode"] == "production"
    assert prod["workspace"]["root_path"].startswith("/Workspace/")
    assert set(prod["run_as"]) == {"service_principal_name"}


def env_reference(conf_value: str) -> str:
    match = re.fullmatch(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}", conf_value)
    assert match is not None, f"{conf_value!r} is not read from the environment"
    return match.group(1)


def test_the_bootstrap_servers_come_from_a_secret_that_herald_yaml_reads():
    herald_yaml = yaml.safe_load((REPO / "conf" / "herald.yaml").read_text())
    variable = env_reference(herald_yaml["kafka"]["bootstrapServers"])
    secret = resolved(the_cluster()["spark_env_vars"][variable])
    assert re.fullmatch(r"\{\{secrets/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\}\}", secret), secret
    assert secret == "{{secrets/herald/kafka-bootstrap}}", "the scope and key docs/operations.md tells to create"


def test_the_storage_path_is_the_bundles_variable():
    herald_yaml = yaml.safe_load((REPO / "conf" / "herald.yaml").read_text())
    variable = env_reference(herald_yaml["storage"]["path"])
    assert the_cluster()["spark_env_vars"][variable] == "${var.storage_path}"
