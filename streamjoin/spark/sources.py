"""Where history comes from: a Kafka offset/time range or exported files, as one record table.

Every source is normalized to the columns the jobs use::

    topic string, key binary, value binary, timestamp_ms long,
    partition int (null for files without it), offset long (null likewise)

Files (Parquet, or JSON lines) hold ``topic``, ``key``, ``value`` and
``timestamp`` (epoch milliseconds or a timestamp); ``partition`` and ``offset``
are optional. In JSON, ``key``/``value`` are the record bytes as UTF-8 text (a
JSON object under ``value`` is read as its text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from streamjoin.errors import ConfigurationError

__all__ = ["FileSource", "KafkaSource", "Source", "load_records"]

OffsetSpec = Literal["earliest", "latest"] | Mapping[str, Mapping[int, int]]


@dataclass(frozen=True)
class KafkaSource:
    """Topics read with Spark's Kafka source over ``[starting_offsets, ending_offsets)``.

    ``ending_offsets="latest"`` is pinned to the end offsets at submit time (so a
    bootstrap knows exactly which offsets it covered). ``start_timestamp_ms`` /
    ``end_timestamp_ms`` keep records whose timestamp is in ``[start, end)``; the
    start also makes Spark seek there instead of reading from the beginning.
    ``options`` are passed to the Kafka source (``kafka.security.protocol``...).
    """

    bootstrap_servers: str
    starting_offsets: OffsetSpec = "earliest"
    ending_offsets: OffsetSpec = "latest"
    start_timestamp_ms: int | None = None
    end_timestamp_ms: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FileSource:
    """Exported records in Parquet or JSON-lines files (``format`` None: guessed from paths)."""

    paths: Sequence[str]
    format: Literal["parquet", "json"] | None = None
    start_timestamp_ms: int | None = None
    end_timestamp_ms: int | None = None

    def resolved_format(self) -> Literal["parquet", "json"]:
        if self.format is not None:
            return self.format
        for raw in self.paths:
            path = Path(raw)
            if path.suffix == ".parquet" or (path.is_dir() and any(path.glob("*.parquet"))):
                return "parquet"
        return "json"


Source = KafkaSource | FileSource


def _offsets_json(spec: OffsetSpec, topics: Sequence[str]) -> str:
    """Spark's form of ``spec`` for a read of ``topics`` (it refuses offsets of other topics)."""
    if isinstance(spec, str):
        return spec
    return json.dumps(
        {t: {str(p): o for p, o in ps.items()} for t, ps in spec.items() if t in topics}
    )


def load_records(spark: Any, source: Source, topics: Sequence[str]) -> Any:
    """The records of ``topics`` in ``source``, normalized (see the module docstring)."""
    from pyspark.sql import functions as F

    if isinstance(source, KafkaSource):
        reader = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", source.bootstrap_servers)
            .option("subscribe", ",".join(topics))
            .option("startingOffsets", _offsets_json(source.starting_offsets, topics))
            .option("endingOffsets", _offsets_json(source.ending_offsets, topics))
            .option("failOnDataLoss", "true")
        )
        if source.start_timestamp_ms is not None and source.starting_offsets == "earliest":
            # a partition with no record at or after that time starts at its end (Spark's
            # default strategy fails the whole job with "No offset matched")
            reader = reader.option("startingTimestamp", str(source.start_timestamp_ms)).option(
                "startingOffsetsByTimestampStrategy", "latest"
            )
        for key, value in source.options.items():
            reader = reader.option(key, value)
        df = reader.load().select(
            F.col("topic"),
            F.col("key"),
            F.col("value"),
            F.unix_millis(F.col("timestamp")).alias("timestamp_ms"),
            F.col("partition").cast("int").alias("partition"),
            F.col("offset").cast("long").alias("offset"),
        )
    else:
        df = _load_files(spark, source)
        df = df.where(F.col("topic").isin(list(topics)))
    if source.start_timestamp_ms is not None:
        df = df.where(F.col("timestamp_ms") >= F.lit(source.start_timestamp_ms))
    if source.end_timestamp_ms is not None:
        df = df.where(F.col("timestamp_ms") < F.lit(source.end_timestamp_ms))
    return df


def _load_files(spark: Any, source: FileSource) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    paths = [str(p) for p in source.paths]
    if source.resolved_format() == "json":
        schema = StructType(
            [
                StructField("topic", StringType()),
                StructField("key", StringType()),
                StructField("value", StringType()),
                StructField("timestamp", LongType()),
                StructField("partition", IntegerType()),
                StructField("offset", LongType()),
            ]
        )
        raw = spark.read.schema(schema).json(paths)
    else:
        raw = spark.read.parquet(*paths)
    types = {f.name: f.dataType for f in raw.schema.fields}
    missing = {"topic", "key", "value", "timestamp"} - set(types)
    if missing:
        raise ConfigurationError(f"input files {paths} lack column(s) {sorted(missing)}")

    def as_binary(name: str) -> Any:
        column = F.col(name)
        return column if isinstance(types[name], BinaryType) else column.cast("binary")

    timestamp = (
        F.unix_millis(F.col("timestamp"))
        if isinstance(types["timestamp"], TimestampType)
        else F.col("timestamp").cast("long")
    )
    return raw.select(
        F.col("topic").cast("string").alias("topic"),
        as_binary("key").alias("key"),
        as_binary("value").alias("value"),
        timestamp.alias("timestamp_ms"),
        (F.col("partition").cast("int") if "partition" in types else F.lit(None).cast("int")).alias(
            "partition"
        ),
        (F.col("offset").cast("long") if "offset" in types else F.lit(None).cast("long")).alias(
            "offset"
        ),
    )
