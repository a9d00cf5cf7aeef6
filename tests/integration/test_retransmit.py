"""Retransmission (Hermes' guide, "Retransmission"): moving a subscription's position back to a date, with a
dry run, while `herald run` runs and while the subscription is suspended. Real broker, Spark, HTTP, Delta."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
from confluent_kafka import Producer

from herald.cli import main
from herald.config import load_config
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from herald.storage.tables import RETRANSMISSIONS
from tests.support.herald_env import produce, wait_until, write_conf, write_subscription
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber

pytestmark = pytest.mark.broker

HOUR_MS = 3_600_000


def produce_at(bootstrap: str, topic: str, stamped: list[tuple[int, int, int]]) -> None:
    """(i, partition, timestamp ms) messages."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, partition, timestamp_ms in stamped:
        producer.produce(topic, json.dumps({"i": i}).encode(), partition=partition, timestamp=timestamp_ms)
    producer.flush(10)


def cli_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_dry_run_finds_the_first_offset_at_or_after_the_date_and_changes_nothing(broker, topic_name, tmp_path,
                                                                                 capsys):
    broker.create_topics({topic_name: 2})
    now_ms = int(time.time() * 1000)
    # partition 0: 4, 3, 2, 1 hours ago; partition 1: 4 and 3 hours ago
    produce_at(broker.bootstrap_servers, topic_name, [(0, 0, now_ms - 4 * HOUR_MS), (1, 0, now_ms - 3 * HOUR_MS),
                                                      (2, 0, now_ms - 2 * HOUR_MS), (3, 0, now_ms - HOUR_MS),
                                                      (4, 1, now_ms - 4 * HOUR_MS), (5, 1, now_ms - 3 * HOUR_MS)])
    conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": "http://127.0.0.1:9/"}})
    sid = f"{topic_name}.s"
    relative = cli_json(capsys, "retransmit", "--conf", str(conf), sid, "--date", "-150m", "--dry-run", "--json")
    assert relative["dryRun"] is True
    assert {p["partition"]: p["to"] for p in relative["partitions"]} == {0: 2, 1: 2}, "none after: the end offset"
    two_and_a_half_hours_ago = dt.datetime.fromtimestamp((now_ms - 3.5 * HOUR_MS) / 1000, dt.timezone.utc)
    absolute = cli_json(capsys, "retransmit", "--conf", str(conf), sid, "--date",
                        two_and_a_half_hours_ago.replace(tzinfo=None).isoformat(), "--dry-run", "--json")
    assert {p["partition"]: p["to"] for p in absolute["partitions"]} == {0: 1, 1: 1}, "no offset means UTC"
    assert DeltaRsStore(str(tmp_path / "storage")).read(RETRANSMISSIONS).num_rows == 0, "a dry run changes nothing"


def test_a_date_or_subscription_that_makes_no_sense_is_refused(broker, topic_name, tmp_path, capsys):
    broker.create_topics({topic_name: 1})
    conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": "http://127.0.0.1:9/"}})
    sid = f"{topic_name}.s"
    assert main(["retransmit", "--conf", str(conf), sid, "--date", "yesterday"]) == 2
    assert "neither an ISO-8601 date-time" in capsys.readouterr().err
    assert main(["retransmit", "--conf", str(conf), sid, "--date", "2999-01-01T00:00:00"]) == 2
    assert "is in the future" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["retransmit", "--conf", str(conf), f"{topic_name}.nope", "--date", "-1h"])
    assert exit_.value.code == 2


@pytest.mark.spark
def test_retransmission_while_running_delivers_again_as_new_messages(broker, spark, topic_name, tmp_path, capsys):
    broker.create_topics({topic_name: 2})
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": sub.url}})
        sid = f"{topic_name}.s"
        with RunningHerald(conf, spark):
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(6)])
            assert wait_until(lambda: len(sub.requests) == 6, timeout_s=60)
            first_ids = {r.json()["i"]: r.message_id for r in sub.requests}
            assert wait_until(lambda: sum(row["offset"] for row in cli_json(
                capsys, "offsets", "--conf", str(conf), sid, "--json")) == 6, timeout_s=30), "positions recorded"
            moved = cli_json(capsys, "retransmit", "--conf", str(conf), sid, "--date", "-1h", "--json")
            assert sum(p["from"] for p in moved["partitions"]) == 6
            assert all(p["to"] == 0 for p in moved["partitions"])
            assert wait_until(lambda: len(sub.requests) == 12, timeout_s=60), len(sub.requests)
            produce(broker.bootstrap_servers, topic_name, [{"i": 6}])
            assert wait_until(lambda: len(sub.requests) == 13, timeout_s=60)
    again = [r for r in sub.requests[6:12]]
    assert {r.json()["i"]: r.message_id for r in again} == first_ids, "the original Hermes-Message-Id"
    assert all(r.headers["Hermes-Retry-Count"] == "0" for r in again)
    capsys.readouterr()
    assert main(["offsets", "--conf", str(conf), sid]) == 0
    assert "last retransmission: from" in capsys.readouterr().out


@pytest.mark.spark
def test_retransmission_of_a_suspended_subscription_is_delivered_on_activation(broker, spark, topic_name, tmp_path,
                                                                               capsys):
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": sub.url}})
        sid = f"{topic_name}.s"
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert len(sub.requests) == 5
        write_subscription(conf, topic_name, "s", {"endpoint": sub.url, "state": "SUSPENDED"})
        cli_json(capsys, "retransmit", "--conf", str(conf), sid, "--date", "-1h", "--json")
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert len(sub.requests) == 5, "suspended: nothing yet"
        write_subscription(conf, topic_name, "s", {"endpoint": sub.url, "state": "ACTIVE"})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert sorted(r.json()["i"] for r in sub.requests) == sorted(list(range(5)) * 2)


def test_the_spark_submit_entry_point_retransmits(broker, topic_name, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(3)])
    conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": "http://127.0.0.1:9/"}})
    spark_submit = Path(sys.executable).with_name("spark-submit")
    job = Path(__file__).resolve().parents[2] / "jobs" / "retransmit.py"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run([str(spark_submit), "--master", "local[1]", str(job), "--conf", str(conf),
                             f"{topic_name}.s", "--date", "-1h", "--json"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    moved = json.loads(output[output.index("{"): output.rindex("}") + 1])
    assert moved["dryRun"] is False and moved["partitions"] == [{"partition": 0, "from": None, "to": 0}]
    assert DeltaRsStore(str(tmp_path / "storage")).read(RETRANSMISSIONS).num_rows == 1


@pytest.mark.spark
def test_a_move_recorded_while_the_job_stops_is_applied_by_the_next_run_exactly_once(broker, spark, topic_name,
                                                                                     tmp_path, capsys):
    """The job's move watcher has stopped (as it does first when the job stops) when the move is recorded, and the
    job's last round then writes positions newer than the move's: the next run still applies the move (once)."""
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": sub.url}})
        sid = f"{topic_name}.s"
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: len(sub.requests) == 5, 60)
            running.runner.moves.stop()
            cli_json(capsys, "retransmit", "--conf", str(conf), sid, "--date", "-1h", "--json")
            produce(broker.bootstrap_servers, topic_name, [{"i": 5}])
            assert wait_until(lambda: len(sub.requests) == 6, 60)
            assert wait_until(lambda: [p["offset"] for p in cli_json(capsys, "offsets", "--conf", str(conf), sid,
                                                                     "--json")] == [6], 30), \
                "the job's positions, written after the move's, passed it"
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert sorted(r.json()["i"] for r in sub.requests) == sorted([*range(6), *range(6)]), "moved back: again"
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert len(sub.requests) == 12, "applied once: the run after does not move it again"
    rows = DeltaRsStore(str(tmp_path / "storage")).read(RETRANSMISSIONS).to_pylist()
    assert rows and all(row["applied_at"] is not None for row in rows)


@pytest.mark.spark
def test_a_carried_message_delivered_later_is_not_carried_again_after_a_move_back_and_a_restart(
        broker, spark, topic_name, tmp_path, capsys):
    """An ordered subscription's message is carried (HELD) while it waits for its retry, then delivered. Moved
    back over it while suspended and started again, it is delivered again as new (Hermes-Retry-Count 0), not
    resumed from that old retry state (which a HELD row left newest would bring back, TTL and all)."""
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": 0, "replies": [[503], [200]]}, {"i": 1}])
    with ScriptedSubscriber() as sub:
        fields = {"endpoint": sub.url, "subscriptionPolicy": {"inflightSize": 1, "messageBackoff": 2000,
                                                              "messageTtl": 4}}
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": fields},
                          settings={"streaming": {"parkAfterMs": 200}})
        sid = f"{topic_name}.s"
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: [r.json()["i"] for r in sub.requests] == [0, 0, 1], 60)
            retries = DeltaRsStore(str(tmp_path / "storage"))
            assert wait_until(lambda: any(row["state"] == "HELD" for row in retries.read("retries").to_pylist()),
                              60), "it was carried while it waited"  # its round's commit may follow the deliveries
            states = retries.read("retries").to_pylist()
            write_subscription(conf, topic_name, "s", {**fields, "state": "SUSPENDED"})
            assert wait_until(lambda: topic_name not in running.runner.pipelines, 30), "its topic stops: none left"
            cli_json(capsys, "retransmit", "--conf", str(conf), sid, "--date", "-1h", "--json")
            store = DeltaRsStore(str(tmp_path / "storage"))
            assert wait_until(lambda: all(row["applied_at"] for row in store.read(RETRANSMISSIONS).to_pylist()), 30), \
                "applied by the running job's move watcher"
        write_subscription(conf, topic_name, "s", fields)
        first_read = min(row["first_read_at"] for row in states if row["state"] == "HELD")
        time.sleep(max(0.0, first_read.timestamp() + 4.5 - time.time()))  # the old state's messageTtl (4 s) is over
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    again = [r for r in sub.requests[3:]]
    assert [(r.json()["i"], r.headers["Hermes-Retry-Count"]) for r in again][:1] == [(0, "0")]
    assert DeltaRsStore(str(tmp_path / "storage")).read("undelivered").num_rows == 0
