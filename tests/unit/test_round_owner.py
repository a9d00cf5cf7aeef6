"""One owner runs every round's steps (herald.engine.round.owner.Round, docs/design.md §3): in order, with the same
failure rules whatever the round. A fake source and fake pins, no Spark: what each step is told, and when."""

from __future__ import annotations

import types

import pytest

from herald.engine.round import owner
from herald.engine.round.fanout import Participant
from herald.engine.round.owner import Round, RoundSource

STAMP = 1_800_000_000_123  # epoch ms


class Source(RoundSource):
    """Notes each step in `events`; `fail` names the step that raises; `chosen` is what `choose` returns."""

    def __init__(self, events: list, chosen, fail: str = "", pins_back_first: bool = False) -> None:
        self.events, self.chosen, self.fail, self.pins_back_first = events, chosen, fail, pins_back_first
        self.park = self.park_here

    def _step(self, name: str, *detail):
        self.events.append((name, *detail))
        if self.fail == name:
            raise RuntimeError(f"{name} failed")

    def park_here(self, *parked) -> None:
        self.events.append(("park",))

    def choose(self):
        self._step("choose")
        return self.chosen

    def prepare(self, participants):
        self._step("prepare", len(participants))

    def deliver(self, participants):
        self._step("deliver", len(participants))
        return [types.SimpleNamespace(subscription=member.state, pin_news=f"news of {member.state.id}")
                for member in participants]

    def take(self, participants, results):
        self._step("take", len(results))
        return STAMP

    def drop(self, participants):
        self._step("drop", len(participants))

    def result(self, results):
        self._step("result", len(results))
        return types.SimpleNamespace(outcomes=results)

    def parking_ended(self, results):
        self._step("parking_ended", len(results))

    def after(self, results, started):
        self._step("after", len(results))


class Pins:
    def __init__(self, events: list, refuse: str = "") -> None:
        self.events, self.refuse = events, refuse

    def release(self, subscription_id, pin, news) -> None:
        self.events.append(("release", subscription_id, news))
        if subscription_id == self.refuse:
            raise RuntimeError("the pin could not be given back")


def members(*names: str) -> list[Participant]:
    return [Participant(index, types.SimpleNamespace(id=name), None, f"pin of {name}")
            for index, name in enumerate(names)]


@pytest.fixture
def events(monkeypatch) -> list:
    found: list = []

    def record(context, result, duration_s, stamp, possible_replay=False, park=None):
        found.append(("record", stamp, possible_replay, park is not None))
        if context.refuse_record:
            raise RuntimeError("the writer is closed")

    monkeypatch.setattr(owner.steps, "record", record)
    return found


def round_of(events: list, chosen, fail: str = "", refuse_pin: str = "", refuse_record: bool = False,
             pins_back_first: bool = False) -> Round:
    context = types.SimpleNamespace(priority=Pins(events, refuse_pin), refuse_record=refuse_record,
                                    unrecorded=lambda result, error: events.append(("unrecorded", str(error))))
    return Round(context, Source(events, chosen, fail, pins_back_first))


def test_a_round_runs_its_steps_in_order_and_takes_before_it_gives_the_pins_back(events):
    result = round_of(events, members("a", "b")).run()
    assert events == [("choose",), ("prepare", 2), ("deliver", 2), ("take", 2),
                      ("release", "a", "news of a"), ("release", "b", "news of b"),
                      ("result", 2), ("record", STAMP, False, True), ("parking_ended", 2), ("after", 2)]
    assert len(result.outcomes) == 2


def test_a_source_that_gives_its_pins_back_first_takes_after_they_are_back(events):
    round_of(events, members("a"), pins_back_first=True).run()
    assert events[2:5] == [("deliver", 1), ("release", "a", "news of a"), ("take", 1)]


def test_a_round_whose_delivery_raises_is_taken_with_no_outcomes_and_never_recorded(events):
    with pytest.raises(RuntimeError, match="deliver failed"):
        round_of(events, members("a", "b"), fail="deliver").run()
    assert events == [("choose",), ("prepare", 2), ("deliver", 2), ("take", 0),
                      ("release", "a", None), ("release", "b", None), ("parking_ended", 0)]


def test_a_round_whose_preparation_raises_frees_its_participants_and_delivers_nothing(events):
    with pytest.raises(RuntimeError, match="prepare failed"):
        round_of(events, members("a"), fail="prepare").run()
    assert events == [("choose",), ("prepare", 1), ("take", 0), ("release", "a", None)]


def test_taking_the_outcomes_raises_the_job_stops_writing_its_participants_are_free_and_pins_go_back(events):
    chosen = members("a", "b")
    for member in chosen:
        member.state.busy = True
    with pytest.raises(RuntimeError, match="take failed"):
        round_of(events, chosen, fail="take").run()
    assert events == [("choose",), ("prepare", 2), ("deliver", 2), ("take", 2), ("result", 2),
                      ("unrecorded", "take failed"), ("release", "a", "news of a"), ("release", "b", "news of b"),
                      ("parking_ended", 2)]
    assert not any(member.state.busy for member in chosen), "none stays busy"


def test_a_round_whose_delivery_raised_and_whose_take_raises_stops_nothing_else(events):
    """With no outcomes to take, no position moved: the job goes on (the messages are delivered again)."""
    source = Source(events, members("a"), fail="take")
    source.deliver = lambda participants: (_ for _ in ()).throw(RuntimeError("deliver failed"))
    context = types.SimpleNamespace(priority=Pins(events), refuse_record=False,
                                    unrecorded=lambda result, error: events.append(("unrecorded",)))
    with pytest.raises(RuntimeError, match="take failed"):
        Round(context, source).run()
    assert ("unrecorded",) not in events


def test_parking_ends_when_the_round_cannot_be_described(events):
    with pytest.raises(RuntimeError, match="result failed"):
        round_of(events, members("a"), fail="result").run()
    assert events[-2:] == [("result", 1), ("parking_ended", 1)]
    assert not any(event[0] == "record" for event in events)


def test_parking_ends_when_recording_raises(events):
    with pytest.raises(RuntimeError, match="writer is closed"):
        round_of(events, members("a"), refuse_record=True).run()
    assert events[-3:] == [("result", 1), ("record", STAMP, False, True), ("parking_ended", 1)]
    assert ("after", 1) not in events


def test_a_pin_that_cannot_be_given_back_never_keeps_the_round_from_being_recorded(events):
    round_of(events, members("a", "b"), refuse_pin="a").run()
    assert ("release", "b", "news of b") in events, "the other pins still go back"
    assert ("record", STAMP, False, True) in events and events[-1] == ("after", 2)


def test_no_participants_chosen_is_no_round(events):
    assert round_of(events, None).run() is None
    assert events == [("choose",)]


def test_an_empty_choice_is_still_a_round(events):
    """A micro-batch with nobody at the read's position still records (its slices, its frontier)."""
    assert round_of(events, []).run() is not None
    assert [event[0] for event in events] == ["choose", "prepare", "deliver", "take", "result", "record",
                                              "parking_ended", "after"]


def test_an_abandoned_round_frees_its_participants_gives_the_pins_back_and_records_nothing(events):
    begun = round_of(events, members("a"))
    assert begun.begin()
    begun.abandon()
    assert events == [("choose",), ("prepare", 1), ("drop", 1), ("release", "a", None)]

