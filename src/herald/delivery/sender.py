"""The delivery loop of one Spark task: every subscription of the task's plan, over one transport.

One thread runs the loop; the input is read ahead on another (`input.Prefetcher`) and the transport never
blocks (`transport`), so a task serves any number of subscriptions with bounded threads and connections.
Each subscription keeps its own rules, queue, rate and flow state in a `Lane`; the loop knows nothing of
Hermes' rules. It:

1. reads rows while fewer than `readahead_rows` / `readahead_bytes` wait to be taken, and hands each row to
   the lanes whose filters passed it. When the read-ahead is full and a lane starves, the lane holding the
   most rows is cut off: its position stops there and it catches up on its own, so a slow subscriber never
   holds back the others;
2. lets lanes admit rows into flight and start due attempts while the transport has room, waking up at the
   earliest of: an answer, the next due retry or rate permit, new input, the deadline;
3. hands each answer to its lane;
4. settles a lane that has nothing but retries left for `park_after_s` (once its input is read), one whose
   rate keeps its next attempt waiting longer than that (`TaskPlan.settle_throttled`), and every
   lane at the deadline or at `stop()`: unattempted messages stop its position, retries are parked (or
   carried, for an ordered subscription or beyond its stop). A settling lane starts nothing more; its open
   attempts get `request_grace_s` to answer, then the transport aborts them and each counts as a timeout
   (retried by the lane's rules), so a subscriber that never answers holds the task for at most the deadline
   plus that grace, whatever its requestTimeout. An answer to an aborted attempt never counts.

It returns when every lane is finished or settled, with a `TaskReport`. Time comes from an injectable
monotonic `clock` (seconds) and `wall_clock_ms` (epoch ms), read together into one `clock.Instant` per turn
of the loop and per answer: lanes get that one value, the loop's own times (deadline, sweeps, timers) are its
monotonic seconds. The loop waits in the transport's `poll` while attempts are open and in `sleep` (seconds)
otherwise, so tests run it on a fake clock without real waiting (with `prefetch=False`, the input is read on
the loop's thread, so that such a test does not race a thread).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
import uuid
from collections.abc import Callable, Iterable

import numpy as np

from herald.delivery.clock import Instant, wall_clock_ms
from herald.delivery.control import ControlPoller
from herald.delivery.input import InlineReader, InputBatch, Prefetcher
from herald.delivery.lane import Lane
from herald.delivery.message import Record
from herald.delivery.oauth import TOKENS, TokenCache
from herald.delivery.plan import TaskPlan
from herald.delivery.report import MAX_GAPS, TaskReport
from herald.delivery.transport import HttpRequest, Transport, open_transport
from herald.delivery.unit import Unit

Token = tuple[Lane, Unit, float]
"""An open attempt: its lane, its unit and when it started (monotonic seconds)."""

_SWEEP_S = 0.05  # how often every lane's flow window and stall are looked at
_INPUT_POLL_S = 0.01  # longest wait for an answer while more input may be ready
_IDLE_WAIT_S = 0.5


class TaskSender:
    """Delivers one task's rows for every lane of `plan`; use once per task. `stop()` returning True ends it
    as the deadline would."""

    def __init__(
        self,
        plan: TaskPlan,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ms: Callable[[], int] = wall_clock_ms,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        task_index: int = 0,
        stop: Callable[[], bool] = lambda: False,
        prefetch: bool = True,
        tokens: TokenCache = TOKENS,
    ) -> None:
        self.plan = plan
        self.task_index = task_index
        self.stop = stop
        self.prefetch = prefetch
        self.tokens = tokens
        self.transport = transport
        self.clock = clock
        self.wall_clock_ms = wall_clock_ms
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.lanes: dict[int, Lane] = {}
        self._progress: dict[int, int] = {}  # partition -> offset after the last row read
        self._offsets: dict[int, list[np.ndarray]] = {}
        self._holders: dict[int, int] = {}  # id(record) -> lanes holding it pending
        self._held_rows = 0
        self._held_bytes = 0
        self._ready: dict[Lane, None] = {}  # lanes to look at now, in order
        self._timers: list[tuple[float, int, Lane]] = []
        self._sequence = itertools.count()
        self._no_room: dict[Lane, None] = {}  # lanes waiting for the transport to have room
        self._tracing: list[Lane] = []  # lanes that record every row's step, FILTERED included
        self._batching: list[Lane] = []  # BATCH lanes: told how far each partition has been read
        self._control: ControlPoller | None = None
        self._open: dict[Token, None] = {}  # attempts started and neither answered nor aborted
        self._grace_ends: dict[Lane, float] = {}  # settling lanes with attempts open: when those are aborted

    def run(self, batches: Iterable[InputBatch]) -> TaskReport:
        now = Instant(self.clock(), self.wall_clock_ms())
        if self.transport is None:
            self.transport = open_transport(self.plan.transport, self.plan.max_open)
        for index, whole in self.plan.lanes.items():
            lane_plan = whole.share(self.plan.tasks, self.task_index)
            lane = Lane(index, lane_plan, now, self.rng, self.tokens, flush=self.plan.flush_batches)
            lane.counters.started_ms = now.ms
            if lane_plan.inflight <= 0:
                lane.cut_input({})  # every slot is held by parked retries: it takes nothing new
            self.lanes[index] = lane
            self._ready[lane] = None
        self._tracing = [lane for lane in self.lanes.values() if lane.plan.tracks_all]
        self._batching = [lane for lane in self.lanes.values() if lane.tracks_reads]
        reader = Prefetcher(batches) if self.prefetch else InlineReader(batches)
        deadline = now.s + self.plan.budget_s
        self._control = ControlPoller(self.plan.control_url, self.plan.control_poll_s) if self.plan.control_url \
            else None
        try:
            self._loop(reader, deadline)
            exhausted = reader.done
        finally:
            reader.close()
            self.transport.close()
            if self._control is not None:
                self._control.close()
        return self._report(exhausted)

    # -- the loop ---------------------------------------------------------------------------------------------
    def _loop(self, reader: Prefetcher, deadline: float) -> None:
        """Turn until done; `deadline` in monotonic seconds."""
        transport = self.transport
        clock, wall_clock_ms = self.clock, self.wall_clock_ms
        next_sweep = 0.0
        abort_at = math.inf  # once stopping: the deadline (or the stop) plus the grace, monotonic seconds
        while True:
            now = Instant(clock(), wall_clock_ms())
            at = now.s
            stopping = abort_at < math.inf
            if not stopping and (at >= deadline or self.stop()):
                stopping = True
                abort_at = min(at, deadline) + self.plan.request_grace_s
            if stopping:
                if transport.open and at >= abort_at:
                    self._abort(None, now)
                if transport.open == 0:
                    self._settle_all(now, reader.done)
                    return
            else:
                self._read(reader, now)
                while self._timers and self._timers[0][0] <= at:
                    self._ready[heapq.heappop(self._timers)[2]] = None
                self._pump(now)
                if at >= next_sweep:
                    next_sweep = at + _SWEEP_S
                    self._sweep(now, reader.done)
                if reader.done and transport.open == 0 and all(lane.finished or lane.settled
                                                               for lane in self.lanes.values()):
                    return
            wait_s = min(_IDLE_WAIT_S, abort_at - at) if stopping else self._wait_s(at, deadline, next_sweep, reader)
            if transport.open:
                for token, result in transport.poll(wait_s):
                    if token not in self._open:
                        continue  # aborted: its answer, however late, never counts (the transport drops it too)
                    del self._open[token]
                    lane, delivery, started_at = token
                    lane.answer(delivery, started_at, result, Instant(clock(), wall_clock_ms()))
                    if not stopping:
                        self._ready[lane] = None
            elif wait_s > 0:
                if not stopping and not reader.done and self._room_to_read():
                    reader.wait(wait_s)
                else:
                    self.sleep(wait_s)
            if self._no_room and transport.open < transport.max_open:
                self._ready.update(self._no_room)
                self._no_room.clear()

    def _wait_s(self, at: float, deadline: float, next_sweep: float, reader: Prefetcher) -> float:
        """How long the loop may wait before it has something to do (seconds; `at`: now, monotonic seconds)."""
        if self._ready:
            return 0.0
        wait_s = min(deadline - at, next_sweep - at, _IDLE_WAIT_S)
        if self._timers:
            wait_s = min(wait_s, self._timers[0][0] - at)
        if not reader.done and self._room_to_read():
            wait_s = min(wait_s, _INPUT_POLL_S)
        return max(wait_s, 0.0)

    def _pump(self, now: Instant) -> None:
        """Let every ready lane admit rows and start due attempts."""
        transport = self.transport
        ready, self._ready = self._ready, {}
        for lane in ready:
            if lane.settled:
                continue
            self._release(lane.admit(now))
            room = transport.max_open - transport.open
            wake_at, _ = lane.dispatch(now, room, self._start)
            if wake_at is None:
                continue
            if wake_at <= now.s:  # the transport is full
                self._no_room[lane] = None
            else:
                heapq.heappush(self._timers, (wake_at, next(self._sequence), lane))

    def _sweep(self, now: Instant, input_done: bool) -> None:
        """Close flow windows; settle lanes that have had nothing but retries for `park_after_s`, and lanes whose
        subscription was suspended, removed or edited since the round was planned (as at the deadline)."""
        versions = self._control.versions() if self._control is not None else None
        for lane in self.lanes.values():
            if lane.settled:
                continue
            if versions is not None and not lane.settling and versions.get(lane.plan.subscription_id) != \
                    lane.plan.version:
                if not lane.cut:
                    self._release(lane.cut_input(self._progress))
                lane.settling = True
            lane.adjust(now)
            if input_done and lane.input_ended(now):
                self._ready[lane] = None
                continue
            if not lane.settling:
                since = lane.stalled(now, input_done)
                lane.settling = since is not None and now.s - since >= self.plan.park_after_s or (
                    self.plan.settle_throttled and lane.throttled_s(now) > self.plan.park_after_s) or (
                    lane.pin is not None and lane.pin.expired(now.ms))  # its pinned endpoint timed out
            if lane.settling and lane.open:
                grace_ends = self._grace_ends.setdefault(lane, now.s + self.plan.request_grace_s)
                if now.s >= grace_ends:
                    self._abort(lane, now)
            if lane.settling and lane.open == 0:
                self._release(lane.settle(now, self._progress, input_done))

    def _settle_all(self, now: Instant, input_done: bool) -> None:
        for lane in self.lanes.values():
            if not lane.settled:
                self._release(lane.settle(now, self._progress, input_done))

    # -- attempts ---------------------------------------------------------------------------------------------
    def _start(self, request: HttpRequest, token: Token) -> None:
        self._open[token] = None
        self.transport.start(request, token)

    def _abort(self, lane: Lane | None, now: Instant) -> None:
        """Abort the open attempts of `lane` (None: of every lane); each is a timeout to its lane, which retries
        it by its rules (its attempt counted, its backoff applied) or gives it up (its TTL, maxAttempts)."""
        for token in [token for token in self._open if lane is None or token[0] is lane]:
            del self._open[token]
            failure = self.transport.abort(token)
            if failure is None:
                raise RuntimeError("the transport lost an open attempt")  # the lane could never settle
            owner, unit, started_at = token
            owner.answer(unit, started_at, failure, now)

    # -- input ------------------------------------------------------------------------------------------------
    def _room_to_read(self) -> bool:
        return self._held_rows < self.plan.readahead_rows and self._held_bytes < self.plan.readahead_bytes

    def _read(self, reader: Prefetcher, now: Instant) -> None:
        while self._room_to_read():
            batch = reader.take()
            if batch is None:
                break
            self._feed(batch, now)
        if not self._room_to_read():
            self._relieve()

    def _feed(self, batch: InputBatch, now: Instant) -> None:
        for partition, offsets in batch.offsets.items():
            if len(offsets):
                self._offsets.setdefault(partition, []).append(offsets)
                self._progress[partition] = max(self._progress.get(partition, 0), int(offsets[-1]) + 1)
        lanes = self.lanes
        tracing = self._tracing
        for record, targets in batch.rows:
            for index in targets:
                lane = lanes.get(index)
                if lane is None or lane.cut or lane.settled:
                    continue
                if lane.take(record, now):
                    self._hold(record)
                    self._ready[lane] = None
            if tracing:
                for lane in tracing:
                    if lane.index not in targets and not lane.cut and not lane.settled:
                        lane.passed_over(record, now)
        for lane in self._batching:
            if lane.cut or lane.settled:
                continue
            for partition, offsets in batch.offsets.items():
                if len(offsets) and lane.read_through(partition, int(offsets[-1]) + 1):
                    self._ready[lane] = None

    def _relieve(self) -> None:
        """The read-ahead is full: while a lane starves for rows, cut off the lane holding the most."""
        live = [lane for lane in self.lanes.values() if not lane.cut and not lane.settled]
        while not self._room_to_read():
            if not any(not lane.pending and lane.in_flight < lane.plan.inflight for lane in live):
                return
            victim = max(live, key=lambda lane: len(lane.pending))
            if not victim.pending:
                return
            self._release(victim.cut_input(self._progress))
            live.remove(victim)

    def _hold(self, record: Record) -> None:
        key = id(record)
        count = self._holders.get(key, 0)
        if count == 0:
            self._held_rows += 1
            self._held_bytes += record.size
        self._holders[key] = count + 1

    def _release(self, records: list[Record]) -> None:
        for record in records:
            key = id(record)
            count = self._holders[key] - 1
            if count:
                self._holders[key] = count
            else:
                del self._holders[key]
                self._held_rows -= 1
                self._held_bytes -= record.size

    # -- report -----------------------------------------------------------------------------------------------
    def _report(self, exhausted: bool) -> TaskReport:
        now = Instant(self.clock(), self.wall_clock_ms())
        offsets = {p: np.concatenate(arrays) for p, arrays in self._offsets.items()}
        report = TaskReport(task=uuid.uuid4().hex, progress=dict(self._progress), exhausted=exhausted,
                            firsts={p: int(values[0]) for p, values in offsets.items() if len(values)},
                            gaps={p: _gaps(values) for p, values in offsets.items() if len(values) > 1},
                            control_unreachable=self._control is not None and self._control.unreachable)
        for index, lane in self.lanes.items():
            lane.report.forget_rereads()
            lane_report = lane.report
            lane_report.counters.read = _rows_gone_through(offsets, lane.plan.starts, lane_report.stops, lane.cut)
            lane_report.counters.finished_ms = now.ms
            next_free = lane.cap.carried  # carried on as epoch ms, rounded up (0: none)
            permit_in_ms = math.ceil((next_free - now.s) * 1000) if math.isfinite(next_free) else 0
            lane_report.flow_state = lane.flow.state(now.s, max(permit_in_ms, 0))  # a duration: clocks differ
            report.lanes[index] = lane_report
        return report


def _gaps(offsets: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) ranges missing between consecutive offsets read (ascending), up to `MAX_GAPS`."""
    jumps = np.nonzero(np.diff(offsets) > 1)[0][:MAX_GAPS]
    return [(int(offsets[i]) + 1, int(offsets[i + 1])) for i in jumps]


def _rows_gone_through(offsets: dict[int, np.ndarray], starts: dict[int, int], stops: dict[int, int],
                       cut: bool) -> int:
    """Rows of the task's input in [start, stop) per partition (a cut lane did not reach unlisted partitions)."""
    total = 0
    for partition, values in offsets.items():
        if cut and partition not in stops:
            continue
        low = int(np.searchsorted(values, starts.get(partition, -1), side="left"))
        high = int(np.searchsorted(values, stops[partition], side="left")) if partition in stops else len(values)
        total += max(0, high - low)
    return total
