"""The packages' layers: the executor side (herald.delivery) imports no pyspark, no engine and no configuration
models, so it is tested without Spark and ships light to Spark's Python workers; the sources (herald.source) and
the tables (herald.storage) import no engine; inside the engine, its wings (round/, triggers/, endpoints/,
upkeep/) import downwards only, in an order of their own. Imports inside functions count."""

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


# Inside engine/ (docs/design.md, "Where things are"): runner.py at the top with what only it asks (a start's
# reads, the end of a --once run), then the wings, each importing only from a lower one or itself; context.py
# (what every round shares) sits beside upkeep/, below the rounds that get it and above the endpoints it asks.
# Measured when the wings were made, not chosen.
ENGINE_LAYERS = (
    ("runner",),
    ("stored_state", "once"),
    ("triggers",),
    ("round",),
    ("context", "upkeep"),
    ("endpoints",),
    ("__init__",),
)
ENGINE_RANK = {name: len(ENGINE_LAYERS) - level for level, names in enumerate(ENGINE_LAYERS) for name in names}

# The imports that go up, each one named: a new one fails the test, and so does one of these gone (then drop it).
ENGINE_UPWARD = {
    # `herald retransmit` (moves.retransmit) starts from the stored positions, inside the function: upkeep/ and
    # round/ import each other (the pipeline applies moves, moves.applied_tables).
    "herald/engine/upkeep/moves.py: herald.engine.round.state.stored_positions",
}


def engine_imported(path: Path) -> set[str]:
    """What `path` imports from herald.engine, as dotted names down to the imported name (so that `from
    herald.engine.round import steps` says which wing it takes)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith("herald.engine.")}


def wing_of(path: Path) -> str:
    """The wing (or top-level module) of engine/ that `path` belongs to."""
    parts = path.relative_to(SRC / "herald" / "engine").parts
    return parts[0] if len(parts) > 1 else path.stem


def test_every_engine_wing_has_a_layer():
    wings = {wing_of(path) for path in modules("engine")}
    assert wings - set(ENGINE_RANK) == set(), "place it in ENGINE_LAYERS"


def test_engine_imports_go_down_the_wings_only():
    upward = set()
    for path in modules("engine"):
        me = wing_of(path)
        for name in engine_imported(path):
            wing = name.split(".")[2]
            if wing != me and ENGINE_RANK[wing] >= ENGINE_RANK[me]:
                upward.add(f"{path.relative_to(SRC)}: {name}")
    assert upward == ENGINE_UPWARD
