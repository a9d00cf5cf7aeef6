"""Planning a round on the driver: each subscription's lane, with its share of inflight and rate.

NSQ's rule: a subscription's `inflightSize` and `rate` are shared by everything that delivers it at once,
so their sum never exceeds its settings. Two paths deliver a subscription at once: the path that reads its
messages (the topic's shared query, or its catch-up) and the retry driver, for its parked messages. Parked
messages stand outside the position, like RocketMQ's retry queue: they get at most half the subscription's
in-flight slots (at least one when there are any), the reading path the rest, and the rate is split in the
same proportion. The tasks of a round split their path's share again (`LanePlan.share`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from herald.config import Subscription
from herald.config.model import ContentType
from herald.config.settings import OAuthProvider
from herald.delivery.flow import FlowSettings
from herald.delivery.headers import (
    AUTHORIZATION,
    AVRO_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    basic_authorization,
    static_headers,
)
from herald.delivery.message import RetryState
from herald.delivery.oauth import TokenSource
from herald.delivery.pin import PinPlan
from herald.delivery.plan import LanePlan, Target
from herald.delivery.report import TRACK_ALL, TRACK_DISCARDED, TRACK_OFF
from herald.delivery.spec import DeliverySpec
from herald.endpoint import Endpoint
from herald.engine.endpoints.pin_group import Pin
from herald.engine.round.state import SubscriptionState
from herald.engine.upkeep.control import pinned_version, version_of

TRACKING = {"trackingOff": TRACK_OFF, "discardedOnly": TRACK_DISCARDED, "trackingAll": TRACK_ALL}


def spec_of(subscription: Subscription) -> DeliverySpec:
    return subscription.delivery_spec


def header_lines(subscription: Subscription) -> tuple[str, ...]:
    """The header lines every attempt of the subscription carries (each target adds its own Authorization)."""
    headers = static_headers(
        AVRO_CONTENT_TYPE if subscription.contentType is ContentType.AVRO else JSON_CONTENT_TYPE,
        subscription.topicName,
        subscription.name,
        subscription.subscriptionIdentityHeadersEnabled,
        tuple((header.name, header.value) for header in subscription.headers),
    )
    return tuple(f"{name}: {value}" for name, value in headers.items())


def targets(subscription: Subscription, endpoints: Sequence[Endpoint] | None = None) -> tuple[Target, ...]:
    """The subscription's endpoints (`endpoints`: its discovered set now, docs/design.md §7; None: the
    configured ones, with an overflow endpoint's conditions) with the Authorization line of their credentials
    (never log them)."""
    if endpoints is not None:
        return tuple(target_of(endpoint) for endpoint in endpoints)
    overflow = subscription.priority is not None and subscription.priority.policy == "overflow"
    return tuple(target_of(endpoint, entry.minPending if overflow else None, entry.minInflight if overflow else None)
                 for entry, endpoint in zip(subscription.endpoint_entries, subscription.targets))


def target_of(endpoint: Endpoint, min_pending: int | None = None, min_inflight: int | None = None) -> Target:
    return Target(endpoint.url, f"{AUTHORIZATION}: {basic_authorization(endpoint.user, endpoint.password or '')}"
                  if endpoint.user is not None else None, endpoint.masked, min_pending, min_inflight)


Former = Callable[[str], Endpoint | None]
"""An endpoint that left the subscription's endpoints, by its URL as people see it (None: unknown)."""


def former_target(shown: str, former: Former | None) -> Target:
    """The target of an endpoint that left: as last known, else rebuilt from its shown URL (a password it had
    is not known any more: the attempt goes without it, and a refusal ends as any other)."""
    endpoint = former(shown) if former is not None else None
    if endpoint is None:
        parsed = Endpoint.parse(shown)
        endpoint = parsed if parsed.password is None else Endpoint(parsed.url, parsed.user, None)
    return replace(target_of(endpoint), shown=shown)  # its name stays the one its states know it by


def placed(resume: dict, endpoints: tuple[Target, ...], former: Former | None) -> tuple[dict, tuple[Target, ...]]:
    """BROADCAST states resumed in a round, their endpoints found by name in the round's `endpoints` (lists and
    discovered sets change between rounds, docs/design.md §7); (the states, the targets that left, which
    the round appends to its targets for the members still owed to them: they are tried until they answer 2xx
    or the message ends, never given up unanswered)."""
    shown = {target.shown: index for index, target in enumerate(endpoints)}
    departed: dict[str, int] = {}
    result = {}
    for key, state in resume.items():
        if not state.targets or not any(target.endpoint for target in state.targets):
            result[key] = state  # not BROADCAST, or recorded before endpoints were named: index as it was
            continue
        moved = []
        for target in state.targets:
            index = shown.get(target.endpoint)
            if index is None:
                index = len(endpoints) + departed.setdefault(target.endpoint, len(departed))
            moved.append(replace(target, index=index))
        result[key] = replace(state, targets=tuple(moved))
    return result, tuple(former_target(name, former) for name in departed)


def named(state: RetryState, targets: Sequence[Target]) -> RetryState:
    """A state leaving a round with `targets`: each BROADCAST endpoint it still owes named by its shown URL, so
    the next round finds it whatever the list then is (`placed`)."""
    if not state.targets:
        return state
    return replace(state, targets=tuple(
        replace(target, endpoint=targets[target.index].shown) if target.index < len(targets) else target
        for target in state.targets))


def split_inflight(inflight: int, parked: int) -> tuple[int, int]:
    """(slots for the reading path, slots for the retry driver) of a subscription with `parked` messages.

    With inflightSize 1 (which never parks, unless it was larger when the messages were parked) each path
    keeps one slot, so neither waits for the other."""
    if parked <= 0:
        return inflight, 0
    for_retries = min(parked, max(1, inflight // 2))
    return max(1, inflight - for_retries), for_retries


def token_source(subscription: Subscription, providers: dict[str, OAuthProvider]) -> TokenSource | None:
    """What the tasks need to get the subscription's OAuth token (None without an oAuthPolicy)."""
    policy = subscription.oAuthPolicy
    if policy is None:
        return None
    return providers[policy.providerName].token_source(policy)  # validate checked the provider exists


def lane_plan(state: SubscriptionState, flow_settings: FlowSettings, parked: int, retries: bool = False,
              providers: dict[str, OAuthProvider] | None = None, pin: Pin | None = None,
              endpoints: Sequence[Endpoint] | None = None, former: Former | None = None,
              resume: dict[tuple[int, int], RetryState] | None = None) -> LanePlan:
    """The lane of one subscription in a round: the reading path's share, or the retry driver's (`retries`).
    providers: herald.yaml's OAuth providers by name (needed by subscriptions with an oAuthPolicy).
    pin: a pinned subscription's pin for the round: it sends to that endpoint only, with its Herald-Pin-Id.
    endpoints: its endpoints now (a discovered set, docs/design.md §7; None: the configured ones); `former`
    finds one that left, for BROADCAST messages that still owe it an answer. resume: the states the round
    continues (default: what the subscription carries; none for the retry driver, which gives its own)."""
    subscription = state.subscription
    spec = spec_of(subscription)
    reading, for_retries = split_inflight(spec.inflight, parked)
    slots = for_retries if retries else reading
    rate_per_s = spec.rate_per_s * slots / (reading + for_retries)
    current = targets(subscription, endpoints)
    lines = header_lines(subscription)
    pin_plan = None
    if pin is not None:
        by_name = [target for target in current if target.shown == pin.endpoint]
        current = tuple(by_name) if by_name else (former_target(pin.endpoint, former),) if pin.endpoint else \
            (current[pin.index],)
        pin_plan = PinPlan(pin.pin_id, pin.timeout_ms, pin.refused_since_ms)
        lines += (pin_plan.header_line,)
    if not current:
        raise ValueError(f"{subscription.id}: no endpoint to plan a round with (an empty set holds it)")
    if resume is None:
        resume = {} if retries else state.live_carried()
    resume, departed = placed(resume, current, former) if subscription.mode == "BROADCAST" else (resume, ())
    endpoints = current + departed
    return LanePlan(
        subscription_id=subscription.id,
        url=endpoints[0].url,
        targets=endpoints,
        broadcast=subscription.mode == "BROADCAST",
        oauth=token_source(subscription, providers or {}),
        header_lines=lines,
        retry=spec.retry,
        inflight=slots,
        rate_per_s=max(rate_per_s, 1e-3),
        request_timeout_s=spec.request_timeout_s,
        socket_timeout_s=spec.socket_timeout_s,
        sending_delay_s=spec.sending_delay_s,
        flow_settings=flow_settings,
        flow_state=state.flow_now(time.monotonic()),
        avro=subscription.contentType is ContentType.AVRO,
        ordered=spec.ordered,
        starts={} if retries else dict(state.positions),
        resume=resume,
        positional=not retries,
        tracking=TRACKING[subscription.trackingMode],
        signing_keys=subscription.signing.keys() if subscription.signing is not None else (),
        batch=None if retries else spec.batch,  # messages parked before a change to BATCH go out alone
        version=version_of(subscription) if pin is None else pinned_version(version_of(subscription), pin.pin_id),
        tls=subscription.tls.settings() if subscription.tls is not None else None,  # in force: load_config merged it
        pin=pin_plan,
        pending=state.pending(parked),
        departed=len(departed),
    )
