"""Driver side; see docs/design.md §2-§8.

- Spark glue: `topic` (a topic's shared streaming query and its subscriptions' states), `checkpoint`,
  `projection` (decode, parse, filter once), `fanout` and `task` (the Spark job around the delivery loop).
- The round: `round_steps` (participants, the task plan, delivery, recording: the same for every kind of round),
  `rounds` (what a round did and its table rows).
- The threads that schedule rounds and changes: `catchup`, `retries`, `topics` and `supervision`, `watcher`
  and `moves`, `control`, `exporter`, `deadletter`; `runner` wires them together.
- Pure decisions: `positions`, `planner`, `state`.
"""
