"""docs/configuration.md's tables are the code's: defaults and limits live in herald.config.settings (herald.yaml),
herald.config.model and herald.config.policies (topics, subscriptions) only."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import annotated_types as at
import pytest
from pydantic import BaseModel

from herald.config.endpoints import EndpointEntry, Priority
from herald.config.policies import BatchPolicy, SerialPolicy
from herald.config.settings import HeraldSettings

CONFIGURATION_DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def readme_table(marker: str, columns: int) -> dict[str, list[str]]:
    text = CONFIGURATION_DOC.read_text()
    table = text.split(f"<!-- {marker}")[1].split(f"<!-- /{marker} -->")[0]
    rows = {}
    for line in table.splitlines():
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == columns and cells[0] not in ("option", "key") and not cells[0].startswith("-"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def number(value) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def limits_of(model: type[BaseModel], name: str) -> str:
    """Pydantic bounds as the doc writes them: `a .. b`, `a .. <b`, `> a .. b`, `> a .. < b`, `>= a`, `> a`."""
    bounds = {}
    for item in model.model_fields[name].metadata:
        for kind, symbol in ((at.Ge, ">="), (at.Gt, ">"), (at.Le, "<="), (at.Lt, "<")):
            if isinstance(item, kind):
                bounds[symbol] = getattr(item, {">=": "ge", ">": "gt", "<=": "le", "<": "lt"}[symbol])
    if not bounds:  # `int | None` keeps its bounds inside the union
        for argument in typing.get_args(model.model_fields[name].annotation):
            for item in getattr(argument, "__metadata__", ()):
                for constraint in getattr(item, "metadata", [item]):
                    for kind, symbol in ((at.Ge, ">="), (at.Gt, ">"), (at.Le, "<="), (at.Lt, "<")):
                        if isinstance(constraint, kind):
                            bounds[symbol] = getattr(constraint, {">=": "ge", ">": "gt", "<=": "le",
                                                                  "<": "lt"}[symbol])
    low = f"{number(bounds['>='])}" if ">=" in bounds else f"> {number(bounds['>'])}" if ">" in bounds else None
    high = f"{number(bounds['<='])}" if "<=" in bounds else f"<{number(bounds['<'])}" if "<" in bounds else None
    if low is not None and high is not None:
        return f"{low} .. {high}" if ">=" in bounds or "<=" in bounds else f"{low} .. < {high.lstrip('<')}"
    if low is not None:
        return f">= {low}" if ">=" in bounds else low
    return f"<= {high}" if high else ""


@pytest.mark.parametrize("marker, policy", [("defaults-table", SerialPolicy), ("batch-defaults-table", BatchPolicy),
                                            ("priority-table", Priority), ("endpoint-entry-table", EndpointEntry)])
def test_every_policy_option_is_documented_with_its_default_and_limits(marker, policy):
    rows = readme_table(marker, 4)
    assert set(rows) == set(policy.model_fields)
    for name, (default, limits, _) in rows.items():
        info = policy.model_fields[name]
        expected = info.default
        shown = ("(required)" if info.is_required() else "none" if expected is None
                 else str(expected).lower() if isinstance(expected, bool) else number(expected))
        assert default == shown, f"{name}: the doc says {default}, code says {shown}"
        assert re.sub(r"\s+", " ", limits) == limits_of(policy, name), f"{name}: doc limits {limits!r}"


def settings_fields() -> dict[str, tuple[type[BaseModel], str, bool]]:
    """herald.yaml's keys, `section.key`, each with its model, field name and whether its section is optional."""
    keys = {}
    for section, info in HeraldSettings.model_fields.items():
        model = next(a for a in (info.annotation, *typing.get_args(info.annotation))
                     if isinstance(a, type) and issubclass(a, BaseModel))
        for name in model.model_fields:
            keys[f"{section}.{name}"] = (model, name, not info.is_required() and info.default is None)
    return keys


def test_every_herald_yaml_key_is_documented_with_its_default_and_limits():
    rows = readme_table("settings-table", 3)
    fields = settings_fields()
    assert set(rows) == set(fields), f"doc only: {set(rows) - set(fields)}; code only: {set(fields) - set(rows)}"
    for key, (default, meaning) in rows.items():
        model, name, optional_section = fields[key]
        info = model.model_fields[name]
        if info.is_required():
            expected = "none" if optional_section else "(required)"
            assert default == expected, f"{key}: the doc says {default}, code: required in its section"
        elif info.default is not None and not isinstance(info.default, dict) and info.default_factory is None:
            value = info.default
            shown = number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
            assert default == f"`{shown}`", f"{key}: the doc says {default}, code says {shown}"
        limits = limits_of(model, name)
        if limits:
            assert limits in meaning, f"{key}: the doc does not give its limits {limits!r}: {meaning!r}"


def test_the_discovery_options_are_documented_with_their_defaults_and_limits():
    from pydantic_core import PydanticUndefined

    from herald.config.endpoints import Discovery

    rows = readme_table("discovery-defaults-table", 4)
    assert set(rows) == set(Discovery.model_fields)
    for name, (default, limits, _) in rows.items():
        expected = Discovery.model_fields[name].default
        shown = "required" if expected is PydanticUndefined else "-" if expected is None else number(expected)
        assert default == shown, f"{name}: the doc says {default}, code says {shown}"
        assert re.sub(r"\s+", " ", limits) == limits_of(Discovery, name), f"{name}: doc limits {limits!r}"
