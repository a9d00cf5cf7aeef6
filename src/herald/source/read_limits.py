"""Admission control of Python streaming sources: read limits and Trigger.AvailableNow, which pyspark 4.1 added
(`pyspark.sql.streaming.datasource`). This is the one place Herald's Python Kafka source depends on the version.

On pyspark 4.0 a Python source's `latestOffset()` takes no argument: each micro-batch reads everything Kafka has
(`streaming.maxOffsetsPerTrigger` does not bound Herald's Python source there; Spark's own Kafka source, which
Herald uses wherever its jar loads, is bounded on every version), and Spark runs Trigger.AvailableNow (`herald run
--once`) over such a source by fixing its latest offsets when the query starts. Stand-ins of the 4.1 classes keep
the reader's code the same on both.
"""

from __future__ import annotations

try:
    from pyspark.sql.streaming.datasource import (  # noqa: F401 - re-exported
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
except ImportError:  # pyspark 4.0
    ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """pyspark 4.1's read limit (stand-in)."""

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        """Read everything available (what pyspark 4.0 always does)."""

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """pyspark 4.1's AvailableNow interface (stand-in): on 4.0 Spark fixes the latest offsets itself."""
