"""Delta tables under the storage path: undelivered, offsets and metrics (DESIGN.md §7).

`open_store` picks the back-end (delta-spark when its jars load, delta-rs otherwise); both write the same
layout, and the CLI reads it with delta-rs without starting Spark.
"""

from herald.storage.store import BatchTxn, DeltaRsStore, TableStore, open_store, table_root

__all__ = ["BatchTxn", "DeltaRsStore", "TableStore", "open_store", "table_root"]
