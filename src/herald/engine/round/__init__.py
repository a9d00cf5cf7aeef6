"""What one round does, whatever started it, and the subscription state it moves (docs/design.md §3): `pipeline`
(`TopicPipeline`: a topic's subscriptions' states and its rounds), `steps` (plan, deliver, apply, record),
`planner`, `fanout` and `task` (the Spark job around the delivery loop), `projection` (decode, parse, filter
once), `result` (`RoundResult` and its table rows), `state`, `positions`, `resets`."""
