"""The job's shared read: one streaming query for all the Kafka topics it delivers.

A topic costs its rows, not a query of its own: one micro-batch loop, one source (one planner process for the
Python source) and one checkpoint for the whole job, subscribed to the list of its topics. Each micro-batch's
end offsets are logged per topic in the checkpoint; each topic's pipeline (`TopicPipeline`) delivers its own
range of the batch to its own subscriptions. When several topics have records in a batch, the batch's rows are
read once into Spark's cache (a failure there fails the query: `Topics` finds the topic to blame). The rounds of
JSON topics, up to `SHARED_JOB_MAX_OFFSETS` offsets in all, then share one Spark job: one projection
of their rows (each topic's filters applied to its rows only), partitioned by topic, a Python task delivering
each topic's rows whole with the topic's own plan. A Spark job and a Python task per topic cost ~0.2 s of 2
cores each (tests/benchmarks/README.md, `topic_rounds.py`), more than a small round's sending. Larger rounds and
AVRO topics (each decoded with its own schemas) read their rows from the cache in a job of their own, at the
same time (`MAX_TOPIC_ROUNDS` threads). A topic with nothing new in a batch costs nothing. A topic's round that
fails leaves its subscriptions behind the frontier, to catch up on that range, and the other topics' rounds go
on; when the shared job fails, each of its topics delivers the batch in a job of its own.

The set of topics read is fixed for a query. When it changes (a topic added, removed or edited, a topic that
failed and left the read, or came back), `Topics` stops this read after the micro-batch in progress and
starts another over the new set, with a checkpoint of its own (`<storage>/checkpoints/read/<digest of the
set>`), at each topic's frontier (where this one had delivered it to); a topic new to the read starts at the
highest position of its subscriptions, and those behind catch up. At the job's start, the checkpoint of the
same set is taken up where the last run left it. Positions are the offsets table: a checkpoint only says where
the query goes on from, so starting one afresh loses nothing. See docs/design.md §2.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import threading
import time

from pyspark.sql import functions as F

from herald.config.model import ContentType
from herald.engine.context import EngineContext
from herald.engine.round.fanout import reports_by_round
from herald.engine.round.projection import project_topics
from herald.engine.round.resets import past_the_log
from herald.engine.round.steps import input_partitions
from herald.engine.round.task import ROUND, ROUNDS_REPORT_DDL, rounds_task
from herald.engine.triggers import checkpoint as checkpoints
from herald.engine.triggers.supervision import outage, short_error
from herald.source.kafka_offsets import partition_watermarks, topic_ids
from herald.source.stream import open_kafka_stream

log = logging.getLogger(__name__)

MAX_TOPIC_ROUNDS = 8  # topics' rounds of one micro-batch planned, run alone or recorded at the same time
SHARED_JOB_MAX_OFFSETS = 20_000
"""Most offsets of a micro-batch in its shared delivery job, all its topics together: the JSON topics' rounds join
it smallest first while they fit; the others run in jobs of their own. A task of the shared job reads its input
whole before it delivers (each round's rows to its own sender), so this bounds its memory; a round in it is
delivered by one task (a larger one runs in a job of its own, over several tasks)."""


def shared_job_rounds(rounds: list, max_offsets: int) -> tuple[list, list]:
    """(together, alone): which of a batch's topic rounds (pipeline, ranges) share its delivery job, and which run
    in jobs of their own. JSON topics join smallest first while their offsets add up to at most `max_offsets`;
    AVRO topics (decoded with their own schemas) and what does not fit run alone; a job for one round is no
    shared job."""
    together, alone, offsets = [], [], 0
    for pipeline, ranges in sorted(rounds, key=lambda item: sum(end - start for start, end in item[1].values())):
        size = sum(end - start for start, end in ranges.values())
        if pipeline.topic.contentType is not ContentType.AVRO and offsets + size <= max_offsets:
            together.append((pipeline, ranges))
            offsets += size
        else:
            alone.append((pipeline, ranges))
    if len(together) < 2:
        return [], list(rounds)
    return together, alone


def read_root(storage_path: str) -> str:
    return f"{storage_path.rstrip('/')}/checkpoints/read"


def read_checkpoint(storage_path: str, kafka_topics) -> str:
    """The checkpoint of a read of `kafka_topics` (any order): one per set of topics."""
    digest = hashlib.sha1("\n".join(sorted(set(kafka_topics))).encode()).hexdigest()[:16]
    return f"{read_root(storage_path)}/{digest}"


class SharedRead:
    """One streaming query over the Kafka topics of `pipelines` (Kafka topic -> `TopicPipeline`).

    resume: take up this set's checkpoint where it is (the job's first read, or the same set started again after
    a failure); otherwise a checkpoint left from an earlier read of the same set is stale and starts afresh."""

    def __init__(self, context: EngineContext, pipelines: dict, resume: bool) -> None:
        self.context = context
        self.pipelines = dict(pipelines)
        self.kafka_topics = sorted(self.pipelines)
        self.checkpoint = read_checkpoint(context.config.storage_path, self.kafka_topics)
        self.resume = resume
        self.query = None
        self.start_error: str | None = None  # why the query could not start
        self.healthy = False  # completed a micro-batch since it started
        self.closing = False  # a micro-batch starting from now on delivers nothing (the read is being replaced)
        self.gone: dict[str, str] = {}  # Kafka topic -> why it is not read any more (deleted from Kafka)
        self.failure_handled = False  # `Topics` has dealt with this read's failure
        self.writers: dict[str, str] = {}  # Kafka topic -> its rounds' writer: stream:<query id>:<kafka topic>
        self._first_start: dict[str, dict[int, int]] | None = None
        self.replayable_through: int | None = None  # `may_replay`; None until `start` reads the checkpoint
        self._started = threading.Event()
        self._idle = threading.Event()  # no micro-batch is being delivered
        self._idle.set()

    # -- starting and stopping ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the query: from this set's checkpoint (resume), else at each topic's frontier or, for a topic
        new to the read, at the highest position of its subscriptions. Raises when Kafka cannot say where."""
        context, settings = self.context, self.context.config.settings
        if not self.resume:
            checkpoints.remove(context.spark, self.checkpoint, must=True)
        logged = checkpoints.last_logged(context.spark, self.checkpoint)
        resuming = logged is not None
        self.replayable_through = logged if resuming else -1
        marks = partition_watermarks(context.client_config, self.kafka_topics)  # raises for a topic Kafka lacks
        ids = topic_ids(context.client_config, self.kafka_topics)
        committed = self._committed() if resuming else {}
        # the last micro-batch Spark logged, replayed first: planned on a log that went back since, it would end
        # past Kafka's end, and its replay put the read's frontier there
        planned = (checkpoints.logged_topics(context.spark, self.checkpoint, logged) or {}) if resuming else {}
        stale = []
        for topic, pipeline in self.pipelines.items():  # a topic created again, or cut (engine/round/resets.py)
            kept = pipeline.check_log(marks[topic], ids.get(topic), committed.get(topic))
            replay_past = past_the_log(planned.get(topic, {}), marks[topic])
            if (kept is not None and kept != committed.get(topic)) or replay_past:
                stale.append(topic)
        if stale:  # where it left off is past the end of a log that is gone: a new read starts at the positions
            log.warning("the read's checkpoint is past the end of %s (its log went back): a new one starts",
                        ", ".join(stale))
            checkpoints.remove(context.spark, self.checkpoint, must=True)
            resuming, committed, self.replayable_through = False, {}, -1
        starting = {topic: pipeline.starting_offsets(marks[topic]) for topic, pipeline in self.pipelines.items()}
        if not resuming:
            self._first_start = starting
        for topic, pipeline in self.pipelines.items():
            pipeline.joined(self, committed.get(topic) or starting[topic])
        raw = open_kafka_stream(
            context.spark, context.connector, settings.kafka.bootstrapServers, settings.kafka.properties,
            ",".join(self.kafka_topics),
            json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())} for topic, offsets in starting.items()}),
            settings.streaming.maxOffsetsPerTrigger,
        )
        writer = (raw.writeStream.queryName("herald:read").option("checkpointLocation", self.checkpoint)
                  .foreachBatch(self.handle_batch))
        if context.once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=settings.streaming.triggerInterval)
        self.query = writer.start()
        # the checkpoint's query id: the same after a restart (set before the first micro-batch reads it)
        self.writers = {topic: f"stream:{self.query.id}:{topic}" for topic in self.pipelines}
        self._started.set()
        log.info("one query reads %d topic(s) for %d subscription(s)%s", len(self.kafka_topics),
                 sum(len(p.states) for p in self.pipelines.values()),
                 " (from its checkpoint)" if resuming else "")

    def may_replay(self, batch_id: int) -> bool:
        """True when micro-batch `batch_id` may have run before, in full or in part, under this query's id (and so
        its rounds' slices may hold rows): it was logged in the checkpoint before this query started (Spark runs
        a logged batch again until it is committed). A batch this query logged itself never ran before, so its
        rounds are new to the tables and are appended (`TableWriter.submit`)."""
        return self.replayable_through is None or batch_id <= self.replayable_through

    def _committed(self) -> dict[str, dict[int, int]]:
        last = checkpoints.last_committed(self.context.spark, self.checkpoint)
        if last is None:
            return {}
        return checkpoints.logged_topics(self.context.spark, self.checkpoint, last) or {}

    def failure(self) -> str | None:
        """Why the query is not running (it failed, or could not start), or None."""
        if self.start_error is not None:
            return self.start_error
        query = self.query
        if query is not None and not query.isActive:
            error = query.exception()
            if error is not None:
                return short_error(error)
        return None

    def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait until no micro-batch is being delivered (None: as long as it takes); False at the timeout."""
        return self._idle.wait(timeout_s)

    def stop(self) -> None:
        """Deliver no micro-batch from now on and stop the query (a topic's round in progress goes on: wait for
        it with `wait_idle` first)."""
        self.closing = True
        query = self.query
        if query is not None and query.isActive:
            query.stop()

    # -- micro-batches -------------------------------------------------------------------------------------------
    def handle_batch(self, batch_df, batch_id: int) -> None:
        """`foreachBatch`: each topic with records in the batch delivers its range, all at the same time."""
        self._started.wait()
        self._idle.clear()
        try:
            if self.closing:  # its rows stay behind every frontier: the next read (or catch-up) reads them again
                log.info("micro-batch %d: not delivered, the read is being stopped", batch_id)
                return
            self._deliver_all(batch_df, batch_id)
            self.healthy = True
        finally:
            for pipeline in self.pipelines.values():  # where the batch's ends were held after a reset
                try:
                    pipeline.settle_frontier()
                except Exception:  # noqa: BLE001 - the next micro-batch moves the frontier
                    log.exception("%s: after micro-batch %d", pipeline.kafka_topic, batch_id)
            self._idle.set()

    def _deliver_all(self, batch_df, batch_id: int) -> None:
        spark = self.context.spark
        ends = checkpoints.logged_topics(spark, self.checkpoint, batch_id)
        if ends is None:
            raise RuntimeError(f"micro-batch {batch_id} is not in {self.checkpoint}/offsets")
        previous = checkpoints.logged_topics(spark, self.checkpoint, batch_id - 1) if batch_id > 0 else None
        rounds = []
        for topic, pipeline in self.pipelines.items():
            if topic not in ends:
                if topic not in self.gone:
                    log.error("%s is not read any more (deleted from Kafka?): it leaves the shared read", topic)
                self.gone[topic] = f"Kafka topic(s) do not exist: {topic} (no longer in the source's offsets)"
                continue
            if pipeline.went_back(ends[topic]):  # created again, or cut: Kafka says (engine/round/resets.py)
                marks = partition_watermarks(self.context.client_config, [topic])[topic]
                pipeline.check_log(marks, topic_ids(self.context.client_config, [topic]).get(topic))
            before = None if previous is None else previous.get(topic)  # not logged: its start is unknown
            first = self._first_start.get(topic) if self._first_start is not None and batch_id == 0 else None
            ranges = pipeline.listed(checkpoints.ranges_between(ends[topic], before, first))
            if any(start < end for start, end in ranges.values()):
                rounds.append((pipeline, ranges))
            else:  # nothing of it in this batch (nor, if it replays one, in the batch it replays)
                pipeline.passed(ranges)
        filtered = len(self.pipelines) > 1
        shared = len(rounds) > 1
        if shared:  # read from Kafka once, here (a failure fails the query), then each topic from the cache
            _, alone = shared_job_rounds(rounds, SHARED_JOB_MAX_OFFSETS)
            if not alone:  # all of it goes to the one shared job: read it in as many tasks as run at once, not a
                # task per Kafka partition (40 topics of 2: 80 tasks, each scheduled, run and reported for a few
                # rows). A fallback round of its own then runs in at most as many tasks as its plan has.
                batch_df = batch_df.coalesce(self.context.parallelism)
            batch_df = batch_df.persist()
        try:
            if shared:
                batch_df.count()  # a failed read leaves no cache behind (`finally`)
                self._deliver_many(rounds, batch_df, batch_id)
            elif rounds:
                pipeline, ranges = rounds[0]
                self._deliver(pipeline, batch_df, batch_id, ranges, filtered)
        finally:
            if shared:
                batch_df.unpersist()

    def _deliver(self, pipeline, batch_df, batch_id: int, ranges, filtered: bool) -> None:
        """One topic's round of the batch, in a Spark job of its own. A round that fails leaves its subscriptions
        behind the frontier: they catch up on the range, and the other topics' rounds are not affected. A round
        not started when the read is being stopped is not started: the next read starts the topic at its
        frontier, before this range."""
        if self.closing:
            return
        try:
            rows = batch_df
            if filtered:  # its rows, in as many partitions as it has ranges: not a (Python) task per batch partition
                rows = batch_df.where(F.col("topic") == pipeline.kafka_topic).coalesce(input_partitions(ranges))
            pipeline.deliver_batch(rows, batch_id, ranges, self.writers[pipeline.kafka_topic],
                                   may_replay=self.may_replay(batch_id))
        except Exception as error:  # noqa: BLE001 - this topic's subscriptions catch up; the others go on
            self._round_failed(pipeline, batch_id, ranges, error)

    def _deliver_many(self, rounds, batch_df, batch_id: int) -> None:
        """Several topics' rounds of the batch: the small rounds of JSON topics together in one Spark job
        (`_deliver_together`), the others each in a job of its own, at the same time."""
        together, alone = shared_job_rounds(rounds, SHARED_JOB_MAX_OFFSETS)
        with concurrent.futures.ThreadPoolExecutor(min(max(len(alone), 1), MAX_TOPIC_ROUNDS),
                                                   thread_name_prefix="herald-topic") as pool:
            running = [pool.submit(self._deliver, pipeline, batch_df, batch_id, ranges, True)
                       for pipeline, ranges in alone]
            if together:
                with concurrent.futures.ThreadPoolExecutor(min(len(together), MAX_TOPIC_ROUNDS),
                                                           thread_name_prefix="herald-shared") as shared_pool:
                    self._deliver_together(together, batch_df, batch_id, shared_pool)
            for future in running:
                future.result()

    def _deliver_together(self, rounds, batch_df, batch_id: int, pool) -> None:
        """Small rounds of JSON topics in one Spark job: each topic's round is planned (`TopicPipeline.begin_batch`),
        their rows projected together (`project_topics`) and partitioned by topic, so a topic's rows are in one
        task, delivered with its own plan (`task.rounds_task`), and each round is recorded (`finish_batch`). A
        round that cannot be planned or recorded fails alone (its subscriptions catch up). When the job fails, no
        round of it is recorded: each is abandoned and its topic delivers the batch in a job of its own."""
        def begin(item):
            pipeline, ranges = item
            if self.closing:
                return None
            try:
                return pipeline.begin_batch(batch_id, ranges, self.writers[pipeline.kafka_topic], tasks=1,
                                            may_replay=self.may_replay(batch_id))
            except Exception as error:  # noqa: BLE001 - this topic's subscriptions catch up; the others go on
                self._round_failed(pipeline, batch_id, ranges, error)
                return None

        started = time.monotonic()
        begun, begin_error = [], None
        for (pipeline, ranges), future in [(item, pool.submit(begin, item)) for item in rounds]:
            try:  # every begun round is collected, so that each ends in finish_batch or abandon_batch
                batch = future.result()
            except BaseException as error:  # noqa: BLE001 - `begin` lets only these through: raised below
                begin_error = begin_error or error
                continue
            if batch is not None:
                begun.append((pipeline, ranges, batch))
        sending = [(pipeline, batch) for pipeline, _, batch in begun if batch.plan is not None]
        reports: dict[int, list] = {}
        try:
            if begin_error is not None:
                raise begin_error
            if sending:
                # The projection in as many tasks as run at once, not one per Kafka partition of the batch: its
                # filters fall out of whole-stage code generation (from_json has none), so every task generates
                # the code of every topic's filters again (40 topics on 80 partitions: 2.6 s against 0.3 s).
                rows = project_topics(batch_df.coalesce(self.context.parallelism), self.context.config,
                                      [(pipeline.topic, batch.subscriptions) for pipeline, batch in sending])
                rows = (rows.repartition(min(len(sending), self.context.parallelism), ROUND)
                        .sortWithinPartitions(ROUND, "partition", "offset"))
                table = rows.mapInArrow(rounds_task([batch.plan for _, batch in sending]), ROUNDS_REPORT_DDL).toArrow()
                by_round = reports_by_round(table, len(sending))
                reports = {id(batch): found for (_, batch), found in zip(sending, by_round)}
        except BaseException as error:
            abandoned = self._abandon(begun, batch_id)
            if not isinstance(error, Exception) or error is begin_error:
                raise
            log.warning("micro-batch %d: the delivery job of %d topics failed; each delivers the batch in a job of "
                        "its own", batch_id, len(sending), exc_info=error)
            list(pool.map(lambda item: self._deliver(item[0], batch_df, batch_id, item[1], True), abandoned))
            return
        if sending:
            log.info("micro-batch %d: %d topics delivered in one job in %.1f s", batch_id, len(sending),
                     time.monotonic() - started)

        def finish(item):
            pipeline, ranges, batch = item
            try:
                pipeline.finish_batch(batch, lambda: reports[id(batch)])
            except Exception as error:  # noqa: BLE001 - this topic's subscriptions catch up; the others go on
                self._round_failed(pipeline, batch_id, ranges, error)

        list(pool.map(finish, begun))

    def _abandon(self, begun, batch_id: int) -> list:
        """`abandon_batch` for every begun round, each on its own; the rounds abandoned (pipeline, ranges, batch).
        A round that could not be abandoned fails (its subscriptions catch up) and is not delivered again here;
        the first BaseException is raised once every round has been tried."""
        abandoned, interrupted = [], None
        for pipeline, ranges, batch in begun:
            try:
                pipeline.abandon_batch(batch)
                abandoned.append((pipeline, ranges, batch))
            except BaseException as error:  # noqa: BLE001 - the others must still be freed
                interrupted = interrupted or (None if isinstance(error, Exception) else error)
                self._round_failed(pipeline, batch_id, ranges, error)
        if interrupted is not None:
            raise interrupted
        return abandoned

    @staticmethod
    def _round_failed(pipeline, batch_id: int, ranges, error: BaseException) -> None:
        reason = short_error(error)
        if outage(reason):  # expected, and retried: one line
            log.warning("%s micro-batch %d failed; its subscriptions catch up on it: %s", pipeline.kafka_topic,
                        batch_id, reason)
        else:
            log.error("%s micro-batch %d failed; its subscriptions catch up on it", pipeline.kafka_topic, batch_id,
                      exc_info=error)
        pipeline.round_failed(ranges, reason)
