"""What `--once` waits for (herald.engine.runner): a subscription flow control slowed past the run's patience is
held until the next run; one at its hard rate, or slowed with little left, is waited for."""

from __future__ import annotations

from herald.config import load_config
from herald.delivery.flow import FlowMode, FlowSettings, FlowState
from herald.engine.once import lag, throttled
from herald.engine.round.state import SubscriptionState
from tests.support.config_files import write_conf

FLOW = FlowSettings(slow_rate_per_s=1.0, heartbeat_interval_s=60.0)


def _state(tmp_path, mode: FlowMode, rate: float | None, position: int) -> SubscriptionState:
    conf = tmp_path / "conf"
    config = load_config(conf if conf.exists() else write_conf(tmp_path))
    return SubscriptionState(config.subscriptions[0], positions={0: position, 1: 50},
                             flow=FlowState(mode, rate))


def test_a_subscription_probed_once_a_minute_with_a_backlog_is_held(tmp_path):
    frontier = {0: 1000, 1: 50}
    assert lag({0: 10, 1: 50}, frontier) == 990
    assert throttled(_state(tmp_path, FlowMode.HEARTBEAT, None, 10), frontier, 10.0, FLOW)
    assert not throttled(_state(tmp_path, FlowMode.HEARTBEAT, None, 1000), frontier, 10.0, FLOW), "caught up"


def test_slowed_with_little_left_or_at_its_hard_rate_the_run_waits(tmp_path):
    frontier = {0: 1000, 1: 50}
    assert not throttled(_state(tmp_path, FlowMode.SLOW, 20.0, 900), frontier, 10.0, FLOW), "100 at 20/s: 5 s"
    assert throttled(_state(tmp_path, FlowMode.SLOW, 1.0, 900), frontier, 10.0, FLOW), "100 at 1/s: 100 s"
    assert not throttled(_state(tmp_path, FlowMode.NORMAL, 1.0, 0), frontier, 10.0, FLOW), \
        "its hard rate is what it asked for: the run delivers what was there"
