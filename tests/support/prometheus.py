"""Scraping a Prometheus exporter the tests started on 127.0.0.1."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from herald.engine.upkeep.exporter import PrometheusExporter


def samples(exporter: PrometheusExporter) -> dict[tuple[str, tuple], float]:
    """(metric name, sorted labels) -> value of every sample the exporter serves now."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5).read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found
