# Databricks notebook source
# MAGIC %md
# MAGIC # Herald: delivery metrics
# MAGIC
# MAGIC What Herald delivered and how the subscribers answered, from the `metrics` Delta table (one row per
# MAGIC subscription and round). Set the widgets above, then run all.
# MAGIC
# MAGIC - **storage_path**: Herald's `storage.path`
# MAGIC - **subscription**: a subscription id (`group.topic.name`) or `all`
# MAGIC - **window_hours**: how far back to look
# MAGIC - **conf**: Herald's configuration directory (for the lag, asked of Kafka); empty: no lag

# COMMAND ----------

dbutils.widgets.text("storage_path", "/dbfs/herald", "storage path")
dbutils.widgets.text("subscription", "all", "subscription (or all)")
dbutils.widgets.text("window_hours", "24", "window (hours)")
dbutils.widgets.text("conf", "", "conf directory (for the lag)")

storage_path = dbutils.widgets.get("storage_path")
subscription = dbutils.widgets.get("subscription").strip() or "all"
window_hours = float(dbutils.widgets.get("window_hours"))
conf = dbutils.widgets.get("conf").strip()

# COMMAND ----------

from herald import notebooks as herald_notebooks

metrics = herald_notebooks.metrics_frame(storage_path, subscription, window_hours, spark=spark)
totals = metrics[["delivered", "discarded", "filtered", "attempts", "parked"]].sum()
print(f"{subscription}, last {window_hours:g} h: " + ", ".join(f"{name} {int(value)}" for name, value in totals.items()))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Per minute
# MAGIC
# MAGIC Delivered messages and the adaptive controller's rate; 4xx, 5xx, timeouts, other errors and discards
# MAGIC stacked; the most messages in flight in each round; and, with a `conf` directory, the lag now.

# COMMAND ----------

display(herald_notebooks.per_minute(metrics, ["delivered", *herald_notebooks.ANSWER_CLASSES]).reset_index())
lag = herald_notebooks.lag_frame(conf, subscription) if conf else None
if lag is not None:
    display(lag)

# COMMAND ----------

metrics_figure = herald_notebooks.plot_metrics(metrics, lag=lag)
display(metrics_figure)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Priority advisories
# MAGIC
# MAGIC Pinned subscriptions: every pin given and given up (`pinned` / `unpinned`, with the endpoint, the pin id
# MAGIC and why: `start`, `timeout`, `admin`, `endpoint removed`), in the window.

# COMMAND ----------

display(herald_notebooks.advisories_frame(storage_path, subscription, window_hours, spark=spark))
