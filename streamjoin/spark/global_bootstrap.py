"""Bootstrap a global table's local copy on Spark, so a worker starts with it warm.

A global table's copy (``app.global_table(topic)``) is a pure function of its topic: the
latest value per key (a null value deletes the key). Spark computes it from the topic
read up to the end offsets pinned at submit time; the driver then writes it into the
RocksDB store a worker opens (``<state_dir>/global/<table>``), together with those end
offsets as the positions the worker resumes from. A worker started on that state dir
reads only what was added to the topic after the bootstrap.

Every worker holds the whole table, so collecting the rows to the driver costs what one
worker's copy costs. Only a Kafka source works: the copy must record the offsets it
covers. Copy the state dir to each worker (or run the bootstrap once per worker).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamjoin.errors import NotFoundError, SparkJobError
from streamjoin.spark.session import SparkRun
from streamjoin.spark.sources import KafkaSource, load_records, pin_ending_offsets
from streamjoin.state.global_rows import GLOBAL_DIR, ROW_PREFIX, position_writes
from streamjoin.state.rocksdb import TableDatabase

if TYPE_CHECKING:
    from streamjoin.app import App

__all__ = ["GlobalBootstrapResult", "bootstrap_global_table"]

#: rows written per store batch
_BATCH = 50_000


@dataclass(frozen=True)
class GlobalBootstrapResult:
    """What a global-table bootstrap wrote."""

    table: str
    path: Path
    keys: int
    #: the topic's end offsets the copy covers (the worker resumes there)
    positions: Mapping[int, int]


def bootstrap_global_table(
    app: App,
    table_name: str,
    *,
    source: KafkaSource,
    state_dir: str | Path | None = None,
    master: str = "local[*]",
    spark: Any = None,
    kafka_packages: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
) -> GlobalBootstrapResult:
    """Build global table ``table_name``'s copy under ``state_dir`` (default: the app's)."""
    from pyspark.sql import functions as F

    table = app.global_tables.get(table_name)
    if table is None:
        known = ", ".join(sorted(app.global_tables)) or "none"
        raise NotFoundError(
            f"app {app.id!r} has no global table {table_name!r} (global tables: {known})"
        )
    if not isinstance(source, KafkaSource):
        raise SparkJobError(
            f"global table {table_name!r}: bootstrap needs a KafkaSource (the copy records "
            "the topic offsets it covers, which files do not have)"
        )
    root = Path(state_dir if state_dir is not None else app.config.state_path or "").resolve()
    path = root / GLOBAL_DIR / table_name
    if path.exists() and any(path.iterdir()):
        raise SparkJobError(
            f"global table {table_name!r} already has a store at {path}: delete it first "
            "(a bootstrap writes a copy from scratch)"
        )
    topic = table.source.name
    pinned, ends = pin_ending_offsets(source, [topic], app.config.client_kwargs())
    positions = ends.get(topic)
    if not positions:
        raise SparkJobError(f"topic {topic!r} has no end offsets (does it exist?)")
    run = SparkRun(master, spark, kafka_packages, spark_conf)
    session = run.session(f"streamjoin global bootstrap {app.id}:{table_name}", kafka=True)
    records = load_records(session, pinned, [topic]).where(F.col("key").isNotNull())
    latest = (
        records.groupBy("key")
        .agg(F.max_by("value", F.struct("offset", "partition")).alias("value"))
        .where(F.col("value").isNotNull())
    )
    database = TableDatabase(path, table_name, partitions=[0])
    keys = 0
    try:
        store = database.partition(0)
        batch: dict[bytes, bytes | None] = {}
        for row in latest.toLocalIterator():
            batch[ROW_PREFIX + bytes(row["key"])] = bytes(row["value"])
            if len(batch) >= _BATCH:
                store.write(batch, None)
                keys += len(batch)
                batch = {}
        keys += len(batch)
        batch.update(position_writes(positions))
        store.write(batch, None)
    finally:
        database.close()
    return GlobalBootstrapResult(table_name, path, keys, dict(positions))
