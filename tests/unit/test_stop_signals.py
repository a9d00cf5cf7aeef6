"""Which signal stops a job gracefully and which stops it at once (herald.engine.upkeep.signals.StopRequests): under
spark-submit one signal to the driver's process group reaches both its JVM and its Python, and is one request."""

from __future__ import annotations

from herald.engine.upkeep.signals import JVM, PYTHON, StopRequests


class Job:
    def __init__(self, stopping: bool = False) -> None:
        self.stopping = stopping
        self.calls: list[str] = []
        self.requests = StopRequests(lambda: self.calls.append("graceful"), lambda: self.calls.append("now"),
                                     lambda: self.stopping)


def test_a_signal_to_either_process_alone_stops_gracefully_and_a_second_to_it_at_once():
    for receiver in (PYTHON, JVM):
        job = Job()
        job.requests.received(receiver)
        job.stopping = True
        job.requests.received(receiver)
        assert job.calls == ["graceful", "now"], receiver


def test_one_signal_to_the_group_reaching_both_processes_is_one_request():
    job = Job()
    job.requests.received(JVM)
    job.stopping = True
    job.requests.received(PYTHON)
    assert job.calls == ["graceful", "graceful"]
    job.requests.received(PYTHON)  # Ctrl-C again
    assert job.calls[-1] == "now"


def test_a_first_signal_while_the_job_stops_for_another_reason_stops_it_at_once():
    job = Job(stopping=True)  # a --once run that is done, a lost lease
    job.requests.received(JVM)
    assert job.calls == ["now"]
