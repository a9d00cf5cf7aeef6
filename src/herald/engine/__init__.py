"""Driver side; see docs/design.md §2-§10 and its module map ("Where things are").

- A round: `topic` (`TopicPipeline`: a topic's subscriptions' states and its rounds), `round_steps` (plan,
  deliver, apply, record: the same for every kind of round), `planner`, `fanout` and `task` (the Spark job around
  the delivery loop), `projection` (decode, parse, filter once), `rounds` (`RoundResult` and its table rows),
  `state`, `positions`, `resets`.
- What starts rounds: `read` (`SharedRead`, one query for every topic), `topics` and `supervision` (the set of
  topics, restarts), `catchup`, `retries` and `parked` (parked messages re-driven), `checkpoint`.
- Endpoints: `pinning` (a pin's state machine), `priority` (the job's pins), `advisories`, `discovery` (lookup
  answers and sets), `discovering` (the poller).
- Upkeep: `runner` (wires them together), `context`, `watcher` (live configuration), `moves` (retransmission),
  `control`, `exporter`, `deadletter`, `signals`.
"""
