"""Storage given as a URI (`file://` here, as `s3a://` or `dbfs:` on a cluster): the read's checkpoint
is read through Spark's Hadoop client, so where the query stands is known there too (issue: nothing lost,
nothing stuck)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from herald.config import load_config
from herald.engine.round.state import stored_positions
from herald.engine.runner import Runner
from herald.engine.triggers.shared_read import read_checkpoint
from herald.engine.upkeep.moves import plan_move, record_move
from herald.storage import DeltaRsStore
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


@pytest.mark.parametrize("form", ["file://", "file:"], ids=["file-uri", "hadoop-file"])
def test_a_subscription_moved_back_on_an_idle_topic_is_delivered_again_with_a_file_uri_checkpoint(
        broker, spark, topic_name, tmp_path, form):
    """The topic is idle at the second run: only the checkpoint says the query is at offset 10. `b` was moved
    back to 0 (a retransmission) between the runs, so it is behind the query and --once delivers it again.
    Both forms the configuration accepts: `file:///x`, and Hadoop's `file:/x` (its checkpoint was read as a
    relative path `file:/x/...`, and every micro-batch failed)."""
    broker.create_topics({topic_name: 1})
    storage = f"{form}{tmp_path / 'remote'}"
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "a": {"endpoint": f"{sub.url}/a"}, "b": {"endpoint": f"{sub.url}/b"}},
            settings={"storage": {"path": storage}})
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10)])
        config = load_config(conf)
        assert config.storage_path == storage
        assert Runner(config, spark=spark).run(once=True) == 0
        checkpoint = read_checkpoint(str(tmp_path / "remote"), [topic_name])
        assert (Path(checkpoint) / "commits").is_dir(), "the read's checkpoint is written under the storage URI"
        store = DeltaRsStore(storage)
        current = stored_positions(store)[(f"{topic_name}.b", topic_name)]
        record_move(store, plan_move({"bootstrap.servers": broker.bootstrap_servers}, f"{topic_name}.b", topic_name,
                                     current, dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)))
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    received = {path: sorted(r.json()["i"] for r in sub.requests if r.path == path) for path in ("/a", "/b")}
    assert received == {"/a": list(range(10)), "/b": sorted([*range(10)] * 2)}
