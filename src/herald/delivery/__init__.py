"""Executor side of Herald: everything that runs inside a Spark task to deliver messages over HTTP.

Nothing in this package imports pyspark or touches driver state. A task receives a plain, picklable
`DeliveryPlan` and an iterator of records, and returns plain report rows. That keeps every piece
unit-testable without Spark:

- `policy`: when to retry and when to give up (backoff, jitter, TTL, max attempts).
- `outcome`: classification of one HTTP attempt (the back-pressure table of docs/design.md §4).
- `flow`: the hard rate cap and the adaptive controller that slows down for a struggling subscriber.
- `transport`: the HTTP client (requests, keep-alive pools, total and idle timeouts).
- `headers`: the headers every attempt carries.
- `sender`: the delivery loop of one task.
"""
