"""The offsets a micro-batch of the job's shared read covers, per topic, read from the query's checkpoint.

Spark writes each micro-batch's end offsets to `<checkpoint>/offsets/<batch id>` before it runs the batch
(a write-ahead log: a version line, a metadata line, then one line of offsets per source, in the kafka
source's JSON: {"topic": {"partition": next offset}, ...}); the batch starts where the previous one ended.
`foreachBatch` is not told either, so the handler reads them here. Both Kafka connectors write the same shape.

The first batch of a new checkpoint starts where the query was told to start (`startingOffsets`). When that is
unknown (a batch 0 replayed after a restart), the start is taken as the end: an overestimate, which only
sends subscriptions to catch up on the batch, where an underestimate could skip messages. A partition that
is not in the previous batch's offsets was added to the topic since: both Kafka sources read a new partition
from its start, so its range starts at 0 (what retention deleted before it was read is then a lost range).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from herald.storage.local_files import local_path


def _on_disk(path: str) -> str | None:
    """The local file system path of a checkpoint path: a plain path, `file:///x` or Hadoop's `file:/x` (None:
    a cluster file system's, read through Spark's Hadoop client)."""
    return local_path(path)


def _hadoop(spark, path: str):
    """(file system, path) of a cluster path (dbfs:, s3a:, abfss:, file://), through Spark's Hadoop client."""
    jvm = spark._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration()), hadoop_path


def _read_text(spark, path: str) -> str | None:
    local = _on_disk(path)
    if local is not None:
        path = local
        try:
            with open(path, encoding="utf-8") as file:
                return file.read()
        except FileNotFoundError:
            return None
    fs, hadoop_path = _hadoop(spark, path)
    if not fs.exists(hadoop_path):
        return None
    stream = fs.open(hadoop_path)
    try:
        return spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()


def _batch_ids(spark, directory: str) -> list[int]:
    """The micro-batch ids logged in one of the checkpoint's logs (`offsets` or `commits`), local or remote."""
    local = _on_disk(directory)
    if local is not None:
        directory = local
        names = os.listdir(directory) if os.path.isdir(directory) else []
    else:
        fs, hadoop_path = _hadoop(spark, directory)
        names = [status.getPath().getName() for status in fs.listStatus(hadoop_path)] if fs.exists(hadoop_path) else []
    return [int(name) for name in names if name.isdigit()]


def has_offsets(spark, checkpoint: str) -> bool:
    """True when the checkpoint has logged some micro-batch (the query is not new)."""
    return last_logged(spark, checkpoint) is not None


def last_logged(spark, checkpoint: str) -> int | None:
    """The id of the last micro-batch in the checkpoint's offset log (Spark logs a batch before it runs it), or
    None when it logged none."""
    ids = _batch_ids(spark, f"{checkpoint.rstrip('/')}/offsets")
    return max(ids) if ids else None


def logged_topics(spark, checkpoint: str, batch_id: int) -> dict[str, dict[int, int]] | None:
    """Kafka topic -> partition -> end offset of `batch_id` in the checkpoint's offset log; None when not logged.
    A topic the source no longer reads (deleted from Kafka) is not in it."""
    text = _read_text(spark, f"{checkpoint.rstrip('/')}/offsets/{batch_id}")
    if text is None:
        return None
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines[2:]:
        offsets = json.loads(line)
        if isinstance(offsets, dict):
            return {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in offsets.items()}
    return {}


def logged_offsets(spark, checkpoint: str, batch_id: int, kafka_topic: str) -> dict[int, int] | None:
    """The end offsets of `kafka_topic` in `batch_id` of the checkpoint's offset log; None when not logged."""
    return (logged_topics(spark, checkpoint, batch_id) or {}).get(kafka_topic)


def last_committed(spark, checkpoint: str) -> int | None:
    """The id of the last micro-batch the checkpoint marks as committed, or None."""
    ids = _batch_ids(spark, f"{checkpoint.rstrip('/')}/commits")
    return max(ids) if ids else None


def batch_ranges(spark, checkpoint: str, batch_id: int, kafka_topic: str,
                 first_start: Mapping[int, int] | None) -> dict[int, tuple[int, int]]:
    """partition -> (start, end) of `kafka_topic` in micro-batch `batch_id`.

    first_start: where a checkpoint this run created told the query to start (for batch 0); None otherwise.
    """
    end = logged_offsets(spark, checkpoint, batch_id, kafka_topic)
    if end is None:
        raise RuntimeError(f"micro-batch {batch_id} of {kafka_topic} is not in {checkpoint}/offsets")
    previous = logged_offsets(spark, checkpoint, batch_id - 1, kafka_topic) if batch_id > 0 else None
    return ranges_between(end, previous, first_start if batch_id == 0 else None)


def ranges_between(end: Mapping[int, int], previous: Mapping[int, int] | None,
                   first_start: Mapping[int, int] | None) -> dict[int, tuple[int, int]]:
    """partition -> (start, end) of one topic in a micro-batch: from the previous batch's end offsets (None for
    the first batch of a checkpoint, or one not logged any more), else from `first_start` (where a checkpoint this
    run created told the query to start, for batch 0), else empty (start taken as the end)."""
    if previous is not None:
        start = {p: previous.get(p, 0) for p in end}  # a partition added since: from its start
    elif first_start is not None:
        start = dict(first_start)
    else:
        start = dict(end)
    return {p: (min(start.get(p, e), e), e) for p, e in end.items()}


def remove(spark, path: str, must: bool = False) -> None:
    """Delete a checkpoint directory (local or remote) and everything in it; nothing when it does not exist.
    must: raise when some of it is still there (a query started on what is left could keep the old query id
    and count its micro-batches from 0 again, under slices the tables already hold)."""
    local = _on_disk(path)
    if local is not None:
        import shutil

        path = local
        shutil.rmtree(path, ignore_errors=True)
        if must and os.path.exists(path):
            raise RuntimeError(f"could not delete the stale checkpoint {path}")
        return
    fs, hadoop_path = _hadoop(spark, path)
    if fs.exists(hadoop_path):
        fs.delete(hadoop_path, True)
        if must and fs.exists(hadoop_path):
            raise RuntimeError(f"could not delete the stale checkpoint {path}")


def children(spark, directory: str) -> list[str]:
    """The names of the directories in `directory` (local or remote); none when it does not exist."""
    local = _on_disk(directory)
    if local is not None:
        directory = local
        return sorted(name for name in os.listdir(directory) if os.path.isdir(os.path.join(directory, name))) \
            if os.path.isdir(directory) else []
    fs, hadoop_path = _hadoop(spark, directory)
    if not fs.exists(hadoop_path):
        return []
    return sorted(status.getPath().getName() for status in fs.listStatus(hadoop_path) if status.isDirectory())
