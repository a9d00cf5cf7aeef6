"""Driver side; see docs/design.md §2-§10 and its module map ("Where things are").

`runner` (`Runner`: `herald run`, wires the rest together), what only it asks (`stored_state`: a start's
reads, at once; `once`: when a --once run is done) and `context` (`EngineContext`: what every round shares) sit
here; the rest is in four wings, listed top to bottom: a module imports only from its own wing or one below it
(runner > stored_state, once > triggers > round > context, upkeep > endpoints; tests/unit/test_layering.py,
which names the one import that goes up):

- `triggers`, what starts rounds, and the topics' supervision: `shared_read` (`SharedRead`, one query for every
  topic), `topics` and `supervision` (the set of topics, restarts), `catchup`, `retry_driver` (`RetryDriver`)
  and `parked` (parked messages re-driven), `checkpoint`.
- `round`, what one round does and the state it moves: `pipeline` (`TopicPipeline`: a topic's subscriptions'
  states and its rounds), `steps` (plan, deliver, apply, record: the same for every kind of round), `planner`,
  `fanout` and `task` (the Spark job around the delivery loop), `projection` (decode, parse, filter once),
  `result` (`RoundResult` and its table rows), `state`, `positions`, `resets`.
- `upkeep`: `config_watcher` (live configuration), `moves` (retransmission), `control` (what running tasks
  ask), `exporter` (Prometheus), `dead_letters`, `signals`.
- `endpoints`: `pin_group` (`PinGroup`, a pin's state machine), `priority_groups` (`Priority`, the job's pins),
  `advisories`, `lookups` (lookup answers, endpoint sets, poll schedule), `discoveries` (`Discoveries`, the
  poller).
"""
