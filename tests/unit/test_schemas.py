"""The JSON Schemas for editors: generated from the config models, committed in conf/schemas, and the example
configuration valid against them and pointing at them."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from herald.cli import main
from herald.config.schemas import SCHEMA_FILES, json_schemas, schema_text

CONF = Path(__file__).resolve().parents[2] / "conf"
SCHEMAS = CONF / "schemas"
MODELINE = "# yaml-language-server: $schema="


def conf_files() -> list[tuple[Path, str]]:
    """(file, the schema it must use)"""
    return ([(CONF / "herald.yaml", "herald.schema.json")]
            + [(path, "topic.schema.json") for path in sorted((CONF / "topics").glob("*.yaml"))]
            + [(path, "subscription.schema.json") for path in sorted((CONF / "subscriptions").glob("*.yaml"))])


def test_the_committed_schemas_are_those_the_models_generate():
    for file_name, schema in json_schemas().items():
        committed = SCHEMAS / file_name
        assert committed.exists(), f"{committed} is missing: run `herald schema --out conf/schemas`"
        assert committed.read_text(encoding="utf-8") == schema_text(schema), \
            f"{committed} is stale: run `herald schema --out conf/schemas` and commit the result"


@pytest.mark.parametrize("path, schema_name", conf_files(), ids=lambda value: getattr(value, "name", value))
def test_each_conf_file_names_its_schema_and_is_valid_against_it(path, schema_name):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith(MODELINE), f"{path} does not start with the yaml-language-server modeline"
    target = (path.parent / first[len(MODELINE):]).resolve()
    assert target == (SCHEMAS / schema_name).resolve()
    schema = json_schemas()[schema_name]
    jsonschema.validate(yaml.safe_load(path.read_text(encoding="utf-8")), schema)


def test_a_schema_rejects_what_the_loader_rejects():
    subscription = json_schemas()["subscription.schema.json"]
    valid = {"topicName": "g.t", "name": "s", "endpoint": "http://127.0.0.1/hook"}
    jsonschema.validate(valid, subscription)
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        jsonschema.validate({**valid, "endpoitn": "typo"}, subscription)
    with pytest.raises(jsonschema.ValidationError, match="is not valid under any of the given schemas"):
        jsonschema.validate({"topicName": "g.t", "name": "s"}, subscription)
    jsonschema.validate({"topicName": "g.t", "name": "s", "endpoints": ["http://a/", "http://b/"]}, subscription)
    with pytest.raises(jsonschema.ValidationError, match="valid under each of"):
        jsonschema.validate({**valid, "endpoints": ["http://a/"]}, subscription)
    jsonschema.validate({**valid, "deliveryType": "BATCH", "subscriptionPolicy": {"batchSize": 5}}, subscription)
    with pytest.raises(jsonschema.ValidationError, match="'inflightSize' was unexpected"):
        jsonschema.validate({**valid, "deliveryType": "BATCH", "subscriptionPolicy": {"inflightSize": 5}},
                            subscription)
    with pytest.raises(jsonschema.ValidationError, match="'batchSize' was unexpected"):
        jsonschema.validate({**valid, "subscriptionPolicy": {"batchSize": 5}}, subscription)


def test_herald_schema_writes_every_schema(tmp_path, capsys):
    assert main(["schema", "--out", str(tmp_path / "out")]) == 0
    written = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert written == sorted(SCHEMA_FILES)
    assert capsys.readouterr().out.count("schema.json") == len(SCHEMA_FILES)
