"""What keeps a running job in step with its operators and its watchers (docs/design.md §10): `config_watcher`
(live configuration), `moves` (retransmission), `control` (what running tasks ask), `exporter` (Prometheus),
`dead_letters`, `signals`."""
