"""herald.filters' imports form a DAG: no module of the package imports one that, directly or through other herald
modules, imports it back. Imports inside functions count. A module's import of a package initialises the
package's parents too; a module's own parent packages are already being initialised, so only explicit imports of
them count."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_file(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    return None


def parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports(module: str) -> set[str]:
    """The herald modules `module` imports anywhere in its source, with the parent packages that initialises."""
    path = module_file(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]  # `from package import module`
        else:
            continue
        for name in names:
            if name.split(".")[0] == "herald" and module_file(name) is not None:
                found.add(name)
                found.update(parent for parent in parents(name) if parent not in parents(module))
    return found - {module}


def graph() -> dict[str, set[str]]:
    """Every herald module reachable from herald.filters' modules, with what it imports."""
    pending = ["herald.filters", *(f"herald.filters.{path.stem}" for path in (SRC / "herald" / "filters").glob("*.py")
                                   if path.stem != "__init__")]
    edges: dict[str, set[str]] = {}
    while pending:
        module = pending.pop()
        if module not in edges:
            edges[module] = imports(module)
            pending.extend(edges[module])
    return edges


def path_back(edges: dict[str, set[str]], start: str) -> list[str] | None:
    """A chain of imports from `start` back to `start`, if any."""
    seen: set[str] = set()
    stack = [(start, [start])]
    while stack:
        module, chain = stack.pop()
        for target in edges[module]:
            if target == start:
                return [*chain, start]
            if target not in seen:
                seen.add(target)
                stack.append((target, [*chain, target]))
    return None


def test_no_module_of_herald_filters_imports_itself_back():
    edges = graph()
    cycles = {module: path_back(edges, module) for module in edges if module.startswith("herald.filters")}
    assert {module: chain for module, chain in cycles.items() if chain} == {}


def test_the_check_sees_function_level_imports_and_package_imports():
    edges = graph()
    assert "herald.filters.compile" in edges["herald.filters"]  # inside filter_column
    assert "herald.filters.python_eval" in edges["herald.filters.compile"]  # inside the pandas UDF
    assert "herald.filters" in edges["herald.filters.targets"]  # `from herald.filters import check_rule`
    assert path_back({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == ["a", "b", "c", "a"]


def test_herald_filters_imports_no_spark():
    """The config loader validates filters with check_rule: herald.filters itself must not need Spark."""
    code = ("import sys, herald.filters; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pandas')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(SRC)})
    assert result.stdout.strip() == "[]"
