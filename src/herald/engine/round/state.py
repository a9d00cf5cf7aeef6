"""What the driver knows of each running subscription, and where it finds it again after a restart.

The `offsets` table is the truth of where a subscription is (its newest row per partition); the `retries`
table holds its parked messages and the retry state of messages its position stops at (HELD). A running job
keeps them in `SubscriptionState`s, guarded by the lock of the subscription's topic, and writes every change.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pyarrow as pa

from herald.config import Subscription
from herald.delivery.clock import wall_clock_ms as _wall_ms
from herald.delivery.flow import FlowState
from herald.delivery.message import RetryState
from herald.engine.context import stamp_ms
from herald.engine.round.result import position_rows, state_of_row
from herald.storage import Slice, TableStore, TableWriter
from herald.storage.tables import HELD, OFFSETS, PARKED, RETRIES, at_ms

log = logging.getLogger(__name__)


@dataclass
class SubscriptionState:
    """One ACTIVE subscription while Herald runs.

    kafka_topic: the Kafka topic its positions (and carried states) belong to.
    positions: partition -> the first offset not yet delivered, discarded or parked.
    carried: (partition, offset) -> the retry state of a message at or past the position, for the round that
        reads it next to continue from (attempts and TTL go on).
    catching_up: behind the topic's shared query: its own rounds deliver it until it reaches the query.
    busy: a round is delivering it now.
    pending_moves: operators' moves (retransmissions) to apply once that round is over, in order.
    idle: its last catch-up round could do nothing (a held message's retry not due, an open batch not full): no
        round runs for it until the shared query's position moves past that frontier or that time comes.
    topic_end: partition -> the end of what its topic's query has read (or is about to deliver): with the
        positions, its Kafka lag as far as the job knows it (`pending`).
    topic_id: Kafka's id of the topic its positions are in (None: not known): a topic created again has a new
        one, and positions of the old log go on from the new one's start (herald.engine.round.resets).
    rows_topic_id: the topic id its newest offsets rows name (None: none, or not all of them): a round writes
        every position it covers, moved or not, while this is not the id its rows carry (`TopicPipeline._to_write`).
    flow / flow_at_s: its flow controller's state, and when (the driver's monotonic seconds; None before its
        first round) its open window was as old as it says: the time between rounds counts in the window too.
    """

    subscription: Subscription
    kafka_topic: str = ""  # the Kafka topic its positions are in
    positions: dict[int, int] = field(default_factory=dict)
    flow: FlowState = field(default_factory=FlowState)
    flow_at_s: float | None = None
    carried: dict[tuple[int, int], RetryState] = field(default_factory=dict)
    catching_up: bool = False
    busy: bool = False
    last_served_s: float = 0.0
    pending_moves: list = field(default_factory=list)  # herald.engine.upkeep.moves.Move asked for during a round
    idle: tuple[dict[int, int], int] | None = None  # (frontier, epoch ms): its last catch-up round moved nothing
    topic_end: dict[int, int] = field(default_factory=dict)
    pin_id: str | None = None  # priority pinned: the pin its flow state was learnt with
    topic_id: str | None = None
    rows_topic_id: str | None = None

    @property
    def id(self) -> str:
        return self.subscription.id

    def pinned_to(self, pin_id: str) -> None:
        """Its rounds go to the pin `pin_id` now: a new pin is a new endpoint, so the flow state learnt from the
        old one (slowed to probes because it failed) does not throttle the new one."""
        if self.pin_id is not None and self.pin_id != pin_id:
            self.flow, self.flow_at_s = FlowState(), None
        self.pin_id = pin_id

    def flow_now(self, now_s: float, now_ms: int | None = None) -> FlowState:
        """Its flow state for a round planned at `now_s` (the driver's monotonic seconds): its open window older
        by the time since its last round ended, and its next permit as the milliseconds from now (`now_ms`: the
        driver's wall clock, epoch ms) that a task counts from its own start (`FlowState.permit_in_ms`)."""
        flow = self.flow
        if self.flow_at_s is not None:
            flow = flow.aged(max(0, round((now_s - self.flow_at_s) * 1000)))
        now_ms = _wall_ms() if now_ms is None else now_ms
        return replace(flow, next_permit_ms=0, permit_in_ms=max(0, flow.next_permit_ms - now_ms)
                       if flow.next_permit_ms else 0)

    def take_flow(self, flow: FlowState, now_s: float, now_ms: int | None = None) -> None:
        """The flow state its round ended with (`FlowState.combine`), taken at `now_s` (the driver's monotonic
        seconds). A window no task closed is as old as the driver measures it, the round's start and end
        included (at least what the tasks measured); a window a task opened is as old as that task says. The next
        permit the tasks reported in milliseconds becomes an instant of the driver's wall clock (`now_ms`).
        A round no task closed the window in decided no mode or rate: it keeps the state's, which the retry
        driver's controller may have changed while the round ran (`RetryDriver._hand_back_flow`)."""
        if flow.window.number == self.flow.window.number:
            elapsed_ms = max(flow.window.elapsed_ms, self.flow_now(now_s).window.elapsed_ms)
            flow = replace(flow, mode=self.flow.mode, rate_per_s=self.flow.rate_per_s,
                           window=replace(flow.window, elapsed_ms=elapsed_ms))
        if flow.permit_in_ms:
            now_ms = _wall_ms() if now_ms is None else now_ms
            flow = replace(flow, next_permit_ms=now_ms + flow.permit_in_ms, permit_in_ms=0)
        self.flow, self.flow_at_s = flow, now_s

    def pending(self, parked: int) -> int:
        """Messages read or readable and not yet delivered or discarded: its lag (the topic's end as the job
        knows it, less its positions; what it holds at or past its position, carried, is in there) plus its
        `parked` messages, which stand outside the position."""
        lag = sum(max(0, end - self.positions.get(partition, end)) for partition, end in self.topic_end.items())
        return lag + parked

    def live_carried(self) -> dict[tuple[int, int], RetryState]:
        """Carried states still ahead of the position (a message the position passed has reached its end)."""
        return {key: state for key, state in self.carried.items() if key[1] >= self.positions.get(key[0], 0)}


def stored_positions(store: TableStore) -> dict[tuple[str, str], dict[int, int]]:
    """(subscription id, Kafka topic) -> partition -> position: the newest offsets row of each."""
    return stored_offsets(store)[0]


def stored_offsets(store: TableStore) -> tuple[dict[tuple[str, str], dict[int, int]], dict[tuple[str, str], str]]:
    """(positions, topic ids): (subscription id, Kafka topic) -> partition -> position, the newest offsets row of
    each; and -> the Kafka topic id the newest of those rows that name one names (a partition the topic created
    again no longer has keeps an older row, in the old id)."""
    columns = ("subscription", "topic", "partition", "offset", "topic_id", "committed_at", "batch_id")
    rows = store.latest(OFFSETS, ("subscription", "topic", "partition"), "committed_at DESC, batch_id DESC",
                        columns=columns)
    positions: dict[tuple[str, str], dict[int, int]] = {}
    named: dict[tuple[str, str], tuple] = {}  # -> (_, committed_at, batch_id, topic id) of the newest naming one
    for row in rows.select(list(columns)).to_pylist():
        key = (row["subscription"], row["topic"])
        positions.setdefault(key, {})[row["partition"]] = row["offset"]
        if row["topic_id"]:
            at = row["committed_at"]  # never null in rows Herald writes; ordered first if it were
            newest = (at is not None, at if at is not None else 0, row["batch_id"] or 0, row["topic_id"])
            if key not in named or newest[:3] > named[key][:3]:
                named[key] = newest
    return positions, {key: newest[3] for key, newest in named.items()}


RETRY_KEY = ("subscription", "partition", "offset")
RETRY_ORDER = "recorded_at DESC, batch_id DESC"
_STATE_COLUMNS = ("state", "attempts", "first_read_at", "due_at", "backoff_ms", "http_status", "reason", "targets",
                  "batch_last_offset", "kafka_topic")
_PARKED_COLUMNS = ("message_id", "body", "avro", "published_at", "schema_id", "schema_version", "key", "raw_value")


def stored_held(store: TableStore) -> dict[str, dict[tuple[int, int], tuple[str | None, RetryState]]]:
    """subscription id -> (partition, offset) -> (its Kafka topic, the retry state) of each message its positions
    stop at (the newest retries row is HELD); the topic is None for rows written before rows named it."""
    rows = store.latest(RETRIES, RETRY_KEY, RETRY_ORDER, columns=RETRY_KEY + _STATE_COLUMNS,
                        newest_where=f"state = '{HELD}'")
    held: dict[str, dict[tuple[int, int], tuple[str | None, RetryState]]] = {}
    for row in rows.to_pylist():
        if row["state"] != HELD:
            continue
        held.setdefault(row["subscription"], {})[(row["partition"], row["offset"])] = (
            row.get("kafka_topic"), state_of_row(row))
    return held


def stored_parked(store: TableStore) -> pa.Table:
    """The parked messages (the newest retries row of each is PARKED): their rows, with what the retry driver
    needs to send them again (`RetryDriver.load`), not the message's text."""
    return store.latest_whole(RETRIES, RETRY_KEY, ("recorded_at", "batch_id"),
                              RETRY_KEY + _STATE_COLUMNS + _PARKED_COLUMNS, f"state = '{PARKED}'")


START_BATCH_ID = -1  # offsets rows holding the position a subscription started from


class StateBook:
    """Where each subscription of a running job is when its topic starts: its resting state (suspended, removed
    or its topic stopped while running), else its stored position (the offsets table, as it was at the start or
    last rested), else where it starts (`startingOffsets`, written to the offsets table at once, so that a
    `latest` subscription gets everything published after it was first started, even across restarts).

    Positions belong to a Kafka topic: a subscription whose topic's `kafkaTopic` changed starts in the new one
    from its own stored position there, or from its `startingOffsets`; it never carries the old topic's."""

    def __init__(self, store: TableStore, writer: TableWriter, offsets: tuple[dict, dict] | None = None,
                 held: dict | None = None) -> None:
        """offsets, held: `stored_offsets(store)` and `stored_held(store)` when the caller read them already (a
        starting job reads its tables at once: `herald.engine.stored_state.StoredState`); else they are read here."""
        self.writer = writer
        self._stored, self._stored_ids = offsets if offsets is not None else stored_offsets(store)
        self._held = held if held is not None else stored_held(store)
        self._resting: dict[str, SubscriptionState] = {}
        self._moved: set[tuple[str, str]] = set()  # (subscription id, Kafka topic) moved here: rows without an id

    def state_for(self, subscription: Subscription, kafka_topic: str, marks: Mapping[int, tuple[int, int]],
                  since_ms: int | None = None, offsets_for_time=None) -> SubscriptionState:
        """The state `subscription` continues from in `kafka_topic`, whose partitions have `marks` (low, high);
        a resting state stays here until it is `joined` (a start that fails part-way leaves it where it was).

        since_ms / offsets_for_time: a `latest` subscription with no position yet whose start was delayed (its
        topic could not start when it was first seen, at `since_ms`) starts at the first messages published
        since then: `offsets_for_time(since_ms)` gives partition -> offset."""
        resting = self._resting.get(subscription.id)
        if resting is not None and resting.kafka_topic == kafka_topic:
            resting.subscription = subscription
            for partition in marks:
                resting.positions.setdefault(partition, 0)  # a partition added since: from its start
            return resting
        if resting is not None:
            log.warning("%s: its topic now reads Kafka topic %s instead of %s; its positions there are its own (or "
                        "its startingOffsets)", subscription.id, kafka_topic, resting.kafka_topic)
        positions = dict(self._stored.get((subscription.id, kafka_topic), {}))
        carried = {}
        if positions:  # the states held in this Kafka topic (rows older than the topic column: any)
            carried = {key: state for key, (topic, state) in self._held.get(subscription.id, {}).items()
                       if topic in (None, kafka_topic)}
        else:
            if subscription.startingOffsets == "earliest":
                positions = {partition: low for partition, (low, _) in marks.items()}
            elif since_ms is not None and offsets_for_time is not None:
                positions = dict(offsets_for_time(since_ms))
            else:
                positions = {partition: high for partition, (_, high) in marks.items()}
            # a slice of its own per Kafka topic, new to the tables: had it a row, that row would be a position
            writer = f"start:{subscription.id}:{kafka_topic}"
            self.writer.submit(Slice(writer, START_BATCH_ID), [(OFFSETS, position_rows(  # stamped as rounds are
                subscription.id, kafka_topic, positions, writer, START_BATCH_ID, at_ms(stamp_ms())))],
                hurry=True, new=True)  # not gathered: a crash before it is written would start it at a later `latest`
            self._stored[(subscription.id, kafka_topic)] = dict(positions)
            log.info("%s starts in %s at the %s offsets %s", subscription.id, kafka_topic,
                     subscription.startingOffsets, positions)
        for partition in marks:
            positions.setdefault(partition, 0)  # a partition added since: from its start
        key = (subscription.id, kafka_topic)
        return SubscriptionState(subscription, kafka_topic=kafka_topic, positions=positions, carried=carried,
                                 topic_id=self._stored_ids.get(key),
                                 rows_topic_id=None if key in self._moved else self._stored_ids.get(key))

    def joined(self, state: SubscriptionState) -> None:
        """`state` (from `state_for`) is being delivered now: it no longer rests here."""
        resting = self._resting.get(state.id)
        if resting is not None and resting is not state:
            self._stored[(resting.id, resting.kafka_topic)] = dict(resting.positions)  # should it go back there
        self._resting.pop(state.id, None)

    def rest(self, state: SubscriptionState) -> None:
        """A subscription stops being delivered (suspended, removed, or its topic stopped): its state waits here,
        and its positions are what it continues from in that Kafka topic."""
        self._resting[state.id] = state
        self._stored[(state.id, state.kafka_topic)] = dict(state.positions)
        if state.topic_id:
            self._stored_ids[(state.id, state.kafka_topic)] = state.topic_id
        self._held.pop(state.id, None)

    def resting(self, subscription_id: str) -> SubscriptionState | None:
        return self._resting.get(subscription_id)

    def moved(self, subscription_id: str, kafka_topic: str, to_offsets: Mapping[int, int]) -> set[tuple[int, int]]:
        """An operator moved a subscription that is not being delivered (`herald retransmit`); returns the
        (partition, offset) of the carried states the move dropped (their messages are read again as new)."""
        dropped = set(self._held.pop(subscription_id, {}))
        resting = self._resting.get(subscription_id)
        if resting is not None and resting.kafka_topic == kafka_topic:
            resting.positions.update(to_offsets)
            resting.rows_topic_id = None  # the move's rows name no topic id
            dropped |= set(resting.carried)
            resting.carried = {}
        key = (subscription_id, kafka_topic)
        self._moved.add(key)
        self._stored[key] = {**self._stored.get(key, {}), **to_offsets}
        return dropped
