"""What the driver knows of each running subscription, and where it finds it again after a restart.

The `offsets` table is the truth of where a subscription is (its newest row per partition); the `retries`
table holds its parked messages and the retry state of messages its position stops at (HELD). A running job
keeps them in `SubscriptionState`s, guarded by the lock of the subscription's topic, and writes every change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from herald.config import Subscription
from herald.delivery.flow import FlowState
from herald.delivery.message import RetryState
from herald.storage import TableStore
from herald.engine.rounds import state_of_row
from herald.storage.tables import HELD, OFFSETS, RETRIES

log = logging.getLogger(__name__)


@dataclass
class SubscriptionState:
    """One ACTIVE subscription while Herald runs.

    positions: partition -> the first offset not yet delivered, discarded or parked.
    carried: (partition, offset) -> the retry state of a message at or past the position, for the round that
        reads it next to continue from (attempts and TTL go on).
    catching_up: behind the topic's shared query: its own rounds deliver it until it reaches the query.
    busy: a round is delivering it now.
    pending_move: an operator's move (retransmission) to apply once that round is over.
    """

    subscription: Subscription
    positions: dict[int, int] = field(default_factory=dict)
    flow: FlowState = field(default_factory=FlowState)
    carried: dict[tuple[int, int], RetryState] = field(default_factory=dict)
    catching_up: bool = False
    busy: bool = False
    last_served_s: float = 0.0
    pending_move: object = None  # a herald.engine.moves.Move asked for while a round delivered it

    @property
    def id(self) -> str:
        return self.subscription.id

    def live_carried(self) -> dict[tuple[int, int], RetryState]:
        """Carried states still ahead of the position (a message the position passed has reached its end)."""
        return {key: state for key, state in self.carried.items() if key[1] >= self.positions.get(key[0], 0)}


def stored_positions(store: TableStore) -> dict[tuple[str, str], dict[int, int]]:
    """(subscription id, Kafka topic) -> partition -> position: the newest offsets row of each."""
    rows = store.latest(OFFSETS, ("subscription", "topic", "partition"), "committed_at DESC, batch_id DESC")
    positions: dict[tuple[str, str], dict[int, int]] = {}
    for row in rows.select(["subscription", "topic", "partition", "offset"]).to_pylist():
        positions.setdefault((row["subscription"], row["topic"]), {})[row["partition"]] = row["offset"]
    return positions


def stored_held(store: TableStore) -> dict[str, dict[tuple[int, int], RetryState]]:
    """subscription id -> the retry states its positions stop at (the newest retries row is HELD)."""
    rows = store.latest(RETRIES, ("subscription", "partition", "offset"), "recorded_at DESC, batch_id DESC")
    held: dict[str, dict[tuple[int, int], RetryState]] = {}
    for row in rows.to_pylist():
        if row["state"] != HELD:
            continue
        held.setdefault(row["subscription"], {})[(row["partition"], row["offset"])] = state_of_row(row)
    return held
