"""Backfill: run an app's declared stream-stream join over history on Spark.

Records are placed in the join partition a worker would have read them from
(murmur2 of the serialized key, mod the join's partition count), sorted per
partition by ``(timestamp, side, source partition, offset)`` with left before
right on ties, and fed through the same :class:`~streamjoin.joins.core.StreamStreamJoin`
the workers run, over a :class:`~streamjoin.joins.state.MemoryKeyValueView`.
Because input is in event-time order nothing is late, so the result equals the
workers' whenever their input's lateness stayed within the grace period.

The join function is called like the worker calls it (decoded key and values,
awaited if async); its non-None results are encoded with the output topic's
codecs and written to Kafka (explicit partitions, the join's timestamps) or to
files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from streamjoin.errors import (
    ConfigurationError,
    CopartitioningError,
    NotFoundError,
    UnknownTopicError,
    UnsupportedJoin,
)
from streamjoin.spark.progress import Counters, Progress, ProgressReporter
from streamjoin.spark.runners import JoinRunner, OutputRecord
from streamjoin.spark.sources import KafkaSource, Source, load_records

if TYPE_CHECKING:
    from streamjoin.app import App
    from streamjoin.config import AppConfig
    from streamjoin.joins.api import StreamStreamJoinDecl
    from streamjoin.topology import Topology

__all__ = [
    "BackfillResult",
    "CopartitioningError",
    "FileSink",
    "JoinRunner",
    "KafkaSink",
    "OutputRecord",
    "Sink",
    "backfill",
]

#: ties at equal timestamps: left side first (a fixed, documented order)
SIDE_RANK = {"left": 0, "right": 1}
_MISMATCH_TAG = "streamjoin.CopartitioningError"

#: The old name of :class:`~streamjoin.errors.CopartitioningError` here; kept importable.
PartitioningMismatch = CopartitioningError


@dataclass(frozen=True)
class KafkaSink:
    """Write to ``topic`` (created with the join's partition count when missing)."""

    topic: str
    bootstrap_servers: str | None = None  # default: the source's, else the app's broker


@dataclass(frozen=True)
class FileSink:
    """Write files under ``path`` (``format`` None: Parquet for ``*.parquet``, else JSON lines)."""

    path: str
    format: Literal["parquet", "json"] | None = None
    mode: Literal["error", "overwrite", "append"] = "error"

    def resolved_format(self) -> Literal["parquet", "json"]:
        if self.format is not None:
            return self.format
        return "parquet" if Path(self.path).suffix == ".parquet" else "json"


Sink = KafkaSink | FileSink


@dataclass
class BackfillResult:
    """What a backfill did (counts may over-count if Spark retried tasks)."""

    join: str
    partitions: int
    records_read: int
    outputs: int
    late: int
    elapsed_s: float
    output: str


def _find_join(topology: Topology, name: str) -> StreamStreamJoinDecl:
    from streamjoin.joins.api import StreamStreamJoinDecl

    decl = topology.joins.get(name)
    if decl is None:
        known = ", ".join(sorted(topology.joins)) or "none"
        raise NotFoundError(
            f"app {topology.app_id!r} has no join named {name!r} (declared: {known})"
        )
    if not isinstance(decl, StreamStreamJoinDecl):
        raise UnsupportedJoin(
            f"join {name!r} is not a stream-stream join; backfill runs those only"
        )
    if decl.left.name == decl.right.name:
        raise UnsupportedJoin(f"join {name!r} joins {decl.left.name!r} with itself; not supported")
    return decl


def _join_partitions(
    config: AppConfig, decl: StreamStreamJoinDecl, source: Source, override: int | None
) -> int:
    from streamjoin.spark.kafka_io import partition_counts

    declared = {t.partitions for t in (decl.left, decl.right) if t.partitions is not None}
    if isinstance(source, KafkaSource):
        topics = [decl.left.name, decl.right.name]
        counts = partition_counts(source.bootstrap_servers, topics, config.client_kwargs())
        missing = [t for t in topics if t not in counts]
        if missing:
            raise UnknownTopicError(f"topics {missing} do not exist on {source.bootstrap_servers}")
        actual = {counts[t] for t in topics}
        if len(actual) != 1:
            raise CopartitioningError(
                f"join {decl.name!r}: input partition counts differ: {counts}"
            )
        count = actual.pop()
        if declared and declared != {count}:
            raise CopartitioningError(
                f"join {decl.name!r}: the app declares {sorted(declared)} partitions but the "
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
        f"join {decl.name!r}: the app does not declare its partition count; pass partitions= "
        "(--partitions): records are placed by murmur2(key) mod that count"
    )


def _rethrow_mismatch(exc: BaseException) -> None:
    text = str(exc)
    if _MISMATCH_TAG in text:
        start = text.index(_MISMATCH_TAG) + len(_MISMATCH_TAG) + 2
        raise CopartitioningError(text[start:].splitlines()[0]) from None


def backfill(
    app: App,
    join_name: str,
    *,
    source: Source,
    output: Sink,
    master: str = "local[*]",
    spark: Any = None,
    partitions: int | None = None,
    close_windows_at_end: bool = False,
    kafka_packages: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    progress: Callable[[Progress], None] | None = None,
    progress_interval: float = 2.0,
) -> BackfillResult:
    """Run ``app``'s stream-stream join ``join_name`` over ``source`` and write to ``output``.

    ``spark``: an existing SparkSession (else one is built for ``master``; the Kafka
    connector is added when the source is Kafka). ``partitions``: the join's partition
    count when files are read and the app does not declare it. ``close_windows_at_end``:
    also emit the unmatched events of left/outer joins whose window is still open when
    the input ends (the workers would emit them once later events close the window).
    """
    from pyspark.sql import functions as F

    from streamjoin.spark.kafka_io import ensure_topic, offset_bounds, partition_counts
    from streamjoin.spark.partitioning import with_kafka_partition
    from streamjoin.spark.session import get_session

    topology, config = app.topology(), app.config
    decl = _find_join(topology, join_name)
    count = _join_partitions(config, decl, source, partitions)
    if isinstance(source, KafkaSource) and source.ending_offsets == "latest":
        _, ends = offset_bounds(
            source.bootstrap_servers, [decl.left.name, decl.right.name], config.client_kwargs()
        )
        source = KafkaSource(
            source.bootstrap_servers,
            source.starting_offsets,
            ends,
            source.start_timestamp_ms,
            source.end_timestamp_ms,
            source.options,
        )
    if spark is None:
        spark = get_session(
            master,
            app_name=f"streamjoin backfill {config.id}:{join_name}",
            kafka=isinstance(source, KafkaSource),
            kafka_packages=kafka_packages,
            conf=spark_conf,
        )
    sc = spark.sparkContext

    # where outputs go, and how many partitions the output topic has
    sink_bootstrap: str | None = None
    if isinstance(output, KafkaSink):
        sink_bootstrap = output.bootstrap_servers or (
            source.bootstrap_servers if isinstance(source, KafkaSource) else config.broker
        )
        existing = partition_counts(sink_bootstrap, [output.topic], config.client_kwargs())
        if output.topic in existing:
            out_partitions = existing[output.topic]
        else:
            declared_out = decl.output.partitions if decl.output is not None else None
            out_partitions = declared_out if declared_out else count
            ensure_topic(sink_bootstrap, output.topic, out_partitions, config.client_kwargs())
    else:
        out_partitions = (
            decl.output.partitions if decl.output is not None and decl.output.partitions else count
        )
    runner = JoinRunner.for_join(config, decl, out_partitions, close_windows_at_end)
    counters = Counters(sc)
    verify = isinstance(source, KafkaSource)
    left_name = decl.left.name
    file_json = isinstance(output, FileSink) and output.resolved_format() == "json"
    sink_topic = output.topic if isinstance(output, KafkaSink) else None
    client_options = config.client_kwargs()
    out_label = decl.output.name if decl.output is not None else join_name

    df = load_records(spark, source, [decl.left.name, decl.right.name])
    keyed = df.where(F.col("key").isNotNull())
    keyed = with_kafka_partition(keyed, count).withColumn(
        "ordinal", F.coalesce(F.col("offset"), F.monotonically_increasing_id())
    )
    pairs = keyed.select(
        "kpart", "timestamp_ms", "topic", "partition", "ordinal", "key", "value"
    ).rdd.map(
        lambda r: (
            (r[0], r[1], 0 if r[2] == left_name else 1, -1 if r[3] is None else r[3], r[4]),
            (bytes(r[5]), b"" if r[6] is None else bytes(r[6])),
        )
    )
    ordered = pairs.repartitionAndSortWithinPartitions(count, partitionFunc=lambda k: k[0])

    def task(index: int, items: Iterator[Any]) -> Iterator[Any]:
        def records() -> Iterator[tuple[str, bytes, bytes, int]]:
            for (kpart, ts, side, src_partition, offset), (key, value) in items:
                if verify and src_partition != kpart:
                    raise CopartitioningError(
                        f"{_MISMATCH_TAG}: record at partition {src_partition} offset {offset} "
                        f"has key {key[:40]!r}, which murmur2 places in partition {kpart} of "
                        f"{count}: the input topics were not written with Kafka's keyed "
                        "partitioner, so joining them would miss matches"
                    )
                yield ("left" if side == 0 else "right", key, value, ts)

        producer = None
        if sink_bootstrap is not None:
            from streamjoin.spark.kafka_io import TaskProducer

            producer = TaskProducer(sink_bootstrap, client_options)
        try:
            for out in runner.run(records()):
                if producer is not None:
                    producer.send(
                        sink_topic,  # type: ignore[arg-type]
                        out.partition,
                        out.key,
                        out.value,
                        out.timestamp_ms,
                    )
                elif file_json:
                    yield (
                        out_label,
                        out.partition,
                        None if out.key is None else out.key.decode("utf-8", "replace"),
                        None if out.value is None else out.value.decode("utf-8", "replace"),
                        out.timestamp_ms,
                    )
                else:
                    yield (out_label, out.partition, out.key, out.value, out.timestamp_ms)
        finally:
            if producer is not None:
                producer.close()
        counters.records.add(runner.stats.get("records", 0))
        counters.outputs.add(runner.stats.get("outputs", 0))
        counters.late.add(runner.stats.get("late", 0))
        counters.partitions.add(1)

    results = ordered.mapPartitionsWithIndex(task)
    sc.setJobDescription(f"streamjoin backfill {config.id}:{join_name}")
    reporter = ProgressReporter(
        f"backfill {join_name}", counters, count, progress, progress_interval
    )
    try:
        with reporter:
            if isinstance(output, FileSink):
                _write_files(spark, results, output)
                target = output.path
            else:
                results.count()
                target = f"kafka topic {output.topic}"
    except Exception as exc:
        _rethrow_mismatch(exc)
        raise
    finally:
        sc.setJobDescription(None)
    snap = reporter.snapshot(finished=True)
    return BackfillResult(
        join_name,
        count,
        snap.records_read,
        snap.outputs,
        int(counters.late.value),
        snap.elapsed_s,
        target,
    )


def _write_files(spark: Any, rows: Any, sink: FileSink) -> None:
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    payload = StringType() if sink.resolved_format() == "json" else BinaryType()
    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("key", payload),
            StructField("value", payload),
            StructField("timestamp", LongType()),
        ]
    )
    writer = spark.createDataFrame(rows, schema).write.mode(sink.mode)
    if sink.resolved_format() == "json":
        writer.json(sink.path)
    else:
        writer.parquet(sink.path)
