"""Driver side: one streaming query per topic shared by its subscriptions, the rounds it runs, and the threads
beside it (catch-up, retries, configuration, supervision); see docs/design.md §2-§8."""
