"""Assemblies on their own (herald.delivery.assembly): what a SERIAL or BATCH lane waits for when nothing fresh
is left (`Stuck`), and what it hands back at its end. No lane, no transport: a sink records the units."""

from __future__ import annotations

from herald.delivery.assembly import Assembly, Batched, Serial, Stuck
from herald.delivery.choice import EveryEndpoint, OneEndpoint
from herald.delivery.clock import Instant
from herald.delivery.spec import BatchSpec
from herald.delivery.unit import Unit
from tests.support.delivery import lane_plan, record

NOW = Instant(100.0, 1_800_000_000_000)


class Recorder:
    """A UnitSink that keeps what it was told."""

    def __init__(self) -> None:
        self.made: list[Unit] = []
        self.startable: list[Unit] = []

    def created(self, unit: Unit) -> None:
        self.made.append(unit)

    def ready(self, unit: Unit) -> None:
        self.startable.append(unit)


def test_both_assemblies_have_what_the_lane_asks_of_an_assembly():
    wanted = {name for name in (*vars(Assembly), *Assembly.__annotations__) if not name.startswith("_")}
    plan = lane_plan("http://x/")
    for assembly in (Serial(plan, (), OneEndpoint(), Recorder()),
                     Batched(lane_plan("http://x/", batch=BatchSpec(2, 30.0, 10_000)), Recorder())):
        assert {name for name in wanted if not hasattr(assembly, name)} == set(), type(assembly).__name__


def test_serial_waits_for_retries_only_once_nothing_more_can_come_in():
    serial = Serial(lane_plan("http://x/", inflight=2), (), OneEndpoint(), Recorder())
    assert serial.stuck(input_done=True, pending=False) is None, "nothing in flight: nothing to wait for"
    assert serial.place(record(0, 0), NOW) is True
    assert serial.stuck(input_done=False, pending=True) is None, "more input may come in"
    assert serial.stuck(input_done=True, pending=False) is Stuck.RETRIES
    assert serial.place(record(0, 1), NOW) is True and serial.place(record(0, 2), NOW) is False, "no room"
    assert serial.stuck(input_done=False, pending=True) is Stuck.RETRIES, "full: only an end makes room"


def test_serial_hands_back_a_broadcast_message_once_with_its_members():
    sink = Recorder()
    serial = Serial(lane_plan("http://x/", broadcast=True), (), EveryEndpoint(3), sink)
    serial.place(record(0, 0), NOW)
    serial.place(record(0, 1), NOW)
    assert len(sink.made) == 6, "one unit per endpoint and message"
    sink.made[0].attempts = 2
    leftovers = serial.leftovers(sink.made, NOW)
    assert [(left.record.offset, len(left.units), left.untouched) for left in leftovers] == [(0, 3, False),
                                                                                            (1, 3, True)]
    assert [target.attempts for target in leftovers[0].state.targets] == [2, 0, 0]
    assert serial.in_flight == 0


def test_batched_carries_filling_batches_now_and_waits_for_a_closed_one():
    batched = Batched(lane_plan("http://x/", batch=BatchSpec(2, 30.0, 10_000)), Recorder())
    assert batched.stuck(input_done=False, pending=False) is None, "more input may fill it"
    batched.place(record(0, 0), NOW)
    assert batched.stuck(input_done=True, pending=False) is Stuck.FILLING, "only a filling batch: carry it"
    batched.place(record(0, 1), NOW)  # the batch closes at its size
    assert batched.stuck(input_done=True, pending=False) is Stuck.RETRIES
