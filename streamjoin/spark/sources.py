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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from streamjoin.errors import ConfigurationError, CopartitioningError, UnknownTopicError

if TYPE_CHECKING:
    from streamjoin.config import AppConfig
    from streamjoin.topics import Topic

__all__ = [
    "FileSource",
    "KafkaSource",
    "Source",
    "input_partitions",
    "load_records",
    "pin_ending_offsets",
]

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


def input_partitions(
    config: AppConfig,
    source: Source,
    topics: Sequence[Topic],
    override: int | None,
    owner: str,
) -> int:
    """The partition count of the input ``topics`` that ``owner`` (``"join 'x'"``) reads:
    for a Kafka source, as the broker says (the same for every topic, and equal to what the
    app declares and to ``override`` when given); for files, ``override``, else the count
    the topics declare. Records are placed by murmur2(key) mod that count."""
    from streamjoin.spark.kafka_io import partition_counts

    names = [t.name for t in topics]
    declared = {t.partitions for t in topics if t.partitions is not None}
    if isinstance(source, KafkaSource):
        counts = partition_counts(source.bootstrap_servers, names, config.client_kwargs())
        missing = [n for n in names if n not in counts]
        if missing:
            raise UnknownTopicError(
                f"{owner}: topics {missing} do not exist on {source.bootstrap_servers}"
            )
        actual = {counts[n] for n in names}
        if len(actual) != 1:
            raise CopartitioningError(f"{owner}: input partition counts differ: {counts}")
        count = actual.pop()
        if declared and declared != {count}:
            raise CopartitioningError(
                f"{owner}: the app declares {sorted(declared)} partitions but the input "
                f"topics have {count}"
            )
        if override is not None and override != count:
            raise CopartitioningError(f"partitions={override} but the input topics have {count}")
        return count
    if override is not None:
        return override
    if len(declared) == 1:
        return declared.pop()
    raise ConfigurationError(
        f"{owner}: the app does not declare the partition count of {names}; pass "
        "partitions= (--partitions): records are placed by murmur2(key) mod that count"
    )


def pin_ending_offsets(
    source: Source, topics: Sequence[str], options: Mapping[str, Any]
) -> tuple[Source, dict[str, dict[int, int]]]:
    """The source with a Kafka ``ending_offsets="latest"`` pinned to the end offsets now
    (so the job knows exactly what it covered), and the end offsets of ``topics`` it reads
    up to (empty for files and for ``latest``-less specs without them)."""
    if not isinstance(source, KafkaSource):
        return source, {}
    if source.ending_offsets == "latest":
        from streamjoin.spark.kafka_io import offset_bounds

        _, ends = offset_bounds(source.bootstrap_servers, list(topics), options)
        return replace(source, ending_offsets=ends), {t: dict(ends.get(t, {})) for t in topics}
    if isinstance(source.ending_offsets, str):
        return source, {}
    return source, {t: dict(source.ending_offsets.get(t, {})) for t in topics}


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
