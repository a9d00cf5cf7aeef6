# Databricks notebook source
# MAGIC %md
# MAGIC # Herald: undelivered messages
# MAGIC
# MAGIC The messages Herald discarded (4xx, TTL or attempts exhausted, undecodable) for one subscription or all,
# MAGIC from the `undelivered` Delta table. Set the widgets above, then run all.
# MAGIC
# MAGIC - **storage_path**: Herald's `storage.path` (the tables are under `<storage_path>/tables`)
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

from herald import notebooks as herald_notebooks

undelivered = herald_notebooks.undelivered_frame(storage_path, subscription, window_hours, spark=spark)
print(f"{len(undelivered)} discarded message(s) for {subscription} in the last {window_hours:g} h")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The latest discards

# COMMAND ----------

display(herald_notebooks.latest_discards(undelivered, limit=50))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Discards over time, by reason and by HTTP status

# COMMAND ----------

discards_figure = herald_notebooks.plot_discards(undelivered)
display(discards_figure)

# COMMAND ----------

# MAGIC %md
# MAGIC ## One message
# MAGIC
# MAGIC The newest discard, pretty-printed; put a `message_id` from the table above in `message_id` to see another.
# MAGIC Its attempts are listed when its subscription tracks messages (`trackingMode: trackingAll`).

# COMMAND ----------

message_id = None
tracking = herald_notebooks.tracking_frame(storage_path, subscription, spark=spark)
print(herald_notebooks.message_detail(undelivered, message_id, tracking))
