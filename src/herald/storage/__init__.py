"""Delta tables under the storage path: undelivered, offsets, retries, metrics, tracking, retransmissions,
leases, advisories and endpoints (`herald.storage.tables`; docs/design.md §9).

`open_store` picks the back-end (`delta_spark` when its jars load, `delta_rs` otherwise); both write the same
layout, and every reader (the CLI too, without starting Spark) reads it with delta-rs (`reads`). `TableWriter`
writes rounds' slices in order on a thread of its own (a bounded queue), so delivery never waits for a commit;
`StorageLease` keeps a second job off the same storage path.
"""

from herald.storage.delta_rs import DeltaRsStore
from herald.storage.store import Slice, Slices, TableStore, open_store, table_root
from herald.storage.writer import TableWriter

__all__ = ["DeltaRsStore", "Slice", "Slices", "TableStore", "TableWriter", "open_store", "table_root"]
