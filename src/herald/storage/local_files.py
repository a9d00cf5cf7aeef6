"""What maintenance counts of a table kept on the local disk: its log and data files. A remote table's are not
counted (listing them costs requests)."""

from __future__ import annotations


def local_path(path: str) -> str | None:
    """The local file system path of `path` (a plain path, `file:///data/t` or Hadoop's `file:/data/t`); None for
    any other scheme or host (`s3a://`, `dbfs:/`, `file://host/`, ...)."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(path)
    if not parsed.scheme:
        return path
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return unquote(parsed.path)
    return None


def log_files(path: str) -> int | None:
    """The number of files in a local table's `_delta_log` (None for a remote one: listing it costs requests),
    without Hadoop's hidden `.name.crc` side files."""
    import os

    local = local_path(path)
    if local is None:
        return None
    try:
        return sum(1 for entry in os.scandir(os.path.join(local, "_delta_log"))
                   if entry.is_file() and not entry.name.startswith("."))
    except FileNotFoundError:
        return 0


def data_files(path: str) -> int | None:
    """The number of a local table's data files (None for a remote one), outside `_delta_log`."""
    import os

    local = local_path(path)
    if local is None:
        return None
    found = 0
    for _, folders, files in os.walk(local):
        folders[:] = [name for name in folders if name != "_delta_log"]
        found += sum(1 for name in files if name.endswith(".parquet") and not name.startswith("."))
    return found
