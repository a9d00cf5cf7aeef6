"""What starts rounds, and the topics' supervision (docs/design.md §2, §5): `shared_read` (`SharedRead`: one
query for every topic), `topics` and `supervision` (the set of topics, restarts), `catchup` (a subscription
behind reads alone), `retry_driver` (`RetryDriver`) and `parked` (parked messages re-driven), `checkpoint` (what
a micro-batch covered)."""
