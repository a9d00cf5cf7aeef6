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

# COMMAND ----------

dbutils.widgets.text("storage_path", "/dbfs/herald", "storage path")
dbutils.widgets.text("subscription", "all", "subscription (or all)")
dbutils.widgets.text("window_hours", "24", "window (hours)")

storage_path = dbutils.widgets.get("storage_path")
subscription = dbutils.widgets.get("subscription").strip() or "all"
window_hours = float(dbutils.widgets.get("window_hours"))

# COMMAND ----------

from herald import inspect as herald_inspect

metrics = herald_inspect.metrics_frame(storage_path, subscription, window_hours, spark=spark)
totals = metrics[["delivered", "discarded", "filtered", "attempts", "parked"]].sum()
print(f"{subscription}, last {window_hours:g} h: " + ", ".join(f"{name} {int(value)}" for name, value in totals.items()))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Per minute
# MAGIC
# MAGIC Delivered messages and the adaptive controller's rate; 4xx, 5xx, timeouts, other errors and discards
# MAGIC stacked; the most messages in flight in each round.

# COMMAND ----------

display(herald_inspect.per_minute(metrics, ["delivered", *herald_inspect.ANSWER_CLASSES]).reset_index())

# COMMAND ----------

metrics_figure = herald_inspect.plot_metrics(metrics)
display(metrics_figure)
