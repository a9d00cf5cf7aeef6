"""The README's defaults table is the code's: defaults and limits live in herald.config.model only."""

from __future__ import annotations

import re
from pathlib import Path

import annotated_types as at

from herald.config.model import SerialPolicy

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_table() -> dict[str, tuple[str, str]]:
    text = README.read_text()
    table = text.split("<!-- defaults-table")[1].split("<!-- /defaults-table -->")[0]
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("option", "---") and not cells[0].startswith("-"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def limits_of(name: str) -> str:
    bounds = {}
    for item in SerialPolicy.model_fields[name].metadata:
        for kind, symbol in ((at.Ge, ">="), (at.Gt, ">"), (at.Le, "<="), (at.Lt, "<")):
            if isinstance(item, kind):
                bounds[symbol] = getattr(item, {">=": "ge", ">": "gt", "<=": "le", "<": "lt"}[symbol])
    low = bounds.get(">=", bounds.get(">"))
    if "<=" in bounds:
        return f"{low:g} .. {bounds['<=']:g}"
    if "<" in bounds:
        return f"{low:g} .. <{bounds['<']:g}"
    return f">= {low:g}" if low is not None else ""


def test_every_policy_option_is_documented_with_its_default_and_limits():
    rows = readme_table()
    assert set(rows) == set(SerialPolicy.model_fields)
    for name, (default, limits) in rows.items():
        expected = SerialPolicy.model_fields[name].default
        shown = str(expected).lower() if isinstance(expected, bool) else f"{expected:g}"
        assert default == shown, f"{name}: README says {default}, code says {shown}"
        assert re.sub(r"\s+", " ", limits) == limits_of(name), f"{name}: README limits {limits!r}"
