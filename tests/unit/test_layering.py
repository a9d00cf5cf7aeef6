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


# The whole order, top to bottom (docs/design.md, "Where things are"): a module imports only from a lower layer
# or its own package (a layer's names import none of each other). Every package and top-level module of herald
# is named here, so a new one has to be placed.
LAYERS = (
    ("__main__",),
    ("cli",),
    ("demo", "notebooks"),
    ("readout", "publish", "broker"),
    ("engine",),
    ("config",),
    ("filters",),
    ("avro", "source", "storage"),
    ("delivery", "session"),
    ("logs", "jars", "kafka_properties"),
    ("endpoint", "__init__"),
)
RANK = {name: len(LAYERS) - level for level, names in enumerate(LAYERS) for name in names}


def unit_of(path: Path) -> str:
    """The package (or top-level module) of herald that `path` belongs to."""
    parts = path.relative_to(SRC / "herald").parts
    return parts[0] if len(parts) > 1 else path.stem


def test_every_package_has_a_layer():
    units = {unit_of(path) for path in (SRC / "herald").rglob("*.py")}
    assert units - set(RANK) == set(), "place it in LAYERS"


def test_imports_go_down_the_layers_only():
    upward = set()
    for path in (SRC / "herald").rglob("*.py"):
        me = unit_of(path)
        for name in imported(path):
            parts = name.split(".")
            if parts[0] != "herald" or len(parts) < 2 or parts[1] == me:
                continue
            if RANK[parts[1]] >= RANK[me]:
                upward.add(f"{path.relative_to(SRC)}: {name}")
    assert upward == set()
