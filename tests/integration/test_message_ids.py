"""A message's id computed in the JVM (`projection.position_message_id`) is the one Python computes
(`herald.delivery.message.message_id`): the same Hermes-Message-Id whichever side made it, on every path."""

from __future__ import annotations

from pyspark.sql import functions as F

from herald.delivery.message import message_id
from herald.engine.round.projection import position_digest, position_message_id, with_position_ids


def test_the_jvm_gives_every_position_the_id_python_gives_it(spark):
    positions = [(partition, offset) for partition in (0, 1, 7, 31, 100) for offset in
                 (0, 1, 9, 10, 99, 255, 4096, 65_535, 1_000_003, 2**31 + 5, 2**53 + 1, 2**62)]
    positions += [(3, offset) for offset in range(2_000)]  # every hex digit in every place, many times over
    for topic in ("orders", "demo.orders_v2-EU", "a" * 200, "it's\\odd"):  # not Kafka's, but SQL-quoted
        frame = spark.createDataFrame(positions, "partition int, offset long")
        rows = position_message_id(topic, frame).withColumnRenamed("position_id", "id").collect()
        wrong = [(row["partition"], row["offset"], row["id"]) for row in rows
                 if row["id"] != message_id(topic, row["partition"], row["offset"], None)]
        assert not wrong and len(rows) == len(positions), (topic, wrong[:3])


def test_an_id_header_still_wins_and_rows_that_go_nowhere_carry_none(spark):
    """The JVM column only stands in for the position's id: the delivery tasks take an `id` header first."""
    from herald.delivery.input import arrow_input

    frame = spark.createDataFrame(
        [(0, 5, [("id", bytearray(b"from-the-publisher"))], [0]), (0, 6, [], [0]), (0, 7, [], [])],
        "partition int, offset long, headers array<struct<key:string,value:binary>>, targets array<int>")
    frame = frame.select("*", F.current_timestamp().alias("timestamp"), F.lit(b"{}").alias("value"),
                         F.when(F.size("targets") > 0, position_digest("t")).alias("position_id"))
    frame = with_position_ids(frame)
    batch = frame.coalesce(1).toArrow().combine_chunks().to_batches()[0]
    assert batch.column("position_id").to_pylist()[2] is None
    (converted,) = list(arrow_input([batch], "t", [0], every_row=True))
    ids = {record.offset: record.message_id for record, _ in converted.rows}
    assert ids == {5: "from-the-publisher", 6: message_id("t", 0, 6, None), 7: message_id("t", 0, 7, None)}


def test_the_projection_hashes_each_row_once(spark):
    frame = spark.createDataFrame([(0, 1, [0])], "partition int, offset long, targets array<int>")
    frame = with_position_ids(frame.select("*", F.when(F.size("targets") > 0, position_digest("t"))
                                           .alias("position_id")))
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert plan.count("sha1(") == 1, plan
