"""A job's rounds without Spark: the real pipeline (`TopicPipeline`), StateBook, retry driver and table writer on
delta-rs tables, with the tasks' reports made here (what Spark's tasks would return)."""

from __future__ import annotations

from collections.abc import Iterable

from herald.config import load_config
from herald.delivery.report import LaneReport, TaskReport
from herald.engine.context import EngineContext
from herald.engine.round.pipeline import TopicPipeline
from herald.engine.round.state import StateBook
from herald.engine.triggers.retry_driver import RetryDriver
from herald.storage import DeltaRsStore, TableWriter
from tests.support.herald_env import write_conf

TOPIC = "rows.topic"


def job(root, partitions: int = 12, names: Iterable[str] = ("a", "b"), fields: dict | None = None,
        marks: dict[int, tuple[int, int]] | None = None) -> TopicPipeline:
    """A topic of `partitions` partitions and its subscriptions (each with YAML `fields`) as a job starts them from
    the tables under `root` (start rows at offset 100, where the topic begins and ends, for those new to them),
    delivered by the real pipeline into delta-rs tables; rounds are written as they end."""
    conf = write_conf(root, "127.0.0.1:9", TOPIC,
                      {name: {"endpoint": "http://127.0.0.1:9/", **(fields or {})} for name in names})
    config = load_config(conf)
    store = DeltaRsStore(str(root / "storage"))
    context = EngineContext(spark=None, config=config, connector="python", store=store, writer=TableWriter(store))
    book = StateBook(store, context.writer)
    marks = marks or {p: (100, 100) for p in range(partitions)}
    states = [book.state_for(s, TOPIC, marks) for s in config.subscriptions]
    for state in states:
        book.joined(state)
    driver = RetryDriver(context)
    driver.set_active(config.subscriptions)
    return TopicPipeline(context, config.topics[TOPIC], states, driver)


def report(ranges: dict[int, tuple[int, int]], lanes, stuck: bool = False) -> TaskReport:
    """One task that read all of `ranges`. `lanes`: lane index -> its `LaneReport`, or the indices of lanes that
    finished everything, or (`stuck`) attempted nothing (their subscriber holds them back: each position stops at
    the start of its range)."""
    read = {p: (start, end) for p, (start, end) in ranges.items() if start < end}
    if not isinstance(lanes, dict):
        lanes = {i: LaneReport(stops={p: start for p, (start, _) in read.items()} if stuck else {}) for i in lanes}
    return TaskReport(progress={p: end for p, (_, end) in read.items()},
                      firsts={p: start for p, (start, _) in read.items()}, exhausted=True, lanes=lanes)


def micro_batch(pipeline: TopicPipeline, batch_id: int, ranges: dict[int, tuple[int, int]], lanes,
                may_replay: bool = False):
    """The shared read's round of micro-batch `batch_id`; the subscriptions' lanes report `lanes` (`report`)."""
    batch = pipeline.begin_batch(batch_id, ranges, f"stream:{TOPIC}", tasks=1, may_replay=may_replay)
    if batch is not None:
        pipeline.finish_batch(batch, lambda: [report(ranges, lanes)])
    return batch
