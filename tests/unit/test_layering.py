"""The packages' layers: the executor side (herald.delivery) imports no pyspark, no engine and no configuration
models, so it is tested without Spark and ships light to Spark's Python workers; the sources (herald.source) and
the tables (herald.storage) import no engine. Imports inside functions count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def modules(package: str) -> list[Path]:
    return sorted((SRC / "herald" / package).rglob("*.py"))


@pytest.mark.parametrize("package, forbidden", [
    ("delivery", ("pyspark", "herald.engine", "herald.config", "herald.source", "herald.storage")),
    ("source", ("herald.engine", "herald.storage", "herald.delivery")),
    ("storage", ("herald.engine", "herald.source", "herald.delivery")),
])
def test_a_layer_imports_nothing_above_it(package, forbidden):
    found = {f"{path.relative_to(SRC)}: {name}" for path in modules(package) for name in imported(path)
             if any(name == prefix or name.startswith(prefix + ".") for prefix in forbidden)}
    assert found == set()
