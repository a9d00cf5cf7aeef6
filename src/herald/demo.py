"""`herald demo` (`make demo`): the whole path on one machine, then a report of what happened.

Starts the embedded broker, a demo subscriber that fails some requests, publishes sample orders, runs the
delivery job once over every ACTIVE subscription of the conf directory, prints what was delivered, retried,
filtered and discarded and where the tables are, and stops everything it started.

The demo subscriber answers like a real, somewhat unreliable service:
- an order marked "poison" is refused with 400 (not retried: it lands in the undelivered table);
- every fifth order fails its first attempt with 503, every seventh with 503 + Retry-After: 1;
- the first batch (a JSON array, from a BATCH subscription) fails its first attempt with 503; it is then
  retried whole, with the same Hermes-Batch-Id (failing more batches would make flow control slow a
  subscription of a few batches down to a probe a minute, as Hermes does);
- the shipping primary (path /shipping-primary) is down: it answers 503 to everything, so the pinned
  subscription's pin moves to the standby after its timeoutMs;
- everything else gets 200.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from herald import readout
from herald.broker import EmbeddedBroker
from herald.config import HeraldConfig, load_config

SAMPLE_SIZE = 60


class DemoSubscriber:
    """A small HTTP service on 127.0.0.1 that records what it received."""

    def __init__(self, port: int) -> None:
        self.attempts: Counter[str] = Counter()  # Hermes-Message-Id -> attempts seen
        self.accepted: dict[str, list[str]] = {}  # path -> accepted message ids
        self.answers: Counter[int] = Counter()
        self._failed_a_batch = False
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def answer(self, message_id: str, order: dict | list, path: str = "") -> tuple[int, dict[str, str]]:
        with self._lock:
            self.attempts[message_id] += 1
            first_attempt = self.attempts[message_id] == 1
            fails_the_batch = isinstance(order, list) and first_attempt and not self._failed_a_batch
            self._failed_a_batch = self._failed_a_batch or fails_the_batch
        if isinstance(order, list):  # a batch
            return (503, {}) if fails_the_batch else (200, {})
        if path == "/shipping-primary":  # down for the whole demo
            return 503, {}
        number = int(order.get("order", {}).get("number", 0))
        if order.get("poison"):
            return 400, {}
        if first_attempt and number % 7 == 0:
            return 503, {"Retry-After": "1"}
        if first_attempt and number % 5 == 0:
            return 503, {}
        return 200, {}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        subscriber = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                message_id = self.headers.get("Hermes-Message-Id") or self.headers.get("Hermes-Batch-Id", "")
                try:
                    status, headers = subscriber.answer(message_id, json.loads(body), self.path)
                except (ValueError, KeyError, TypeError, AttributeError):
                    status, headers = 400, {}
                with subscriber._lock:
                    subscriber.answers[status] += 1
                    if status == 200:
                        subscriber.accepted.setdefault(self.path, []).append(message_id)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler


def sample_orders(count: int = SAMPLE_SIZE, seed: int = 42) -> list[str]:
    rng = random.Random(seed)
    countries = ["PL", "DE", "GB", "FR", "US"]
    orders = []
    for number in range(1, count + 1):
        items = [{"sku": f"SKU-{rng.randint(100, 999)}", "kind": rng.choice(["physical", "physical", "digital"])}
                 for _ in range(rng.randint(1, 3))]
        order = {"order": {"number": number, "country": rng.choice(countries), "items": items,
                           "total": round(rng.uniform(5, 500), 2)}}
        if number % 13 == 0:
            order["poison"] = True
        orders.append(json.dumps(order))
    return orders


def _port(url: str, default: int) -> int:
    return urlsplit(url if "://" in url else f"//{url}").port or default


def run_demo(conf_dir: Path) -> int:
    from herald.engine.runner import Runner
    from herald.publish import publish

    config = load_config(conf_dir)
    storage = Path(config.storage_path)
    if storage.exists() and ".herald" in storage.parts:
        shutil.rmtree(storage)  # a fresh demo every time (only ever under a .herald directory)
    broker_dir = conf_dir.resolve().parent / ".herald" / "broker"
    broker = EmbeddedBroker(broker_dir, port=_port(config.settings.kafka.bootstrapServers.split(",")[0], 19092))
    broker_was_up = broker.is_up()
    if not broker_was_up and broker_dir.exists():
        shutil.rmtree(broker_dir)  # and fresh topics: the fresh tables start at earliest, so old orders would go again
    subscriptions = config.active_subscriptions()
    subscriber = DemoSubscriber(_port(subscriptions[0].target.url, 18080)) if subscriptions else None
    try:
        print(f"1. embedded Kafka broker on {broker.bootstrap_servers}")
        broker.up()
        broker.create_topics({topic.kafka_topic: 3 for topic in config.topics.values()})
        topic = next(iter(config.topics.values()))
        print(f"2. publishing {SAMPLE_SIZE} sample orders to {topic.name}")
        result = publish(config.settings.kafka.bootstrapServers, topic.kafka_topic, sample_orders())
        if result.failed:
            print(f"   {len(result.failed)} could not be published: {result.failed[0][1]}")
            return 1
        print("3. running the delivery job once over every ACTIVE subscription")
        runner = Runner(config)
        code = runner.run(once=True)
        runner.spark.stop()  # its Python workers keep Kafka consumers: stop them before the broker goes down
        _report(config, subscriber)
        print(f"\nTables (Delta) under {storage / 'tables'}: undelivered, metrics, offsets, retries, advisories")
        print(f"Read them with: herald undelivered --conf {conf_dir} ID --limit 5 | herald metrics ... | "
              f"herald offsets ...")
        return code
    finally:
        if subscriber is not None:
            subscriber.stop()
        if not broker_was_up:
            broker.down()


def _report(config: HeraldConfig, subscriber: DemoSubscriber | None) -> None:

    print("\nWhat happened:")
    for subscription in config.subscriptions:
        if not subscription.active:
            print(f"- {subscription.id}: SUSPENDED, not run")
            continue
        metrics = readout.metrics(config, subscription)
        pinned = subscription.priority is not None and subscription.priority.policy == "pinned"
        advisories = readout.advisories(config, subscription) if pinned else []
        shown = [a["endpoint"] for a in advisories if a["type"] == "pinned"][-1:] or [subscription.target.masked]
        print(f"- {subscription.id} -> {'pinned now: ' if pinned else ''}{shown[0]}")
        if subscription.deliveryType == "BATCH":  # attempts are batches; delivered and discarded, messages
            retried = metrics["attempts"] - metrics["batchesDelivered"] - metrics["batchesDiscarded"]
            print(f"    delivered {metrics['delivered']} in {metrics['batchesDelivered']} batch(es), retried "
                  f"{retried} batch attempt(s), filtered {metrics['filtered']}, discarded {metrics['discarded']}")
        else:
            retried = metrics["attempts"] - metrics["delivered"] - metrics["discarded"]
            print(f"    delivered {metrics['delivered']}, retried {retried} attempt(s), "
                  f"filtered {metrics['filtered']}, discarded {metrics['discarded']}")
        print(f"    answers: 2xx {metrics['codes2xx']}, 4xx {metrics['codes4xx']}, 5xx {metrics['codes5xx']}, "
              f"timeouts {metrics['timeouts']}, other errors {metrics['otherErrors']}")
        for row in readout.undelivered(config, subscription, limit=3):
            print(f"    undelivered: partition {row['partition']} offset {row['offset']}: {row['reason']}")
        for advisory in advisories:
            print(f"    {advisory['type']} {advisory['endpoint']} (pin id {advisory['pin_id'][:8]}..., "
                  f"{advisory['reason']})")
    if subscriber is not None:
        print(f"Demo subscriber saw {sum(subscriber.answers.values())} request(s): "
              + ", ".join(f"{count} x {status}" for status, count in sorted(subscriber.answers.items())))
