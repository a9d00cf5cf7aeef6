"""Which of a micro-batch's topic rounds share its delivery job
(`herald.engine.triggers.shared_read.shared_job_rounds`): the small JSON ones, smallest first, up to a bound on their
offsets; AVRO topics and what does not fit alone."""

from __future__ import annotations

import types

from herald.config.model import ContentType
from herald.engine.triggers.shared_read import shared_job_rounds


def round_of(name: str, offsets: int, content: ContentType = ContentType.JSON):
    pipeline = types.SimpleNamespace(kafka_topic=name, topic=types.SimpleNamespace(contentType=content))
    return pipeline, {0: (100, 100 + offsets // 2), 1: (7, 7 + offsets - offsets // 2)}


def names(rounds) -> list[str]:
    return [pipeline.kafka_topic for pipeline, _ in rounds]


def test_json_rounds_join_smallest_first_while_they_fit_and_avro_runs_alone():
    rounds = [round_of("big", 900), round_of("a", 10), round_of("avro", 5, ContentType.AVRO), round_of("b", 300),
              round_of("c", 600)]
    together, alone = shared_job_rounds(rounds, max_offsets=1000)
    assert names(together) == ["a", "b", "c"]  # 10 + 300 + 600; "big" would pass 1000
    assert sorted(names(alone)) == ["avro", "big"]
    assert sorted(names(together + alone)) == sorted(names(rounds)), "every round runs, once"


def test_a_single_round_that_fits_is_no_shared_job():
    rounds = [round_of("a", 10), round_of("huge", 5000), round_of("avro", 1, ContentType.AVRO)]
    together, alone = shared_job_rounds(rounds, max_offsets=1000)
    assert together == [] and alone == rounds


def test_rounds_with_empty_ranges_cost_nothing_against_the_bound():
    rounds = [round_of("a", 1000), round_of("b", 0), round_of("c", 0)]
    together, _ = shared_job_rounds(rounds, max_offsets=1000)
    assert names(together) == ["b", "c", "a"]
