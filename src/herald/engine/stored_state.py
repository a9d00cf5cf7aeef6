"""What a starting job reads of its tables before its first round, read at once (`StoredState`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from herald.engine.round.state import stored_held, stored_offsets, stored_parked
from herald.engine.upkeep.moves import Move, unapplied_moves
from herald.storage import TableStore


@dataclass
class StoredState:
    """What a starting job reads of its tables before its first round: the subscriptions' positions and the
    Kafka topic ids their rows name (`stored_offsets`), the messages their positions stop at (`stored_held`),
    the parked messages (`stored_parked`) and the moves no job applied yet (`unapplied_moves`)."""

    offsets: tuple[dict, dict]
    held: dict
    parked: pa.Table
    moves: list[Move]

    @classmethod
    def read(cls, store: TableStore) -> StoredState:
        """The four reads at once, each a query of its own: on delta-spark a first query of a table in a new JVM
        costs seconds, and one after the other they delayed a restart's first round by their sum (the restart
        measured in tests/benchmarks/README.md, soak.py). This job holds the lease: nothing else writes them."""
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="herald-start-read") as reads:
            offsets, held = reads.submit(stored_offsets, store), reads.submit(stored_held, store)
            parked, moves = reads.submit(stored_parked, store), reads.submit(unapplied_moves, store)
            return cls(offsets.result(), held.result(), parked.result(), moves.result())
