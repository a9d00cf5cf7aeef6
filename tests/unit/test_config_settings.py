"""herald.yaml's streaming, delivery and rateControl settings, and a subscription's DeliverySpec: defaults,
limits, problems named by file and key, and units converted once."""

from __future__ import annotations

import pickle

import pytest

from herald.config import load_config
from herald.config.model import Subscription
from herald.config.policies import SerialPolicy
from herald.config.settings import DeliverySettings, HeraldSettings, StreamingSettings
from herald.delivery.spec import DeliverySpec
from tests.support.config_files import SETTINGS, problems_of, write_conf


def test_defaults_of_the_new_settings(tmp_path):
    settings = load_config(write_conf(tmp_path)).settings
    streaming, delivery = settings.streaming, settings.delivery
    assert (streaming.batchDeadlineMs, streaming.parkAfterMs, streaming.configPollMs) == (10_000, 1000, 2000)
    assert (streaming.batch_deadline_s, streaming.park_after_s, streaming.config_poll_s) == (10.0, 1.0, 2.0)
    assert streaming.requestGraceMs == 1000 and streaming.request_grace_s == 1.0
    assert (delivery.transport, delivery.maxOpenRequests) == ("auto", 512)
    assert settings.rateControl.adjustIntervalMs == 30_000  # Hermes' 30 s period
    assert settings.rateControl.flow_settings().adjust_interval_s == 30.0


def test_settings_are_read_and_converted_to_seconds(tmp_path):
    settings = SETTINGS + """
streaming:
  batchDeadlineMs: 2500
  parkAfterMs: 0
  requestGraceMs: 250
  configPollMs: 200
delivery:
  transport: requests
  maxOpenRequests: 10000
rateControl:
  adjustIntervalMs: 1500
"""
    config = load_config(write_conf(tmp_path, settings=settings))
    streaming = config.settings.streaming
    assert (streaming.batch_deadline_s, streaming.park_after_s, streaming.config_poll_s) == (2.5, 0.0, 0.2)
    assert streaming.request_grace_s == 0.25
    assert config.settings.delivery == DeliverySettings(transport="requests", maxOpenRequests=10_000)
    assert config.settings.rateControl.flow_settings().adjust_interval_s == 1.5


@pytest.mark.parametrize("low, high", [(True, False), (False, True)])
def test_limits_are_reported_with_file_and_key(tmp_path, low, high):
    values = {"batchDeadlineMs": (999, 600_001), "parkAfterMs": (-1, 60_001), "requestGraceMs": (-1, 60_001),
              "configPollMs": (199, 600_001)}
    delivery = {"maxOpenRequests": (0, 10_001)}
    pick = 0 if low else 1
    settings = SETTINGS + "streaming:\n" + "".join(f"  {k}: {v[pick]}\n" for k, v in values.items()) + \
        "delivery:\n" + "".join(f"  {k}: {v[pick]}\n" for k, v in delivery.items()) + "  transport: httpx\n"
    problems = problems_of(write_conf(tmp_path, settings=settings))
    file = "conf/herald.yaml"
    if low:
        expected = {f"{file}: streaming.batchDeadlineMs: must be >= 1000 (got 999)",
                    f"{file}: streaming.parkAfterMs: must be >= 0 (got -1)",
                    f"{file}: streaming.requestGraceMs: must be >= 0 (got -1)",
                    f"{file}: streaming.configPollMs: must be >= 200 (got 199)",
                    f"{file}: delivery.maxOpenRequests: must be >= 1 (got 0)"}
    else:
        expected = {f"{file}: streaming.batchDeadlineMs: must be <= 600000 (got 600001)",
                    f"{file}: streaming.parkAfterMs: must be <= 60000 (got 60001)",
                    f"{file}: streaming.requestGraceMs: must be <= 60000 (got 60001)",
                    f"{file}: streaming.configPollMs: must be <= 600000 (got 600001)",
                    f"{file}: delivery.maxOpenRequests: must be <= 10000 (got 10001)"}
    expected.add(f"{file}: delivery.transport: must be one of 'auto', 'curl' or 'requests'")
    assert set(problems) == expected, problems


def test_a_retention_under_an_hour_is_refused_naming_the_key(tmp_path):
    """A job's maintenance vacuums beside its table writer, whose files are unreferenced until committed."""
    settings = SETTINGS + "  maintenanceRetentionHours: 0\n"
    assert problems_of(write_conf(tmp_path, settings=settings)) == [
        "conf/herald.yaml: storage.maintenanceRetentionHours: must be >= 1 (got 0)"]


def test_history_retentions_default_to_six_hours_of_offsets_and_a_week_of_the_rest(tmp_path):
    from herald.storage.history import HistoryRetention

    assert load_config(write_conf(tmp_path)).settings.storage.history_retention() == HistoryRetention(6, 168)
    kept = load_config(write_conf(tmp_path / "kept", settings=SETTINGS + "  offsetsRetentionHours: null\n"))
    assert kept.settings.storage.history_retention() == HistoryRetention(None, 168), "null: every row kept"
    assert problems_of(write_conf(tmp_path / "short", settings=SETTINGS + "  historyRetentionHours: 0.5\n")) == [
        "conf/herald.yaml: storage.historyRetentionHours: must be >= 1 (got 0.5)"]


def test_unknown_keys_of_the_new_sections_are_refused(tmp_path):
    settings = SETTINGS + "delivery:\n  maxOpen: x\nstreaming:\n  batchDeadline: x\n"
    assert set(problems_of(write_conf(tmp_path, settings=settings))) == {
        "conf/herald.yaml: delivery.maxOpen: unknown key", "conf/herald.yaml: streaming.batchDeadline: unknown key"}


def test_settings_are_frozen():
    settings = StreamingSettings()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error, whatever its class
        settings.batchDeadlineMs = 5  # type: ignore[misc]
    assert HeraldSettings.model_fields["delivery"].default == DeliverySettings()


def subscription(**policy) -> Subscription:
    return Subscription(topicName="a.b", name="c", endpoint="http://h/", subscriptionPolicy=SerialPolicy(**policy))


def test_delivery_spec_converts_every_field_once():
    spec = subscription(rate=25.5, messageTtl=60, messageBackoff=250, backoffMultiplier=2.5,
                        backoffMaxIntervalInSec=30, backoffJitter=0.25, maxAttempts=7, retryClientErrors=True,
                        requestTimeout=1500, socketTimeout=750, inflightSize=3, sendingDelay=120).delivery_spec
    assert isinstance(spec, DeliverySpec)
    retry = spec.retry
    assert retry.message_ttl_s == 60.0  # s -> s
    assert retry.backoff_s == 0.25  # ms -> s
    assert retry.backoff_multiplier == 2.5
    assert retry.max_backoff_s == 30.0  # s -> s
    assert retry.backoff_jitter == 0.25
    assert retry.max_attempts == 7
    assert retry.retry_client_errors is True
    assert spec.rate_per_s == 25.5  # messages per second, whole subscription
    assert spec.inflight == 3
    assert spec.request_timeout_s == 1.5  # ms -> s
    assert spec.socket_timeout_s == 0.75  # ms -> s
    assert spec.sending_delay_s == 0.12  # ms -> s
    assert not spec.ordered


def test_delivery_spec_of_the_defaults_and_of_hermes_edge_values():
    spec = subscription().delivery_spec
    assert (spec.rate_per_s, spec.inflight, spec.request_timeout_s, spec.socket_timeout_s, spec.sending_delay_s) \
        == (400.0, 100, 1.0, 0.0, 0.0)
    assert (spec.retry.message_ttl_s, spec.retry.backoff_s, spec.retry.max_backoff_s) == (3600.0, 0.1, 600.0)
    assert (spec.retry.max_attempts, spec.retry.retry_client_errors, spec.retry.backoff_jitter) == (0, False, 0.0)
    one_attempt = subscription(messageTtl=0, inflightSize=1).delivery_spec  # messageTtl 0 stays valid: one attempt
    assert one_attempt.retry.message_ttl_s == 0.0 and one_attempt.ordered


def test_delivery_spec_is_built_once_and_follows_copies():
    first = subscription(rate=10)
    assert first.delivery_spec is first.delivery_spec
    assert first.retry_policy() is first.delivery_spec.retry
    assert first == subscription(rate=10)  # the cached spec does not change equality
    changed = first.model_copy(update={"subscriptionPolicy": SerialPolicy(rate=20)})
    assert changed.delivery_spec.rate_per_s == 20.0 and first.delivery_spec.rate_per_s == 10.0
    copied = pickle.loads(pickle.dumps(first))
    assert copied == first and copied.delivery_spec == first.delivery_spec
