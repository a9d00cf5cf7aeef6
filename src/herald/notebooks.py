"""What the notebooks show, as functions that work in any notebook or script: Herald's tables as pandas
frames, the series the notebooks plot, and the figures (matplotlib, which Databricks renders inline).

Tables are read with Spark (`spark.read.format("delta")`) when a session with Delta is given, and with delta-rs
(`deltalake`) otherwise, so the same calls work on Databricks, on a laptop and in tests.

Example::

    frame = undelivered_frame("/mnt/herald", subscription="demo.orders.billing", window_hours=24)
    figure = plot_discards(frame)          # counts per reason and per HTTP status, per time bucket
    metrics = metrics_frame("/mnt/herald", "all", window_hours=6)
    figure = plot_metrics(metrics)
"""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd

from herald.storage.reads import read_table as read_delta_table
from herald.storage.store import table_root
from herald.storage.tables import ADVISORIES, METRICS, TRACKING, UNDELIVERED

ALL = "all"
"""The subscription widget's value for every subscription."""

ANSWER_CLASSES = ("codes_4xx", "codes_5xx", "timeouts", "other_errors", "discarded")
"""The metrics columns of the stacked answers chart, in stacking order."""


def read_table(storage_path: str, table: str, spark=None, storage_options: dict | None = None) -> pd.DataFrame:
    """Every row of one of Herald's tables under `storage_path`, with Spark when `spark` is given and can read
    Delta, with delta-rs otherwise (an absent table gives no rows)."""
    path = f"{table_root(storage_path)}/{table}"
    if spark is not None:
        try:
            return spark.read.format("delta").load(path).toPandas()
        except Exception:  # noqa: BLE001 - no Delta in this session (or no table yet): delta-rs reads it
            pass
    return read_delta_table(path, table, None, storage_options).to_pandas()


def _window(frame: pd.DataFrame, subscription: str, time_column: str, window_hours: float | None,
            now: dt.datetime | None) -> pd.DataFrame:
    if subscription and subscription != ALL:
        frame = frame[frame["subscription"] == subscription]
    if window_hours:
        now = now or dt.datetime.now(dt.timezone.utc)
        frame = frame[frame[time_column] >= pd.Timestamp(now - dt.timedelta(hours=window_hours))]
    return frame.sort_values(time_column).reset_index(drop=True)


def undelivered_frame(storage_path: str, subscription: str = ALL, window_hours: float | None = 24, spark=None,
                      now: dt.datetime | None = None) -> pd.DataFrame:
    """Discarded messages of one subscription (or `ALL`) whose discard time is within the last `window_hours`
    (None: all), oldest first."""
    return _window(read_table(storage_path, UNDELIVERED, spark), subscription, "timestamp", window_hours, now)


def metrics_frame(storage_path: str, subscription: str = ALL, window_hours: float | None = 24, spark=None,
                  now: dt.datetime | None = None) -> pd.DataFrame:
    """Metrics rows (one per subscription and round) finished within the last `window_hours`, oldest first."""
    frame = read_table(storage_path, METRICS, spark)
    frame = frame[frame["finished_at"].notna()]
    return _window(frame, subscription, "finished_at", window_hours, now)


def tracking_frame(storage_path: str, subscription: str = ALL, window_hours: float | None = None, spark=None,
                   now: dt.datetime | None = None) -> pd.DataFrame:
    """Tracked steps (trackingAll / discardedOnly) of one subscription (or `ALL`), oldest first."""
    return _window(read_table(storage_path, TRACKING, spark), subscription, "timestamp", window_hours, now)


def advisories_frame(storage_path: str, subscription: str = ALL, window_hours: float | None = None, spark=None,
                     now: dt.datetime | None = None) -> pd.DataFrame:
    """Priority advisories (pins given and given up, endpoints masked) of one subscription (or `ALL`), oldest
    first: which endpoint of a pinned subscription took the traffic, since when and why."""
    frame = _window(read_table(storage_path, ADVISORIES, spark), subscription, "timestamp", window_hours, now)
    columns = ["timestamp", "subscription", "type", "endpoint", "pin_id", "reason"]
    return frame[columns] if len(frame) else pd.DataFrame(columns=columns)


def lag_frame(conf_dir: str, subscription: str = ALL, timeout_s: float = 3.0) -> pd.DataFrame:
    """The lag now, per subscription and partition (Kafka's end offset minus the subscription's position),
    asking the Kafka cluster of the configuration in `conf_dir`. A subscription whose lag cannot be asked has
    one row with `error` set."""
    from pathlib import Path

    from herald.config import load_config_lenient
    from herald.readout import lag

    config = load_config_lenient(Path(conf_dir)).config
    rows = []
    for item in config.subscriptions:
        if subscription not in (ALL, "", None) and item.id != subscription:
            continue
        partitions, error = lag(config, item, timeout_s)
        if error:
            rows.append({"subscription": item.id, "error": error})
        rows.extend({"subscription": item.id, "partition": p["partition"], "end_offset": p["endOffset"],
                     "position": p["position"], "lag": p["lag"], "error": None} for p in partitions)
    return pd.DataFrame(rows, columns=["subscription", "partition", "end_offset", "position", "lag", "error"])


def latest_discards(frame: pd.DataFrame, limit: int = 20) -> pd.DataFrame:
    """The newest discards first, with the columns a person looks at."""
    columns = ["timestamp", "subscription", "partition", "offset", "message_id", "http_status", "reason",
               "ended_by", "attempts"]
    return frame.sort_values("timestamp", ascending=False).head(limit)[columns].reset_index(drop=True)


def discard_counts(frame: pd.DataFrame, by: str, freq: str = "1min") -> pd.DataFrame:
    """Discards per time bucket (`freq`, a pandas frequency) and per value of `by` ('reason' or
    'http_status'): one column per value, one row per bucket."""
    if frame.empty:
        return pd.DataFrame()
    keyed = frame.assign(bucket=frame["timestamp"].dt.floor(freq), key=frame[by].fillna("none").astype(str))
    return keyed.groupby(["bucket", "key"]).size().unstack("key", fill_value=0).sort_index()


def message_detail(frame: pd.DataFrame, message_id: str | None = None, tracking: pd.DataFrame | None = None) -> str:
    """One discarded message (the newest, or `message_id`) pretty-printed with its discard record, and its
    attempts from `tracking` (`tracking_frame`) when its subscription tracks messages."""
    rows = frame if message_id is None else frame[frame["message_id"] == message_id]
    if rows.empty:
        return f"no discarded message {message_id}" if message_id else "no discarded message"
    row = rows.sort_values("timestamp").iloc[-1]
    try:
        body = json.dumps(json.loads(row["message"]), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        body = str(row["message"])
    return (f"{row['message_id']}  {row['subscription']}  partition {row['partition']} offset {row['offset']}\n"
            f"discarded {row['timestamp']} after {row['attempts']} attempt(s), ended by {row['ended_by']}: "
            f"{row['reason']}\n{_history(tracking, row['subscription'], row['message_id'])}\n{body}")


def _history(tracking: pd.DataFrame | None, subscription: str, message_id: str) -> str:
    steps = pd.DataFrame() if tracking is None or tracking.empty else tracking[
        (tracking["subscription"] == subscription) & (tracking["message_id"] == message_id)]
    if steps.empty:
        return "history: not tracked (trackingMode: trackingAll records every attempt)"
    from herald.delivery.report import STEP_ORDER

    ranked = steps.assign(rank=steps["status"].map(STEP_ORDER).fillna(1))
    lines = ["history:"]
    for step in ranked.sort_values(["timestamp", "rank"], kind="stable").itertuples():
        status = "" if pd.isna(step.http_status) else f" {int(step.http_status)}"
        reason = f"  {step.reason}" if isinstance(step.reason, str) and step.reason else ""
        lines.append(f"  {step.timestamp}  {step.status}{status}{reason}")
    return "\n".join(lines)


def per_minute(frame: pd.DataFrame, columns: tuple[str, ...] | list[str], freq: str = "1min") -> pd.DataFrame:
    """Sums of metrics `columns` per time bucket of `finished_at` (all subscriptions of the frame together)."""
    if frame.empty:
        return pd.DataFrame(columns=list(columns))
    bucketed = frame.assign(bucket=frame["finished_at"].dt.floor(freq))
    return bucketed.groupby("bucket")[list(columns)].sum().sort_index()


def flow_rates(frame: pd.DataFrame) -> pd.DataFrame:
    """The controller's rate (msg/s) over time, one column per subscription."""
    if frame.empty:
        return pd.DataFrame()
    rows = frame[frame["kind"] != "retry"] if "kind" in frame else frame
    return rows.pivot_table(index="finished_at", columns="subscription", values="flow_rate", aggfunc="last")


def plot_discards(frame: pd.DataFrame, freq: str = "1min"):
    """Two bar charts: discards per `freq` by reason, and by HTTP status (matplotlib Figure)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 6), layout="constrained")
    for axes, by, title in ((figure.add_subplot(2, 1, 1), "reason", "discards by reason"),
                            (figure.add_subplot(2, 1, 2), "http_status", "discards by HTTP status")):
        counts = discard_counts(frame, by, freq)
        _stacked_bars(axes, counts, title, "messages")
    return figure


def plot_metrics(frame: pd.DataFrame, freq: str = "1min", lag: pd.DataFrame | None = None):
    """Delivered per `freq` with the flow rate, the answers by class stacked, inflight, and with `lag`
    (`lag_frame`) the lag now per subscription and partition (matplotlib Figure)."""
    from matplotlib.figure import Figure

    panels = 4 if lag is not None else 3
    figure = Figure(figsize=(11, 3 * panels), layout="constrained")
    delivered_axes = figure.add_subplot(panels, 1, 1)
    delivered = per_minute(frame, ["delivered"], freq)
    delivered_axes.bar(delivered.index, delivered["delivered"] if not delivered.empty else [],
                       width=_bar_width(delivered.index), color="tab:green", label="delivered")
    delivered_axes.set_title(f"delivered per {freq}, and the flow rate")
    delivered_axes.set_ylabel("messages")
    rates = flow_rates(frame)
    if not rates.empty:
        rate_axes = delivered_axes.twinx()
        for subscription in rates.columns:
            rate_axes.plot(rates.index, rates[subscription], drawstyle="steps-post", label=f"{subscription} rate")
        rate_axes.set_ylabel("msg/s")
    _stacked_bars(figure.add_subplot(panels, 1, 2), per_minute(frame, ANSWER_CLASSES, freq),
                  f"4xx, 5xx, timeouts, other errors and discards per {freq}", "answers")
    inflight_axes = figure.add_subplot(panels, 1, 3)
    if not frame.empty:
        for subscription, rows in frame.groupby("subscription"):
            inflight_axes.plot(rows["finished_at"], rows["inflight"], marker=".", label=subscription)
        inflight_axes.legend(loc="upper left", fontsize="small")
    inflight_axes.set_title("inflight (most at once in a round)")
    inflight_axes.set_ylabel("messages")
    if lag is not None:
        lag_axes = figure.add_subplot(panels, 1, 4)
        known = lag[lag["lag"].notna()] if not lag.empty else lag
        lag_axes.set_title("lag now (end offset minus position), per subscription and partition")
        lag_axes.set_ylabel("messages")
        if known.empty:
            lag_axes.text(0.5, 0.5, "lag unknown (Kafka not reachable)", transform=lag_axes.transAxes,
                          ha="center")
        else:
            labels = [f"{s}[{int(p)}]" for s, p in zip(known["subscription"], known["partition"])]
            lag_axes.bar(labels, known["lag"].astype(int), color="tab:orange")
            lag_axes.tick_params(axis="x", labelrotation=30, labelsize="small")
    return figure


def _bar_width(index) -> float:
    """Bars one bucket wide (matplotlib dates are in days)."""
    if len(index) > 1:
        return (index[1] - index[0]).total_seconds() / 86400 * 0.8
    return 1 / 1440 * 0.8


def _stacked_bars(axes, counts: pd.DataFrame, title: str, unit: str) -> None:
    axes.set_title(title)
    axes.set_ylabel(unit)
    if counts.empty:
        axes.text(0.5, 0.5, "nothing in this window", transform=axes.transAxes, ha="center")
        return
    bottom = None
    width = _bar_width(counts.index)
    for column in counts.columns:
        axes.bar(counts.index, counts[column], width=width, bottom=bottom, label=str(column))
        bottom = counts[column] if bottom is None else bottom + counts[column]
    margin = pd.Timedelta(days=width * 4)  # a few buckets of room, so that one bucket is not the whole chart
    axes.set_xlim(counts.index.min() - margin, counts.index.max() + margin)
    axes.legend(loc="upper left", fontsize="small")
