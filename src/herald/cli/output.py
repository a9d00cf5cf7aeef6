"""How the commands print: rows as an aligned table, JSON, times as ISO-8601 UTC."""

from __future__ import annotations

import json


def print_rows(rows: list[dict], columns: list[str]) -> None:
    if not rows:
        return
    widths = {c: max(len(c), *(len(str(row.get(c, ""))) for row in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


def print_json(value) -> None:
    print(json.dumps(value, indent=2))


def iso(epoch_ms: int | None, timespec: str = "seconds") -> str:
    """Epoch milliseconds as ISO-8601 UTC to the second (or to `timespec`, e.g. "milliseconds"); None as "-"."""
    import datetime as dt

    if epoch_ms is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.timezone.utc).isoformat(timespec=timespec)
