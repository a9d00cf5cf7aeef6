"""The job's priority groups: the pins of its `policy: pinned` subscriptions (docs/design.md §6).

Every round asks `lease` before it plans a subscription: a pinned subscription gets its `Pin` (its rounds then
send only to that endpoint) or sits the round out while its pin changes hands; the round gives the pin back with
what it saw (`release`). The state machine is `herald.engine.endpoints.pin_group.PinGroup`; this class runs it
for the job: it records every advisory in the `advisories` table (a new pin before any request carries it), tells
the listeners (log, Prometheus, the advisories Kafka topic), picks up `herald unpin` (an `unpinned` row written by
the command, every `poll_s`), and wakes the catch-up and retry threads when a subscription may deliver again.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable

import pyarrow as pa

from herald.config import Subscription
from herald.engine.endpoints.pin_group import ADMIN, PINNED, UNPINNED, Advisory, Pin, PinGroup, PinNews
from herald.storage import TableStore
from herald.storage.tables import ADVISORIES, ADVISORIES_SCHEMA, at_ms, epoch_ms

log = logging.getLogger(__name__)

HELD = "held"  # `lease`: the subscription sits the round out


def advisory_rows(advisories: list[Advisory], writer: str, batch_id: int) -> pa.Table:
    return pa.Table.from_pylist([
        {"type": a.type, "subscription": a.subscription, "endpoint": a.endpoint, "pin_id": a.pin_id,
         "reason": a.reason, "timestamp": at_ms(a.at_ms), "writer": writer, "batch_id": batch_id}
        for a in advisories], schema=ADVISORIES_SCHEMA)


def last_advisories(store: TableStore, subscription_id: str | None = None) -> dict[str, dict[str, Advisory]]:
    """subscription id -> {"pinned": its last pin, "unpinned": the last pin given up}, from the table."""
    rows = store.latest(ADVISORIES, ("subscription", "type"), "timestamp DESC, batch_id DESC")
    found: dict[str, dict[str, Advisory]] = {}
    for row in rows.to_pylist():
        if subscription_id is not None and row["subscription"] != subscription_id:
            continue
        found.setdefault(row["subscription"], {})[row["type"]] = Advisory(
            row["type"], row["subscription"], row["endpoint"], row["pin_id"], row["reason"],
            epoch_ms(row["timestamp"]))
    return found


def current_pin(last: dict[str, Advisory]) -> tuple[Advisory | None, Advisory | None]:
    """(the last pin, the advisory that gave it up or None) of one subscription's `last_advisories`."""
    pinned, unpinned = last.get(PINNED), last.get(UNPINNED)
    if pinned is None or unpinned is None or unpinned.pin_id != pinned.pin_id:
        unpinned = None
    return pinned, unpinned


def shown_endpoints(subscription: Subscription) -> tuple[str, ...]:
    return tuple(endpoint.masked for endpoint in subscription.targets)


class Priority:
    """`now_ms`: the wall clock (epoch ms). `listeners` get every advisory once it is recorded; `wakers` are
    called when a switch lets a subscription deliver again."""

    def __init__(self, store: TableStore, run_id: str, now_ms: Callable[[], int], poll_s: float = 2.0,
                 endpoints_of: Callable[[Subscription], tuple[str, ...] | None] | None = None) -> None:
        self.store = store
        self.writer = f"priority:{run_id}"
        self.now_ms = now_ms
        self.poll_s = poll_s
        self.listeners: list[Callable[[Advisory], None]] = []
        self.wakers: list[Callable[[], None]] = []
        self.changed: list[Callable[[], None]] = []  # called after `configure`: the pins may differ (`pin_ids`)
        self.lock = threading.RLock()  # also held by whoever tells running tasks the pins (a consistent view)
        self._groups: dict[str, PinGroup] = {}
        self._waiting: set[str] = set()  # pinned subscriptions whose endpoints are not known yet (§7)
        self.endpoints_of = endpoints_of or shown_endpoints
        """A subscription's endpoints as people see them, in order; None while they are not known yet (a
        discovered set before its first answer): its group then waits, and its rounds with it."""
        self._batches = itertools.count(1)
        self._outbox: list[tuple[Advisory, bool]] = []  # (advisory, to write): recorded and told by `_settle`
        self._switching: set[str] = set()  # subscriptions whose new pin is being recorded
        self._frozen = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- configuration ----------------------------------------------------------------------------------------
    def configure(self, subscriptions: Iterable[Subscription]) -> None:
        """The ACTIVE subscriptions now: a pinned one seen for the first time takes up its pin from the table;
        an edit (or a discovered set, §7) that drops its pinned endpoint gives the pin up; one no longer here
        (or no longer pinned) is forgotten once no round of it runs (activated again before that, it goes on
        with the same group, an unpin recorded meanwhile included). Call it again when a discovered set
        changes."""
        pinned = {s.id: s for s in subscriptions if s.priority is not None and s.priority.policy == "pinned"}
        endpoints_of = {sid: self.endpoints_of(subscription) for sid, subscription in pinned.items()}
        with self.lock:
            fresh = [sid for sid, endpoints in endpoints_of.items() if endpoints is not None
                     and (sid not in self._groups or not self._groups[sid].active)]
        last = last_advisories(self.store) if fresh else {}  # read outside the lock every round takes
        with self.lock:
            for subscription_id, group in list(self._groups.items()):
                if subscription_id not in pinned:
                    group.active = False
                    if group.rounds <= 0:
                        del self._groups[subscription_id]
            self._waiting = {sid for sid, endpoints in endpoints_of.items() if endpoints is None}
            now = self.now_ms()
            for subscription_id, subscription in pinned.items():
                endpoints, timeout_ms = endpoints_of[subscription_id], subscription.priority.timeoutMs
                if endpoints is None:
                    continue  # not known yet: it waits (`lease` holds it)
                group = self._groups.get(subscription_id)
                if group is None:
                    group = self._groups[subscription_id] = PinGroup(subscription_id, endpoints, timeout_ms)
                    self._record(group.restore(*current_pin(last.get(subscription_id, {})), now))
                else:
                    if not group.active:
                        group.active = True
                        self._take_unpin(group, last.get(subscription_id, {}).get(UNPINNED))
                    self._record(group.reconfigure(endpoints, timeout_ms, now))
        self._settle()
        for changed in self.changed:  # a pin taken up from the table tells no listener: the running tasks must know
            changed()

    def holds(self, subscription_id: str) -> bool:
        """True while a pinned subscription has no pin to deliver with (it is changing hands, or its endpoints
        are not known yet)."""
        with self.lock:
            if subscription_id in self._waiting:
                return True
            group = self._groups.get(subscription_id)
            return group is not None and group.active and (group.leaving is not None or group.index is None)

    # -- rounds -----------------------------------------------------------------------------------------------
    def lease(self, subscription: Subscription) -> Pin | str | None:
        """For a round about to plan `subscription` (the version it plans with): its `Pin`, `HELD` (it sits the
        round out), or None (it is not pinned). A version whose policy or endpoints the groups do not know yet
        (a live edit being applied, a discovered set that changed) is HELD until they do."""
        is_pinned = subscription.priority is not None and subscription.priority.policy == "pinned"
        with self.lock:
            if subscription.id in self._waiting:
                return HELD
            group = self._groups.get(subscription.id)
            if group is None or not group.active:
                return HELD if is_pinned else None
            if not is_pinned or self.endpoints_of(subscription) != group.endpoints:
                return HELD
            pin = group.lease()
            return HELD if pin is None else pin

    def release(self, subscription_id: str, pin: Pin | str | None, news: PinNews | None) -> None:
        """A round planned with `pin` (from `lease`) ended, having seen `news` of the pinned endpoint."""
        if not isinstance(pin, Pin):
            return
        with self.lock:
            group = self._groups.get(subscription_id)
            if group is None or group.token != pin.group:
                return
            self._record(group.release(pin, news, self.now_ms()))
            if not group.active and group.rounds <= 0:
                del self._groups[subscription_id]  # its last round ended after it stopped being delivered
        self._settle()

    def _take_unpin(self, group: PinGroup, unpinned: Advisory | None) -> None:
        """(lock held) Give the pin up if `unpinned` (the table's last unpin of the subscription: `herald unpin`)
        names it."""
        if unpinned is not None and unpinned.pin_id == group.pin_id and group.leaving is None:
            advisory = group.unpin(unpinned.reason, unpinned.at_ms, unpinned.pin_id)
            if advisory is not None:
                self._outbox.append((advisory, False))  # recorded by `herald unpin`: told only

    def freeze(self) -> None:
        """The job lost its storage lease: it records nothing more, so it switches no pin (another job owns
        them now)."""
        with self.lock:
            self._frozen = True

    def state(self, subscription_id: str) -> dict | None:
        """The group's state as `herald priority` shows it (None: not a pinned subscription of this job)."""
        with self.lock:
            group = self._groups.get(subscription_id)
            if group is None:
                return None
            return {"endpoint": group.endpoint, "pin_id": group.pin_id, "since_ms": group.since_ms,
                    "changing": group.leaving.reason if group.leaving is not None else None,
                    "refused_since_ms": group.refused_since_ms}

    def pin_ids(self) -> dict[str, str | None]:
        """subscription id -> its pin id, None while it changes hands."""
        with self.lock:
            return {sid: (g.pin_id if g.leaving is None else None) for sid, g in self._groups.items() if g.active}

    def pins(self) -> dict[str, str | None]:
        """subscription id -> its pinned endpoint (password masked), None while it changes hands."""
        with self.lock:
            return {sid: (g.endpoint if g.leaving is None else None) for sid, g in self._groups.items() if g.active}

    # -- recording: never under the lock, which every round takes ----------------------------------------------
    def _record(self, advisory: Advisory | None) -> None:
        """(lock held) A pin given up: recorded and told by `_settle`, outside the lock. A failed write is logged:
        the pin is given up anyway (the table then misses a row; a restart keeps the old pin)."""
        if advisory is not None:
            self._outbox.append((advisory, True))

    def _settle(self) -> None:
        """(lock not held) Record and tell the advisories the groups gave, then make the switches that are due:
        each new pin is recorded before any round can get it (the group holds its rounds out until then). When
        the table cannot be written, the subscription keeps waiting and `poll` tries the switch again."""
        with self.lock:
            outbox, self._outbox = self._outbox, []
            switches = [planned for planned in map(self._plan_switch, list(self._groups.values())) if planned]
        written = [advisory for advisory, write in outbox if write]
        if written:
            try:
                self._write(written)
            except Exception:  # noqa: BLE001 - the switch goes on; only the record is missing
                log.exception("%s: recording that the pin was given up failed",
                              ", ".join(a.subscription for a in written))
        for advisory, _ in outbox:
            self._tell(advisory)
        for group, pinned in switches:
            self._switch(group, pinned)

    def _plan_switch(self, group: PinGroup) -> tuple[PinGroup, Advisory] | None:
        """(lock held) The next pin of a group whose switch is due (the old pin's rounds have ended), marked as
        being recorded; None when none is due, or it has no endpoint to pin (an empty discovered set, §7)."""
        if not group.due() or not group.active or self._frozen or not group.endpoints \
                or group.subscription_id in self._switching:
            return None
        pinned = group.next_pin(self.now_ms())
        if pinned is None:
            return None
        self._switching.add(group.subscription_id)
        return group, pinned

    def _switch(self, group: PinGroup, pinned: Advisory) -> None:
        """(lock not held) Record the new pin, then make it the group's (unless the group changed meanwhile: a
        later switch records another), tell the listeners and wake the catch-up and retry threads."""
        try:
            self._write([pinned])
        except Exception:  # noqa: BLE001 - no request carries a pin that is not recorded; tried again later
            log.exception("%s: recording the new pin failed; its messages wait, trying again in %.1f s",
                          group.subscription_id, self.poll_s)
            with self.lock:
                self._switching.discard(group.subscription_id)
            return
        with self.lock:
            self._switching.discard(group.subscription_id)
            taken = self._groups.get(group.subscription_id) is group and group.due() \
                and pinned.endpoint in group.endpoints and not self._frozen  # a lease lost meanwhile: not ours
            if taken:
                group.take(pinned)
        if not taken:
            self._settle()  # planned again from what the group is now
            return
        self._tell(pinned)
        for wake in self.wakers:
            wake()

    def _write(self, advisories: list[Advisory]) -> None:
        if self._frozen:
            raise RuntimeError("the job lost its storage lease: it records nothing more")
        batch_id = next(self._batches)  # a slice of this run (priority:<run id>), never written again: appended
        self.store.append(ADVISORIES, advisory_rows(advisories, self.writer, batch_id))

    def _tell(self, advisory: Advisory) -> None:
        if advisory.type == PINNED:
            log.info("%s: pinned %s (pin id %s, reason: %s)", advisory.subscription, advisory.endpoint,
                     advisory.pin_id, advisory.reason)
        elif advisory.endpoint:
            log.warning("%s: unpinned %s (pin id %s, reason: %s); its messages wait for its last requests, then "
                        "go to the next endpoint", advisory.subscription, advisory.endpoint, advisory.pin_id,
                        advisory.reason)
        for listener in self.listeners:
            try:
                listener(advisory)
            except Exception:  # noqa: BLE001 - a listener (a Kafka topic) must not stop the switch
                log.exception("telling a listener about %s of %s failed", advisory.type, advisory.subscription)

    # -- `herald unpin`, picked up while running --------------------------------------------------------------
    def poll(self) -> None:
        """Give up every pin an operator unpinned since the last look (`herald unpin` wrote its advisory), and
        retry switches whose record failed."""
        with self.lock:
            if not self._groups:
                return
        last = last_advisories(self.store)
        with self.lock:
            for subscription_id, group in list(self._groups.items()):
                if group.active:
                    self._take_unpin(group, last.get(subscription_id, {}).get(UNPINNED))
        self._settle()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="herald-priority", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the job goes on; the next look tries again
                log.exception("looking for unpinned subscriptions failed; trying again in %.1f s", self.poll_s)


# -- `herald unpin` and `herald priority`, with or without a running job --------------------------------------
def unpin(store: TableStore, subscription_id: str, user: str, now_ms: int) -> tuple[Advisory | None, str]:
    """Record that an operator gives the subscription's pin up (a running job picks it up within its
    `configPollMs`; a job that starts later, or a suspended subscription's activation, switches at once).
    Returns (the `unpinned` advisory, or None with why nothing was done)."""
    pinned, unpinned = current_pin(last_advisories(store, subscription_id).get(subscription_id, {}))
    if pinned is None:
        return None, "not pinned yet: the job pins the first endpoint when it starts delivering the subscription"
    if unpinned is not None:
        return None, (f"already unpinned ({unpinned.reason}); the job pins the endpoint after "
                      f"{unpinned.endpoint} once the requests of the old pin have ended")
    advisory = Advisory(UNPINNED, subscription_id, pinned.endpoint, pinned.pin_id, ADMIN,
                        max(now_ms, pinned.at_ms + 1))
    writer = f"admin:{user}"
    store.append(ADVISORIES, advisory_rows([advisory], writer, now_ms))  # appended: the newest row of a type counts
    return advisory, ""


def recorded_state(store: TableStore, subscription_id: str) -> dict:
    """The group's state from the advisories table: the pinned endpoint (password masked), pin id and since when
    (epoch ms), and, when the pin is being given up, why and when."""
    pinned, unpinned = current_pin(last_advisories(store, subscription_id).get(subscription_id, {}))
    return {"endpoint": pinned.endpoint if pinned else None, "pin_id": pinned.pin_id if pinned else None,
            "pinned_since_ms": pinned.at_ms if pinned else None, "pin_reason": pinned.reason if pinned else None,
            "unpinned": ({"reason": unpinned.reason, "at_ms": unpinned.at_ms} if unpinned else None)}
