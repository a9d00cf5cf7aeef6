"""Herald on a real multi-process cluster: a Spark standalone master and one worker (tests/support/spark_cluster.py),
the job submitted with `spark-submit --master spark://...` as operations.md tells a user: the jars `herald jars fetch`
cached through `--jars`, Herald's wheel through `--py-files`. The driver, the executor and the master are separate
JVMs, so everything the tasks need crosses processes: Herald's code on the executors, the driver's control
endpoint, the executors' death, the driver's SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from herald.config import load_config
from herald.readout import offsets
from herald.source.kafka_offsets import partition_watermarks
from tests.support.herald_env import produce, wait_until, write_conf, write_subscription
from tests.support.spark_cluster import SparkCluster, Submission, free_port, python_without_herald
from tests.support.subscriber import Received, Reply, ScriptedSubscriber

# a test submits one or two jobs; on delta-spark a cold driver's first commits took minutes at a load of 13
pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")
START_S = 600  # until a submitted job delivers, or ends: generous, see above


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One master and one worker (2 cores, 2g) for the module; every process they started is gone at the end."""
    spark_cluster = SparkCluster(tmp_path_factory.mktemp("cluster"))
    spark_cluster.start()
    yield spark_cluster
    spark_cluster.stop()


@pytest.fixture(scope="module")
def jars() -> list[str]:
    from herald.jars import cached_jars

    if os.environ.get("HERALD_JARS", "").lower() == "off":
        pytest.skip("HERALD_JARS=off: this run asked for no jars")
    found = cached_jars()
    assert found, "Spark's Kafka source and delta-spark are not cached: run `herald jars fetch` (make install)"
    return found


@pytest.fixture
def submit(cluster, herald_zip, jars, tmp_path):
    """Start `jobs/deliver.py` on the cluster: submit(conf, "--once") -> Submission. The executors' Python has
    Herald's dependencies and not Herald: they import it from what the job ships. At the end of the test each
    submission's processes are gone, and so are the executors the worker ran for it."""
    started: list[Submission] = []
    executor_python = python_without_herald(tmp_path)

    def start(conf: Path, *job_args: str) -> Submission:
        env = {**os.environ, "PYSPARK_PYTHON": str(executor_python), "PYSPARK_DRIVER_PYTHON": sys.executable,
               "SPARK_LOCAL_IP": cluster.host}
        command = [str(SPARK_SUBMIT), "--master", cluster.master_url, "--jars", ",".join(jars),
                   "--py-files", str(herald_zip), str(REPO / "jobs" / "deliver.py"), "--conf", str(conf), *job_args]
        submission = Submission(command, tmp_path / f"spark-submit-{len(started)}.log", env, tmp_path)
        started.append(submission)
        return submission

    yield start
    for submission in started:
        submission.close()
    assert wait_until(lambda: not cluster.executor_pids(), timeout_s=120), \
        f"executors left after the test's applications ended: {cluster.executor_pids()}"


def ids_in(request: Received) -> list[int]:
    """The message ids (`i`) a request carried: one, or a BATCH request's list."""
    body = request.json()
    return [message["i"] for message in body] if isinstance(body, list) else [body["i"]]


def delivered(sub: ScriptedSubscriber, path: str) -> Counter:
    """How many times each message id was answered 2xx at `path`."""
    with sub._lock:
        answered = list(zip(sub.requests, sub._ok))
    return Counter(i for request, ok in answered if ok and request.path == path for i in ids_in(request))


def requests_to(sub: ScriptedSubscriber, path: str) -> list[Received]:
    with sub._lock:
        return [request for request in sub.requests if request.path == path]


def positions(conf: Path, subscription_id: str) -> dict[int, int]:
    config = load_config(conf)
    subscription = next(s for s in config.subscriptions if s.id == subscription_id)
    return {row["partition"]: row["offset"] for row in offsets(config, subscription)}


def end_offsets(bootstrap_servers: str, topic: str) -> dict[int, int]:
    marks = partition_watermarks({"bootstrap.servers": bootstrap_servers}, [topic], 10.0)
    return {partition: high for partition, (_, high) in marks[topic].items()}


def ran_on_the_cluster(cluster: SparkCluster, submission: Submission) -> None:
    """The application is the master's, and the worker ran an executor for it: not a local-mode driver."""
    app_id = submission.app_id
    assert app_id is not None, submission.output()[-3000:]
    assert cluster.application(app_id) is not None, cluster.master_state()
    assert cluster.executors(app_id), cluster.worker_state()
    assert "Starting executor ID driver" not in submission.output()


def test_a_once_run_delivers_every_subscription_on_the_cluster(cluster, submit, herald_zip, broker, topic_name,
                                                               tmp_path):
    """--once over a SERIAL, a BATCH and a subscription whose subscriber answers 503 for a while, on a topic of 3
    partitions: every message delivered to each, every position at the end offsets, exit 0, and the work done by
    the worker's executor, Herald loaded from the wheel."""
    broker.create_topics({topic_name: 3})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(30)], key_field="i")
    failing = {"left": 8}
    lock = threading.Lock()

    def respond(request: Received) -> Reply:  # the first 8 requests to /flaky get 503
        with lock:
            if request.path == "/flaky" and failing["left"] > 0:
                failing["left"] -= 1
                return Reply(status=503)
        return Reply()

    with ScriptedSubscriber(respond) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "serial": {"endpoint": f"{sub.url}/serial"},
            "batch": {"endpoint": f"{sub.url}/batch", "deliveryType": "BATCH",
                      "subscriptionPolicy": {"batchSize": 4}},
            "flaky": {"endpoint": f"{sub.url}/flaky"}})
        job = submit(conf, "--once")
        assert job.wait(START_S) == 0, job.output()[-4000:]
    for path in ("/serial", "/batch", "/flaky"):
        assert set(delivered(sub, path)) == set(range(30)), (path, sorted(delivered(sub, path)))
    assert failing["left"] == 0, "the 503s were answered"
    assert any(len(ids_in(r)) > 1 for r in requests_to(sub, "/batch")), "BATCH sent batches"
    ends = end_offsets(broker.bootstrap_servers, topic_name)
    assert len(ends) == 3 and sum(ends.values()) == 30
    for name in ("serial", "batch", "flaky"):
        assert positions(conf, f"{topic_name}.{name}") == ends, name
    ran_on_the_cluster(cluster, job)
    loaded = re.search(r"herald \S+ from (\S+)", job.output())
    assert loaded is not None and herald_zip.name in loaded.group(1), "the driver loaded Herald from elsewhere"


def versions(control_url: str) -> dict[str, str] | None:
    """What the driver's control endpoint tells running tasks: {subscription id: version}; None: no answer."""
    try:
        with urllib.request.urlopen(control_url, timeout=5) as answer:
            return json.loads(answer.read())["versions"]
    except OSError:
        return None


def test_b_a_running_job_delivers_what_is_published_and_edits_reach_its_running_tasks(
        cluster, submit, broker, topic_name, tmp_path):
    """A running job delivers what is published while it runs. A slow subscriber (300 ms an answer, one at a
    time) has 60 messages in a round that could deliver for 120 s: its endpoint is edited after a few, and the
    executor's task stops first attempts to the old endpoint once the driver's control endpoint (another JVM's,
    on streaming.controlPort) tells the new version, the rest going to the new endpoint; then it is suspended,
    and nothing more is sent until it is activated. Every message arrives. (Another subscription keeps the
    topic's query running; the tables are delta-rs's: the subject here is the running tasks.)"""
    broker.create_topics({topic_name: 1})
    control_port = free_port()
    control = f"http://127.0.0.1:{control_port}/versions"
    subscription = f"{topic_name}.s"
    with ScriptedSubscriber(lambda request: Reply(delay_ms=0 if request.path == "/other" else 300)) as sub:
        fields = {"endpoint": f"{sub.url}/old", "subscriptionPolicy": {"inflightSize": 1}}
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "s": fields, "other": {"endpoint": f"{sub.url}/other"}},
            settings={"streaming": {"batchDeadlineMs": 120_000, "controlPort": control_port},
                      "storage": {"engine": "deltalake"}})
        job = submit(conf)
        assert wait_until(lambda: versions(control) or job.process.poll() is not None, START_S), \
            job.output()[-4000:]
        produce(broker.bootstrap_servers, topic_name, [{"i": 0}])
        assert wait_until(lambda: 0 in delivered(sub, "/other") and 0 in delivered(sub, "/old"), 120), \
            job.output()[-4000:]
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(1, 61)])
        assert wait_until(lambda: len(requests_to(sub, "/old")) >= 5, 120)
        before = versions(control)[subscription]
        write_subscription(conf, topic_name, "s", {**fields, "endpoint": f"{sub.url}/new"})
        assert wait_until(lambda: (versions(control) or {}).get(subscription, before) != before, 60)
        old_when_told = len(requests_to(sub, "/old"))
        assert wait_until(lambda: requests_to(sub, "/new"), 120), job.output()[-4000:]
        old = len(requests_to(sub, "/old"))
        print(f"endpoint edit: {old} request(s) to the old endpoint, {old - old_when_told} of them after the "
              "driver told the new version")
        assert old < 40, f"{old} messages went to the old endpoint: the round went on as planned"
        assert old - old_when_told <= 10, "the task asks every configPollMs (500 ms): a few answers of 300 ms"
        assert wait_until(lambda: len(requests_to(sub, "/new")) >= 3, 60)
        write_subscription(conf, topic_name, "s", {**fields, "endpoint": f"{sub.url}/new", "state": "SUSPENDED"})
        assert wait_until(lambda: subscription not in (versions(control) or {subscription: ""}), 60)
        new_when_told = len(requests_to(sub, "/new"))
        time.sleep(3)  # six configPollMs: the task has asked, and an answer in flight has ended
        new_stopped = len(requests_to(sub, "/new"))
        time.sleep(3)
        assert len(requests_to(sub, "/new")) == new_stopped, "nothing is sent while it is suspended"
        print(f"suspension: {new_stopped - new_when_told} request(s) after the driver told it")
        assert new_stopped - new_when_told <= 10
        write_subscription(conf, topic_name, "s", {**fields, "endpoint": f"{sub.url}/new"})
        assert wait_until(lambda: set(delivered(sub, "/old")) | set(delivered(sub, "/new")) == set(range(61)),
                          180), job.output()[-4000:]
        assert set(delivered(sub, "/other")) == set(range(61))
        job.signal(signal.SIGTERM)
        assert job.wait(300) == 0, job.output()[-4000:]
    assert "cannot reach the control endpoint" not in job.output()
    ran_on_the_cluster(cluster, job)


def test_c_an_executor_killed_mid_delivery_is_replaced_and_nothing_is_lost(
        cluster, submit, broker, topic_name, tmp_path):
    """kill -9 of the executor's JVM while it delivers: the worker starts another, the failed tasks run again
    there, every message is delivered (again, for what the killed tasks had sent: at least once), and the job
    goes on delivering what is published after. Then a SIGTERM to the driver's process group (JVM and Python)
    stops it gracefully, as one signal."""
    broker.create_topics({topic_name: 3})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(90)], key_field="i")
    with ScriptedSubscriber(lambda request: Reply(delay_ms=100)) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name,
                          {"slow": {"endpoint": f"{sub.url}/slow", "subscriptionPolicy": {"inflightSize": 6}}},
                          settings={"streaming": {"maxOffsetsPerTrigger": 30}, "storage": {"engine": "deltalake"}})
        job = submit(conf)
        assert wait_until(lambda: len(requests_to(sub, "/slow")) >= 10 or job.process.poll() is not None,
                          timeout_s=START_S), job.output()[-4000:]
        (executor,) = cluster.executor_pids()
        os.kill(executor, signal.SIGKILL)
        sent_before_the_kill = len(requests_to(sub, "/slow"))
        assert wait_until(lambda: cluster.executor_pids() not in ([], [executor]), 180), cluster.log_tail("worker")
        assert wait_until(lambda: set(delivered(sub, "/slow")) == set(range(90)), 300), job.output()[-4000:]
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(90, 100)], key_field="i")
        assert wait_until(lambda: set(delivered(sub, "/slow")) == set(range(100)), 180), job.output()[-4000:]
        job.signal_group(signal.SIGTERM)  # YARN's way: one signal to the JVM and its Python, one graceful stop
        assert job.wait(300) == 0, job.output()[-4000:]
        assert "stopping now" not in job.output()
    total = delivered(sub, "/slow")
    print(f"executor killed after {sent_before_the_kill} request(s): {sum(total.values()) - len(total)} "
          "duplicate(s)")
    executors = cluster.executors(job.app_id)
    assert len(executors) >= 2, executors  # the killed one and its successor
    ran_on_the_cluster(cluster, job)


def test_d_sigterm_of_the_driver_lets_the_rounds_finish_and_the_next_run_loses_nothing(
        cluster, submit, broker, topic_name, tmp_path):
    """SIGTERM to the driver (spark-submit's JVM alone, as Kubernetes sends it) while rounds deliver: the job
    stops as after Ctrl-C, its rounds recorded (exit 0), and the next submission delivers the rest: every message
    at least once, and none of what the first run delivered again."""
    broker.create_topics({topic_name: 3})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(120)], key_field="i")
    with ScriptedSubscriber(lambda request: Reply(delay_ms=100)) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name,
                          {"slow": {"endpoint": f"{sub.url}/slow", "subscriptionPolicy": {"inflightSize": 10}}},
                          settings={"streaming": {"maxOffsetsPerTrigger": 30}})
        job = submit(conf)
        assert wait_until(lambda: len(requests_to(sub, "/slow")) >= 20 or job.process.poll() is not None,
                          timeout_s=START_S), job.output()[-4000:]
        signalled = time.monotonic()
        job.signal(signal.SIGTERM)
        stopped = job.wait(300)
        print(f"SIGTERM: spark-submit exited {stopped} after {time.monotonic() - signalled:.1f} s")
        output = job.output()
        first_run = delivered(sub, "/slow")
        assert stopped == 0, output[-4000:]
        assert "letting the rounds in progress finish" in output
        assert "could not be renewed" not in output and "not written to the tables" not in output, output[-4000:]
        again = submit(conf, "--once")
        assert again.wait(START_S) == 0, again.output()[-4000:]
    total = delivered(sub, "/slow")
    assert set(total) == set(range(120))
    duplicates = sum(total.values()) - len(total)
    sent_again = sum(1 for i in first_run if total[i] > first_run[i])
    print(f"SIGTERM: {len(first_run)} delivered before the stop; {duplicates} duplicate(s) in all, "
          f"{sent_again} of the first run's sent again by the next")
    assert sent_again == 0
