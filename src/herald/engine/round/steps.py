"""One round, whatever started it: planned, delivered and recorded the same way.

Three things start rounds (docs/design.md §3): a micro-batch of a topic's shared query (`batch`), a catch-up read
of a subscription group behind it (`catchup`), and a batch of parked retries (`retry_driver`). One owner runs
every round's steps in order, with their failure rules (`owner.Round`); the steps' helpers are here:

1. `participants`: the subscriptions taking part, each with its `LanePlan` (`planner.lane_plan`);
2. `task_plan`: the one `TaskPlan` the tasks get;
3. `deliver`: for a Kafka read, the rows projected once for every participant (`projection`), delivered in
   Spark tasks (`fanout`; the topics of a micro-batch share a job: `herald.engine.triggers.shared_read`), and
   turned into each participant's `SubscriptionOutcome`, positions and offsets Kafka deleted before they were
   read included (`lost_in`). A retry round delivers its parked messages on the driver instead
   (`retry_driver`);
4. (the round's source takes the outcomes into its states, `owner.RoundSource.take`), and `release_pins`;
5. `record`: the round's rows handed to the table writer, positions last; then its parked messages to the
   retry driver, and the round to its listeners (Prometheus, dead letters).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from herald.config import Subscription
from herald.config.model import Topic
from herald.delivery.plan import LanePlan, TaskPlan
from herald.engine.context import EngineContext
from herald.engine.endpoints.pin_group import Pin
from herald.engine.endpoints.priority_groups import HELD
from herald.engine.round.fanout import Participant, outcomes, run_round
from herald.engine.round.planner import lane_plan
from herald.engine.round.positions import Lost, holes, lost_ranges, unread_ranges
from herald.engine.round.projection import project
from herald.engine.round.result import RoundResult, SubscriptionOutcome, table_rows, urgent
from herald.engine.round.state import SubscriptionState
from herald.source.kafka_offsets import partition_watermarks
from herald.storage import Slice

log = logging.getLogger(__name__)

Ranges = dict[int, tuple[int, int]]


def participants(context: EngineContext, states: Iterable[tuple[int, SubscriptionState]],
                 parked_count: Callable[[str], int] | None = None,
                 plan: Callable[[SubscriptionState, Pin | str | None, list | None], LanePlan] | None = None,
                 wait: Callable[[SubscriptionState], None] | None = None) -> list[Participant]:
    """Each (index in the rows' `targets`, state) with the plan of its share of the round. A pinned
    subscription takes part with its pin (the caller's `release_pins` gives it back when the round ends), or,
    while its pin changes hands, sits the round out: it is no longer busy and stays behind (it catches up). So
    does a subscription with no endpoint discovered (docs/design.md §7); one with some is planned with its set
    as it is now. `plan(state, pin, endpoints)`: its `LanePlan` (None: the reading path's, with `parked_count`
    of its slots held by parked retries); `wait(state)`: told of each one that sits the round out (a retry
    round postpones its messages)."""
    states = list(states)
    chosen: list[Participant] = []
    try:
        for index, state in states:
            endpoints = context.endpoints_of(state.subscription)
            if endpoints is not None and not endpoints:  # none discovered: it waits
                state.busy = False
                if wait is not None:
                    wait(state)
                continue
            pin = context.priority.lease(state.subscription)
            if pin == HELD:
                state.busy = False
                if wait is not None:
                    wait(state)
                continue
            if isinstance(pin, Pin):
                state.pinned_to(pin.pin_id)
            try:
                lane = plan(state, pin, endpoints) if plan is not None else lane_plan(
                    state, context.flow_settings, parked_count(state.id), providers=context.oauth_providers,
                    pin=pin, endpoints=endpoints, former=context.former_endpoint)
            except BaseException:
                context.priority.release(state.id, pin, None)
                raise
            chosen.append(Participant(index, state, lane, pin))
    except BaseException:  # nothing was planned: no state stays busy, no pin stays leased
        release_pins(context, chosen, ())
        for _, state in states:
            state.busy = False
        raise
    return chosen


def release_pins(context: EngineContext, members: Iterable[Participant],
                 results: Iterable[SubscriptionOutcome]) -> None:
    """The round is over (delivered or failed): give its pins back, with what it saw of the pinned endpoints. A
    pin that cannot be given back is logged and never stops the round from being recorded."""
    news = {result.subscription.id: result.pin_news for result in results}
    for member in members:
        try:
            context.priority.release(member.state.id, member.pin, news.get(member.state.id))
        except Exception:  # noqa: BLE001 - the round's outcome is in its states already: it must be recorded
            log.exception("%s: its pin could not be given back after the round", member.state.id)


def task_plan(context: EngineContext, kafka_topic: str, lanes: dict[int, LanePlan], tasks: int = 1,
              shared: bool = False) -> TaskPlan:
    """What every task of the round gets. `shared`: the topic's shared query, where a throttled subscription
    settles early rather than hold back the others (`TaskPlan.settle_throttled`)."""
    settings = context.config.settings
    return TaskPlan(
        topic=kafka_topic,
        lanes=lanes,
        budget_s=settings.streaming.batch_deadline_s,
        tasks=tasks,
        park_after_s=settings.streaming.park_after_s,
        request_grace_s=settings.streaming.request_grace_s,
        settle_throttled=shared,
        transport=settings.delivery.transport,
        max_open=settings.delivery.maxOpenRequests,
        flush_batches=context.once,
        control_url=context.control_url,
        control_poll_s=settings.streaming.config_poll_s,
    )


def input_partitions(ranges: Ranges) -> int:
    """Partitions with something to read (at least 1)."""
    return max(1, sum(1 for start, end in ranges.values() if start < end))


def round_tasks(ranges: Ranges, max_tasks: int, members: list[Participant], shared: bool) -> int:
    """How many tasks deliver a round: one per partition with something to read, at most `max_tasks`; outside
    the shared read, also at most the smallest inflight of a member that takes new messages. Each task takes
    its share of a subscription's inflight (`LanePlan.share`), and a task whose share is 0 takes nothing for it:
    an ordered subscription (inflightSize 1) over two partitions would never move the second in catch-up, whose
    rounds split the same partitions the same way every time. (In the shared read such a subscription falls
    behind instead, and catches up here.)"""
    tasks = max(1, min(input_partitions(ranges), max_tasks))
    if not shared:
        taking = [member.plan.inflight for member in members if member.plan.inflight > 0]
        tasks = min([tasks, *taking])
    return tasks


def deliver(context: EngineContext, topic: Topic, subscriptions: list[Subscription], members: list[Participant],
            raw, ranges: Ranges, max_tasks: int, shared: bool, known_lost: Lost = ()) -> list[SubscriptionOutcome]:
    """Deliver the Kafka rows `raw` of `ranges` to `members` in Spark tasks (at most `max_tasks`); what the round
    did for each. The rows are projected for `subscriptions`, the list the members' indices point into (a row's
    `targets` are such indices): the topic's ACTIVE subscriptions, some of which may not take part.
    `known_lost`: offsets of the ranges found deleted before the read."""
    plan = round_plan(context, topic, subscriptions, members, tasks=round_tasks(ranges, max_tasks, members, shared),
                      shared=shared)
    reports = run_alone(context, topic, subscriptions, plan, raw, ranges)
    return delivered(context, topic.kafka_topic, members, ranges, reports, known_lost)


def round_plan(context: EngineContext, topic: Topic, subscriptions: list[Subscription], members: list[Participant],
               tasks: int, shared: bool) -> TaskPlan:
    """The `TaskPlan` of a round of `members`, whose indices point into `subscriptions` (checked: a row must never
    reach another subscription's lane), delivered by `tasks` tasks."""
    for member in members:
        if not (0 <= member.index < len(subscriptions)) or subscriptions[member.index] is not member.state.subscription:
            raise RuntimeError(f"round of {topic.kafka_topic}: participant {member.state.id} has index {member.index}, "
                               f"which is not its place in the projected subscriptions")
    return task_plan(context, topic.kafka_topic, {member.index: member.plan for member in members}, tasks=tasks,
                     shared=shared)


def run_alone(context: EngineContext, topic: Topic, subscriptions: list[Subscription], plan: TaskPlan, raw,
              ranges: Ranges):
    """A round's Spark job of its own: the rows `raw` projected for `subscriptions`, delivered with `plan`; the
    tasks' reports."""
    return run_round(project(raw, context.config, topic, subscriptions), plan, input_partitions(ranges))


def delivered(context: EngineContext, kafka_topic: str, members: list[Participant], ranges: Ranges, reports,
              known_lost: Lost = ()) -> list[SubscriptionOutcome]:
    """What a round of `ranges` did for each member, from its tasks' reports (offsets Kafka deleted before they
    were read included: `lost_in`)."""
    if context.on_task_reports is not None:
        context.on_task_reports(reports)
    return outcomes(members, ranges, reports, lost_in(context, kafka_topic, ranges, reports, known_lost))


def lost_in(context: EngineContext, kafka_topic: str, ranges: Ranges, reports, known: Lost = ()) -> Lost:
    """The offsets of a round's `ranges` Kafka deleted before they were read (plus `known`, found before the
    read), each logged at WARN. Kafka is asked only when some part of a range was not read; when it cannot be
    asked this raises: the round is not recorded and its messages are delivered again."""
    unread, read_around = unread_ranges(ranges, reports), holes(ranges, reports)
    lows: dict[int, int] = {}
    if unread or read_around:
        marks = partition_watermarks(context.client_config, [kafka_topic])[kafka_topic]
        lows = {p: low for p, (low, _) in marks.items()}
    lost = lost_ranges([*known, *unread], {**lows, **{p: e for p, _, e in known if p not in lows}}, read_around)
    for partition, first, end in lost:
        log.warning("%s/%d: offsets %d..%d were deleted by Kafka (retention) before they were read; recorded "
                    "as LOST in the undelivered table of each subscription that had not passed them",
                    kafka_topic, partition, first, end - 1)
    return lost


def record(context: EngineContext, result: RoundResult, duration_s: float, stamp: int,
           possible_replay: bool = False, park: Callable | None = None) -> None:
    """Hand the round's rows, stamped `stamp` (epoch ms, from its source's `take`), to the table writer
    (positions last), then its parked messages to `park` (the retry driver: after their PARKED rows, so that a
    retry round's rows about them are always written later), then tell the round's listeners. Empty tables are
    skipped and the rows appended, unless the round may replay an earlier run's (its old slices are then
    replaced, and cleared where empty). When the rows or the parked messages cannot be handed over, the job
    writes nothing more and stops (`EngineContext.unrecorded`), and this raises. A round the writer gives up
    (it is closed, or stopped at an earlier round: nothing of this round or later is written) goes no further:
    its parked messages are not retried and its listeners never hear of it (no dead letter is published for a
    DISCARDED row that is never written; the next run delivers the round's messages again)."""
    try:
        tables = table_rows(result, stamp)
        if not possible_replay:
            tables = [(table, rows) for table, rows in tables if rows.num_rows]
        # a round that cannot be a replay is new to the tables (catch-up and retry rounds have ids of this run):
        # its rows are appended
        if tables and not context.writer.submit(Slice(result.writer, result.batch_id), tables,
                                                new=not possible_replay, urgent=urgent(result)):
            return  # the writer is closed or stopped at an earlier round: the next run delivers these again
        if park is not None:
            for outcome in result.outcomes:
                if outcome.parked:
                    park(outcome.subscription, result.kafka_topic, outcome.parked)
    except BaseException as error:  # the states are past its messages: nothing later may be written
        context.unrecorded(result, error)
        raise
    context.recorded(result, duration_s)
