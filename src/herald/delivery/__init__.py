"""Executor side of Herald: everything that runs inside a Spark task to deliver messages over HTTP.

Nothing in this package imports pyspark, the engine or the configuration models (tests/unit/test_layering.py).
A task receives a plain, picklable `plan.TaskPlan` and an iterator of `input.InputBatch`es, and returns a
`report.TaskReport`; `herald.engine.round.task` is the Spark glue around it. That keeps every piece unit-testable
without Spark:

- `message`: a record, its id, its retry state; `spec` and `policy`: a subscription's delivery
  settings in the code's units, and when to retry or give up (backoff, jitter, TTL, max attempts); `clock`:
  the loop's one clock value (monotonic seconds, with the wall clock's epoch ms for rows and carried states).
- `outcome`: the classification of one attempt (docs/design.md §4); `flow`: the hard rate cap and the adaptive
  controller; `headers`, `signing`, `oauth`: what each attempt carries.
- `transport`: the non-blocking HTTP clients (libcurl's multi interface, requests on a bounded thread pool).
- `lane`: one subscription in a task, written once for every delivery shape; `unit`: what one attempt sends (a
  message, a batch, a BROADCAST member) and what its end means; `assembly`: rows into units (SERIAL, or BATCH
  over the pure `batcher`); `choice`: which endpoint an attempt goes to (one, ANYCAST round-robin,
  BROADCAST); `sender`: the task's delivery loop over all the lanes; `input`: the task's rows as records, read
  ahead; `control`: the driver's word on which subscriptions are still delivered; `report`: what the task says
  back.
"""
