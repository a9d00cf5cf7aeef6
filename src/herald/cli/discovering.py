"""`herald endpoints`: a subscription's endpoints now, and for a discovered set which lookup named each
(docs/design.md §7). It reads the `endpoints` table the running job records every set in, so it answers with
or without a running job and never starts Spark; passwords are masked."""

from __future__ import annotations

from herald.cli.loading import load_lenient
from herald.cli.output import iso, print_json, print_rows


def endpoints_view(config, subscription) -> dict:
    """What `herald endpoints` shows: {"subscription", "source": "configured" | "discovery", "lookups",
    "changedAt" (epoch ms, or None), "endpoints": [{"endpoint", "lookups"}]}."""
    from herald.endpoint import mask_secrets

    discovery = subscription.discovery
    if discovery is None:
        return {"subscription": subscription.id, "source": "configured", "lookups": [], "changedAt": None,
                "endpoints": [{"endpoint": e.masked, "lookups": []} for e in subscription.targets]}
    from herald.engine.endpoints.discoveries import recorded_endpoints
    from herald.readout import table_store

    recorded = recorded_endpoints(table_store(config), subscription.id)
    return {"subscription": subscription.id, "source": "discovery",
            "lookups": [mask_secrets(url) for url in discovery.urls],
            "changedAt": recorded["changed_at_ms"] if recorded else None,
            "endpoints": recorded["endpoints"] if recorded else []}


def cmd_endpoints(args) -> int:
    config, subscription = load_lenient(args.conf, args.id)
    view = endpoints_view(config, subscription)
    if args.json:
        print_json(view)
        return 0
    if view["source"] == "configured":
        print(f"{subscription.id}: configured endpoints")
    elif view["changedAt"] is None:
        print(f"{subscription.id}: no endpoint discovered yet (a running job records its set once a lookup has "
              f"answered); lookups: {', '.join(view['lookups'])}")
        return 0
    else:
        print(f"{subscription.id}: {len(view['endpoints'])} endpoint(s) discovered, the set as of "
              f"{iso(view['changedAt'])}; lookups: {', '.join(view['lookups'])}")
        if not view["endpoints"]:
            print("  (empty: every lookup answered none; its messages wait, their TTL running)")
    print_rows([{"endpoint": item["endpoint"], "named by": ", ".join(item["lookups"]) or "-"}
                for item in view["endpoints"]], ["endpoint", "named by"] if view["source"] == "discovery"
               else ["endpoint"])
    return 0
