"""The job's discovered endpoints: one `EndpointSet` per ACTIVE subscription with `endpoints.discovery`, kept
up to date by one poller thread on the driver (docs/design.md §7; the pure parts are `herald.engine.endpoints.lookups`).

- Rounds ask `endpoints_of` at plan time: a round delivers to the set as it was when it was planned (its
  in-flight requests finish there), the next round to the set then.
- While a subscription's set is empty (before its first answer, or after an empty answer from every lookup)
  it is held (`holds`): it sits rounds out as a pinned subscription whose pin changes hands does (§6): its
  messages wait, their TTL running, and none is read past its position, dropped or discarded for it. When the
  set fills again the catch-up and retry threads are woken (`wakers`).
- Every change is a log line (endpoints added and removed, passwords masked), told to the listeners (`changed`:
  the priority groups follow the set) and recorded whole in the `endpoints` table, which `herald endpoints`
  reads with or without a running job (`recorded_endpoints`). Every poll is told to `polled` (Prometheus).
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from herald.config import Subscription
from herald.config.endpoints import Discovery
from herald.endpoint import Endpoint, mask_secrets
from herald.engine.endpoints.lookups import Change, EndpointSet, PollSchedule, parse_answer
from herald.storage import TableStore
from herald.storage.tables import ENDPOINTS, ENDPOINTS_SCHEMA, at_ms, epoch_ms

log = logging.getLogger(__name__)

MAX_KNOWN = 4096
"""Most endpoints the job remembers having seen (`Discoveries.known`), the most recently seen kept."""

OK, FAILED = "ok", "failed"
Get = Callable[[str, float], bytes]
"""(lookup URL with its credentials, timeout in seconds) -> the answer's body; raises when there is none (an
HTTP status other than 2xx included)."""


def http_get(url: str, timeout_s: float) -> bytes:
    """One lookup with requests: Basic auth from the URL's user:password@, `timeout_s` for connect and read."""
    import requests

    endpoint = Endpoint.parse(url)
    auth = (endpoint.user, endpoint.password or "") if endpoint.user is not None else None
    response = requests.get(endpoint.url, auth=auth, timeout=timeout_s, headers={"Accept": "application/json"})
    if response.status_code // 100 != 2:
        raise ValueError(f"HTTP {response.status_code}")
    return response.content


@dataclass
class _Group:
    subscription_id: str
    discovery: Discovery
    set: EndpointSet
    schedule: PollSchedule


class Discoveries:
    """`get`: the HTTP GET of a lookup; `clock`: monotonic seconds; `wall_ms`: epoch ms (the table's times);
    `rng`: the jitter's randomness; `workers`: lookups polled at once (0: one after the other, in the caller's
    thread, as unit tests want)."""

    def __init__(self, get: Get = http_get, clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000), rng: random.Random | None = None,
                 workers: int = 4, store: TableStore | None = None, writer: str = "discovery") -> None:
        self.get, self.clock, self.wall_ms = get, clock, wall_ms
        self.rng = rng or random.Random()
        self.changed: list[Callable[[str, Change], None]] = []
        self.polled: list[Callable[[str, str], None]] = []  # (subscription id, OK or FAILED)
        self.wakers: list[Callable[[], None]] = []
        self.store = store  # where each set is recorded (None: nowhere)
        self.writer = writer
        self._batches = itertools.count(1)
        self._last_stamp = 0
        self._lock = threading.RLock()
        self._announcing = threading.Lock()  # changes are logged, recorded and told in the order they happen
        self._groups: dict[str, _Group] = {}
        # masked URL -> the endpoints this job saw (or configured), the most recently seen MAX_KNOWN
        self._known: OrderedDict[str, Endpoint] = OrderedDict()
        self._workers = workers
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="herald-lookup") if workers else None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what rounds ask ---------------------------------------------------------------------------------------
    def configure(self, subscriptions: Iterable[Subscription]) -> None:
        """The ACTIVE subscriptions now: one discovering for the first time (or again, after a suspension) is
        looked up at once; an edit of its discovery block looks every lookup URL up again at once (answers of
        URLs no longer listed leave the set); one no longer here forgets its set."""
        now = self.clock()
        changes = []
        subscriptions = list(subscriptions)
        with self._lock:
            for subscription in subscriptions:  # configured endpoints too: an edit may remove one BROADCAST owes
                for endpoint in subscription.targets:
                    self._saw(endpoint)
            found = {s.id: s.discovery for s in subscriptions if s.discovery is not None}
            for subscription_id in set(self._groups) - set(found):
                del self._groups[subscription_id]
            for subscription_id, discovery in found.items():
                group = self._groups.get(subscription_id)
                if group is None:
                    self._groups[subscription_id] = _Group(subscription_id, discovery, EndpointSet(discovery.urls),
                                                           PollSchedule(discovery, now, self.rng))
                elif group.discovery != discovery:
                    group.discovery, group.schedule = discovery, PollSchedule(discovery, now, self.rng)
                    change = group.set.forget(list(discovery.urls))
                    if change is not None:
                        changes.append((group, change))
        for group, change in changes:
            self._announce(group, change)
        self._wake.set()

    def discovered(self, subscription_id: str) -> bool:
        with self._lock:
            return subscription_id in self._groups

    def holds(self, subscription_id: str) -> bool:
        """True while a discovering subscription has no endpoint to deliver to (it sits rounds out)."""
        with self._lock:
            group = self._groups.get(subscription_id)
            return group is not None and not group.set.endpoints

    def endpoints_of(self, subscription: Subscription) -> list[Endpoint] | None:
        """The subscription's endpoints now: its discovered set (empty before it is known), or None when its
        endpoints are configured."""
        if subscription.discovery is None:
            return None
        with self._lock:
            group = self._groups.get(subscription.id)
            return [Endpoint.parse(url) for url in group.set.endpoints] if group is not None else []

    def answered(self, subscription_id: str) -> bool:
        """Some lookup of the subscription has answered (its set, even empty, is known)."""
        with self._lock:
            group = self._groups.get(subscription_id)
            return group is not None and group.set.answered

    def known(self, shown: str) -> Endpoint | None:
        """An endpoint this job has discovered or been configured with, by its URL as people see it (it may
        have left its set or list since)."""
        with self._lock:
            return self._known.get(shown)

    def _saw(self, endpoint: Endpoint) -> None:
        """(lock held) Remember an endpoint (its credentials, for a departed BROADCAST member's retries), the
        most recently seen `MAX_KNOWN` only: a job whose lookups name a new endpoint every hour runs for months.
        One forgotten is tried as its URL shows (its password masked), as after a restart."""
        self._known[endpoint.masked] = endpoint
        self._known.move_to_end(endpoint.masked)
        while len(self._known) > MAX_KNOWN:
            self._known.popitem(last=False)

    def state(self, subscription_id: str) -> dict | None:
        """The set as `herald endpoints` shows it, live: endpoints, the lookups naming each, failing lookups."""
        with self._lock:
            group = self._groups.get(subscription_id)
            if group is None:
                return None
            return {"endpoints": [{"endpoint": Endpoint.parse(url).masked,
                                   "lookups": [mask_secrets(lookup) for lookup in group.set.named_by(url)]}
                                  for url in group.set.endpoints],
                    "failing": {mask_secrets(lookup): error for lookup, error in group.set.errors.items()}}

    # -- polling -----------------------------------------------------------------------------------------------
    def step(self) -> float:
        """Poll every lookup URL due now (at once, `workers` at a time) and apply the answers; seconds until the
        next is due."""
        now = self.clock()
        with self._lock:
            due = [(group, url) for group in self._groups.values() for url in group.schedule.due(now)]
            for group, url in due:
                group.schedule.taken(url)
        looks = list(self._executor.map(self._look, due) if self._executor and len(due) > 1 else map(self._look, due))
        changes = []
        for (group, url), (urls, error) in zip(due, looks):
            with self._lock:
                if self._groups.get(group.subscription_id) is not group or url not in group.schedule.due_s:
                    continue  # forgotten or edited meanwhile
                group.schedule.polled(url, self.clock())
                if error is None:
                    change = group.set.answer(url, urls)
                    if change is not None:
                        changes.append((group, change))
                else:
                    group.set.failed(url, error)
                    log.warning("%s: lookup %s failed (%s); it keeps its last good answer (%d endpoint(s)), the set "
                                "keeps %d", group.subscription_id, mask_secrets(url), error,
                                len(group.set.answers.get(url, ())), len(group.set.endpoints))
            self._tell_polled(group.subscription_id, OK if error is None else FAILED)
        for group, change in changes:
            self._announce(group, change)
        with self._lock:
            next_due = min((g.schedule.next_due_s() for g in self._groups.values()
                            if g.schedule.next_due_s() is not None), default=None)
        return 60.0 if next_due is None else min(60.0, max(0.05, next_due - self.clock()))

    def _look(self, item: tuple[_Group, str]) -> tuple[tuple[str, ...] | None, str | None]:
        """(the endpoint URLs of one lookup, or None with why not)."""
        group, url = item
        try:
            return parse_answer(self.get(url, group.discovery.timeoutMs / 1000), group.discovery), None
        except Exception as error:  # noqa: BLE001 - a lookup that fails keeps its last good answer
            return None, mask_secrets(str(error)) or type(error).__name__

    def _tell_polled(self, subscription_id: str, result: str) -> None:
        for listener in self.polled:
            try:
                listener(subscription_id, result)
            except Exception:  # noqa: BLE001 - a listener must not stop the polling
                log.exception("telling a listener about a lookup of %s failed", subscription_id)

    def _announce(self, group: _Group, change: Change) -> None:
        """Log, remember, record and tell a change of a set; wake the delivery threads when it fills again."""
        with self._announcing:
            with self._lock:
                for url in change.after:
                    self._saw(Endpoint.parse(url))
                rows = [(Endpoint.parse(url).masked, [mask_secrets(lookup) for lookup in group.set.named_by(url)])
                        for url in change.after]
            log.info("%s: discovered endpoints now %d%s%s", group.subscription_id, len(change.after),
                     f"; added {', '.join(Change.shown(change.added))}" if change.added else "",
                     f"; removed {', '.join(Change.shown(change.removed))}" if change.removed else "")
            if not change.after:
                log.warning("%s: no endpoint discovered; its messages wait (their TTL runs) until one is",
                            group.subscription_id)
            self._record(group.subscription_id, rows)
            for listener in self.changed:
                try:
                    listener(group.subscription_id, change)
                except Exception:  # noqa: BLE001 - a listener must not stop the polling
                    log.exception("telling a listener about the endpoints of %s failed", group.subscription_id)
            if change.after and not change.before:
                for wake in self.wakers:
                    wake()

    def _record(self, subscription_id: str, rows: list[tuple[str, list[str]]]) -> None:
        if self.store is None:
            return
        self._last_stamp = stamp = max(self.wall_ms(), self._last_stamp + 1)
        batch_id = next(self._batches)
        table = pa.Table.from_pylist([
            {"subscription": subscription_id, "endpoint": endpoint, "lookups": ", ".join(lookups),
             "changed_at": at_ms(stamp), "writer": self.writer, "batch_id": batch_id}
            for endpoint, lookups in rows or [(None, [])]], schema=ENDPOINTS_SCHEMA)
        try:
            self.store.append(ENDPOINTS, table)  # a slice of this run (discovery:<run id>), never written again
        except Exception:  # noqa: BLE001 - delivery goes on; `herald endpoints` shows an older set
            log.exception("%s: recording the discovered endpoints failed", subscription_id)

    # -- the thread --------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="herald-discovery", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling; a lookup still being asked is not waited for (the thread is a daemon), so a slow
        lookup never eats the job's shutdown grace."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait_s = self.step()
            except Exception:  # noqa: BLE001 - the poller must outlive one bad step
                log.exception("polling the lookups failed; trying again in 5 s")
                wait_s = 5.0
            self._wake.wait(wait_s)
            self._wake.clear()


def recorded_endpoints(store: TableStore, subscription_id: str) -> dict | None:
    """The subscription's last recorded set: {"changed_at_ms", "endpoints": [{"endpoint", "lookups"}]} (passwords
    masked), or None when no job has recorded one."""
    rows = store.read(ENDPOINTS, subscription_id).to_pylist()
    if not rows:
        return None
    newest = max((epoch_ms(row["changed_at"]) or 0, row["writer"], row["batch_id"]) for row in rows)
    chosen = [row for row in rows if (epoch_ms(row["changed_at"]) or 0, row["writer"], row["batch_id"]) == newest]
    return {"changed_at_ms": newest[0],
            "endpoints": [{"endpoint": row["endpoint"], "lookups": row["lookups"].split(", ") if row["lookups"] else []}
                          for row in sorted(chosen, key=lambda row: row["endpoint"] or "") if row["endpoint"]]}
