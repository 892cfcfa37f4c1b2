"""The offline twin on Spark: backfill declared joins and bootstrap table state from history.

PySpark is an optional extra (``pip install streamjoin[spark]``); it is imported only when a
job runs, so ``import streamjoin.spark`` works without it. See ``docs/spark.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamjoin.spark._deps import INSTALL_HINT, require_pyspark

if TYPE_CHECKING:
    from streamjoin.spark.backfill_job import (
        BackfillResult,
        FileSink,
        KafkaSink,
        backfill,
    )
    from streamjoin.spark.bootstrap_job import BootstrapResult, bootstrap
    from streamjoin.spark.partitioning import kafka_partition_udf
    from streamjoin.spark.session import get_session
    from streamjoin.spark.sources import FileSource, KafkaSource

__all__ = [
    "INSTALL_HINT",
    "BackfillResult",
    "BootstrapResult",
    "FileSink",
    "FileSource",
    "KafkaSink",
    "KafkaSource",
    "backfill",
    "bootstrap",
    "get_session",
    "kafka_partition_udf",
    "require_pyspark",
]

_LAZY = {
    "BackfillResult": "streamjoin.spark.backfill_job",
    "FileSink": "streamjoin.spark.backfill_job",
    "KafkaSink": "streamjoin.spark.backfill_job",
    "backfill": "streamjoin.spark.backfill_job",
    "BootstrapResult": "streamjoin.spark.bootstrap_job",
    "bootstrap": "streamjoin.spark.bootstrap_job",
    "kafka_partition_udf": "streamjoin.spark.partitioning",
    "get_session": "streamjoin.spark.session",
    "FileSource": "streamjoin.spark.sources",
    "KafkaSource": "streamjoin.spark.sources",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'streamjoin.spark' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
