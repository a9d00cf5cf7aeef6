"""A topic's catch-up rounds are written as `catchup:<run>:<topic>` slices: a topic started again within the run
(a new pipeline and `CatchUp` after an edit, a failure or a regroup) must not reuse an earlier round's id, or its
rows would replace that round's undelivered and parked rows in the tables."""

from __future__ import annotations

from types import SimpleNamespace

from herald.engine.triggers.catchup import CatchUp


def test_a_topics_catch_up_started_again_never_reuses_a_round_id():
    pipeline = SimpleNamespace(kafka_topic="orders")
    first, again = CatchUp(pipeline), CatchUp(pipeline)
    ids = [first.next_round_id(), first.next_round_id(), again.next_round_id(), again.next_round_id(),
           first.next_round_id()]
    assert len(set(ids)) == len(ids), ids
    assert ids == sorted(ids)
