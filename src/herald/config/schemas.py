"""JSON Schemas of the configuration files, generated from the config models, for editors.

YAML editors that speak the YAML language server (VS Code's YAML extension, IntelliJ, Neovim's yamlls)
complete and check a file that starts with a modeline such as

    # yaml-language-server: $schema=../schemas/subscription.schema.json

`herald schema --out DIR` writes them; the example configuration keeps its copies in `conf/schemas/`, and a
test fails when those are stale. The schemas describe the files as written: `${env:NAME}` references are
replaced before validation, so in a field that is not text the editor may flag one that Herald accepts.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from herald.config.model import Subscription, Topic
from herald.config.settings import HeraldSettings

SCHEMA_FILES: dict[str, tuple[type[BaseModel], str]] = {
    "herald.schema.json": (HeraldSettings, "Herald settings (herald.yaml)"),
    "topic.schema.json": (Topic, "A Herald topic (topics/*.yaml)"),
    "subscription.schema.json": (Subscription, "A Herald subscription (subscriptions/*.yaml)"),
}
"""file name -> (the model it describes, its title)"""

_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def json_schemas() -> dict[str, dict]:
    """file name -> the JSON Schema (draft 2020-12) of that kind of file."""
    schemas = {}
    for file_name, (model, title) in SCHEMA_FILES.items():
        schema = model.model_json_schema(mode="validation")
        if model is Subscription:  # the policy of the file's deliveryType, not either (as validate checks)
            schema.update({
                "if": {"properties": {"deliveryType": {"const": "BATCH"}}, "required": ["deliveryType"]},
                "then": {"properties": {"subscriptionPolicy": {"$ref": "#/$defs/BatchPolicy"}}},
                "else": {"properties": {"subscriptionPolicy": {"$ref": "#/$defs/SerialPolicy"}}},
            })
        schemas[file_name] = {"$schema": _DIALECT, **schema, "title": title}
    return schemas


def schema_text(schema: dict) -> str:
    """A schema as it is written to disk: stable key order, two-space indent, a final newline."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_schemas(out_dir: Path) -> list[Path]:
    """Write every schema into `out_dir` (created if needed); returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, schema in json_schemas().items():
        path = out_dir / file_name
        path.write_text(schema_text(schema), encoding="utf-8")
        written.append(path)
    return written
