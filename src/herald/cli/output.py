"""How the commands print: rows as an aligned table, times as ISO-8601 UTC."""

from __future__ import annotations


def print_rows(rows: list[dict], columns: list[str]) -> None:
    if not rows:
        return
    widths = {c: max(len(c), *(len(str(row.get(c, ""))) for row in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


def iso_ms(epoch_ms: int | None) -> str:
    import datetime as dt

    if epoch_ms is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch_ms / 1000, tz=dt.timezone.utc).isoformat(timespec="milliseconds")


def iso(epoch_ms: int | None) -> str:
    import datetime as dt

    if epoch_ms is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.timezone.utc).isoformat(timespec="seconds")
