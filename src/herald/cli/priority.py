"""Priority groups (docs/design.md §6): unpin a pinned subscription, show its group's state.

Both work with or without a running job: they read and write the `advisories` table with delta-rs (a running
job picks an unpin up within streaming.configPollMs; otherwise the next run, or the activation of a suspended
subscription, switches at once). Endpoints are shown with their password masked.
"""

from __future__ import annotations

import getpass
import sys
import time

from herald.cli.loading import load_lenient
from herald.cli.output import iso, print_json


def _pinned_subscription(args):
    """(config, subscription), or None after saying why on stderr (it has no priority policy pinned)."""
    config, subscription = load_lenient(args.conf, args.id)
    if subscription.priority is None or subscription.priority.policy != "pinned":
        policy = subscription.priority.policy if subscription.priority is not None else "none"
        print(f"{subscription.id}: not a pinned subscription (priority policy: {policy}); nothing to unpin",
              file=sys.stderr)
        return None
    return config, subscription


def cmd_unpin(args) -> int:
    """Give the pin up (reason admin); exit 1 when there is nothing to give up (not pinned yet, or unpinned
    already), 2 when the subscription has no priority policy pinned."""
    from herald.engine.endpoints.priority_groups import unpin
    from herald.readout import table_store

    found = _pinned_subscription(args)
    if found is None:
        return 2
    config, subscription = found
    advisory, why = unpin(table_store(config), subscription.id, getpass.getuser(), int(time.time() * 1000))
    if args.json:
        print_json({"subscription": subscription.id, "unpinned": advisory is not None,
                    "endpoint": advisory.endpoint if advisory else None, "pinId": advisory.pin_id if advisory else None,
                    "reason": advisory.reason if advisory else None, "message": why or None})
        return 0 if advisory is not None else 1
    if advisory is None:
        print(f"{subscription.id}: {why}", file=sys.stderr)
        return 1
    print(f"{subscription.id}: unpinned {advisory.endpoint} (pin id {advisory.pin_id}); a running `herald run` "
          f"moves the pin to the next endpoint within streaming.configPollMs "
          f"({config.settings.streaming.configPollMs} ms), once the old pin's requests have ended; otherwise the "
          "next run does")
    return 0


def cmd_priority(args) -> int:
    """The group's state, as NATS' PriorityGroupState: policy, pinned endpoint, pin id, pinned since."""
    from herald.engine.endpoints.priority_groups import recorded_state
    from herald.readout import table_store

    config, subscription = load_lenient(args.conf, args.id)
    priority = subscription.priority
    if priority is None:
        state = {"policy": None}
    elif priority.policy == "pinned":
        state = {"policy": "pinned", "timeoutMs": priority.timeoutMs,
                 **recorded_state(table_store(config), subscription.id)}
    else:
        state = {"policy": priority.policy}
    if args.json:
        print_json({"subscription": subscription.id, **state})
        return 0
    print(f"subscription  {subscription.id}")
    print(f"policy        {state['policy'] or 'none (every endpoint takes its turn)'}")
    if state.get("policy") != "pinned":
        return 0
    if state["endpoint"] is None:
        print("pinned        nothing yet (the job pins the first endpoint when it starts delivering)")
        return 0
    print(f"pinned        {state['endpoint']}")
    print(f"pin id        {state['pin_id']}")
    print(f"since         {iso(state['pinned_since_ms'])} ({state['pin_reason']})")
    print(f"timeout       {state['timeoutMs']} ms without a 2xx while it has messages")
    if state["unpinned"] is not None:
        print(f"unpinned      {iso(state['unpinned']['at_ms'])} ({state['unpinned']['reason']}): the next endpoint "
              "is pinned once the old pin's requests have ended")
    return 0
