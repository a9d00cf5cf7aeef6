"""Where a subscription's rounds deliver (docs/design.md §6, §7): `pin_group` (`PinGroup`: a pin's state
machine), `priority_groups` (`Priority`: the job's pins), `advisories` (their Kafka topic), `lookups` (lookup
answers, endpoint sets, poll schedule), `discoveries` (`Discoveries`: the poller)."""
