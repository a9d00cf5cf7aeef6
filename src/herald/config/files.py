"""Reading one configuration file: YAML to a validated model, `${env:NAME}` substituted, every problem named by
file and key path (secrets masked)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from herald.config.endpoints import UNION_TAGS
from herald.endpoint import mask_secrets

_ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SECRET_KEYS = ("endpoint", "password", "secret", "properties", "options", "value", "token")

Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True)
class Problem:
    file: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.message}" if self.key else f"{self.file}: {self.message}"


class ConfigError(Exception):
    """The configuration is invalid; `problems` lists every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(problem) for problem in problems))


def raw_mapping(path: Path) -> dict:
    """A YAML file's top-level mapping, read without validation ({} when it cannot be read as one)."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return document if isinstance(document, dict) else {}


def yaml_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def load_file(
    path: Path, model: type[Model], shown: Callable[[Path], str], problems: list[Problem], required: bool = False
) -> Model | None:
    name = shown(path)
    if not path.exists():
        if required:
            problems.append(Problem(name, "", "file not found"))
        return None
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problems.append(Problem(name, "", f"invalid YAML{where}: {getattr(error, 'problem', error)}"))
        return None
    except FileNotFoundError:  # removed since the directory was listed
        if required:
            problems.append(Problem(name, "", "file not found"))
        return None
    except OSError as error:
        problems.append(Problem(name, "", f"cannot read the file: {error.strerror}"))
        return None
    except UnicodeDecodeError as error:
        problems.append(Problem(name, "", f"not UTF-8 text (byte {error.start})"))
        return None
    if not isinstance(document, dict):
        problems.append(Problem(name, "", "must be a YAML mapping (one definition per file)"))
        return None
    env_problems: list[Problem] = []
    document = substitute_env(document, name, "", env_problems)
    if env_problems:
        problems.extend(env_problems)
        return None
    try:
        return model.model_validate(document)
    except ValidationError as error:
        problems.extend(problems_from(error, name))
        return None


def substitute_env(value: Any, file: str, key: str, problems: list[Problem]) -> Any:
    if isinstance(value, dict):
        return {k: substitute_env(v, file, _join(key, str(k)), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_env(v, file, f"{key}[{i}]", problems) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        problems.append(Problem(file, key, f"environment variable {name} is not set"))
        return ""

    return _ENV_REFERENCE.sub(replace, value)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _key_path(location: tuple) -> str:
    path = ""
    for part in location:
        if part in UNION_TAGS:
            continue  # which form of a union was read: not a key of the file
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, str(part))
    return path


def problems_from(error: ValidationError, file: str) -> list[Problem]:
    problems = []
    for item in error.errors():
        key = _key_path(item["loc"])
        kind, context = item["type"], item.get("ctx") or {}
        if kind == "extra_forbidden":
            message = "unknown key"
        elif kind == "missing":
            message = "required key is missing"
        elif kind in ("literal_error", "enum"):
            message = f"must be one of {context.get('expected')}"
        elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
            bound = f"{next(iter(context.values())):g}"
            symbol = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
            message = f"must be {symbol} {bound}"
        else:
            message = str(item["msg"]).removeprefix("Value error, ")
        shown_input = item.get("input")
        if isinstance(shown_input, (int, float)) and not isinstance(shown_input, bool) and not _secret(key):
            message += f" (got {shown_input})"
        problems.append(Problem(file, key, mask_secrets(message)))
    return problems


def _secret(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_KEYS)
