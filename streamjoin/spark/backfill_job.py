"""Backfill: run an app's declared join over history on Spark.

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
from dataclasses import dataclass, replace
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
from streamjoin.spark.runners import (
    JoinRunner,
    OutputRecord,
    Record,
    Runner,
    StreamTableRunner,
    TableTableRunner,
)
from streamjoin.spark.sources import KafkaSource, Source, load_records

if TYPE_CHECKING:
    from streamjoin.app import App
    from streamjoin.config import AppConfig
    from streamjoin.joins.api import StreamStreamJoinDecl, StreamTableJoinDecl, TableTableJoinDecl
    from streamjoin.topics import Topic
    from streamjoin.topology import Topology

    JoinDecl = StreamStreamJoinDecl | StreamTableJoinDecl | TableTableJoinDecl

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


@dataclass(frozen=True)
class JoinInputs:
    """A declared join as the Spark side reads it: the topics of its runner's two sides, and
    which sides are table state (read from the beginning whatever the start time, so each
    row is known before the records that need it)."""

    decl: JoinDecl
    left: Topic
    right: Topic
    state_sides: frozenset[str]

    @property
    def kind(self) -> str:
        from streamjoin.joins.api import StreamStreamJoinDecl, StreamTableJoinDecl

        if isinstance(self.decl, StreamStreamJoinDecl):
            return "stream-stream"
        return "stream-table" if isinstance(self.decl, StreamTableJoinDecl) else "table-table"

    @property
    def topics(self) -> list[str]:
        return [self.left.name, self.right.name]


def _find_join(topology: Topology, name: str) -> JoinInputs:
    from streamjoin.joins.api import StreamStreamJoinDecl, StreamTableJoinDecl, TableTableJoinDecl

    decl = topology.joins.get(name)
    if decl is None:
        known = ", ".join(sorted(topology.joins)) or "none"
        raise NotFoundError(
            f"app {topology.app_id!r} has no join named {name!r} (declared: {known})"
        )
    if isinstance(decl, StreamStreamJoinDecl):
        found = JoinInputs(decl, decl.left, decl.right, frozenset())
    elif isinstance(decl, StreamTableJoinDecl):
        if decl.table_source is None:
            raise UnsupportedJoin(
                f"join {name!r}: its table {decl.table.name!r} is written by agents, so the "
                "table's history is not in a topic; a backfill joins streams with topic tables "
                "(declared with app.topic_table(topic))"
            )
        found = JoinInputs(decl, decl.stream, decl.table_source, frozenset({"right"}))
    elif isinstance(decl, TableTableJoinDecl):
        found = JoinInputs(decl, decl.left_source, decl.right_source, frozenset({"left", "right"}))
    else:
        raise UnsupportedJoin(f"join {name!r} is a {type(decl).__name__}; it cannot be backfilled")
    if found.left.name == found.right.name:
        raise UnsupportedJoin(f"join {name!r} joins {found.left.name!r} with itself; not supported")
    return found


def _runner_for(
    config: AppConfig,
    inputs: JoinInputs,
    out_partitions: int,
    *,
    close_windows_at_end: bool,
    final_only: bool,
    emit_from_ms: int | None,
) -> Runner:
    """The runner of ``inputs``' join kind, refusing options that kind has no use for."""
    from streamjoin.joins.api import StreamStreamJoinDecl, StreamTableJoinDecl

    decl, name = inputs.decl, inputs.decl.name
    if close_windows_at_end and not isinstance(decl, StreamStreamJoinDecl):
        raise ConfigurationError(
            f"join {name!r} is a {inputs.kind} join: close_windows_at_end (--close-windows) "
            "applies to windowed stream-stream joins only"
        )
    if final_only and (isinstance(decl, StreamStreamJoinDecl | StreamTableJoinDecl)):
        raise ConfigurationError(
            f"join {name!r} is a {inputs.kind} join: final_only (--final-only) applies to "
            "table-table joins only"
        )
    if isinstance(decl, StreamStreamJoinDecl):
        return JoinRunner.for_join(config, decl, out_partitions, close_windows_at_end)
    if isinstance(decl, StreamTableJoinDecl):
        return StreamTableRunner.for_join(config, decl, out_partitions, emit_from_ms)
    return TableTableRunner.for_join(config, decl, out_partitions, final_only, emit_from_ms)


def _join_partitions(
    config: AppConfig, inputs: JoinInputs, source: Source, override: int | None
) -> int:
    from streamjoin.spark.kafka_io import partition_counts

    name = inputs.decl.name
    declared = {t.partitions for t in (inputs.left, inputs.right) if t.partitions is not None}
    if isinstance(source, KafkaSource):
        topics = inputs.topics
        counts = partition_counts(source.bootstrap_servers, topics, config.client_kwargs())
        missing = [t for t in topics if t not in counts]
        if missing:
            raise UnknownTopicError(f"topics {missing} do not exist on {source.bootstrap_servers}")
        actual = {counts[t] for t in topics}
        if len(actual) != 1:
            raise CopartitioningError(f"join {name!r}: input partition counts differ: {counts}")
        count = actual.pop()
        if declared and declared != {count}:
            raise CopartitioningError(
                f"join {name!r}: the app declares {sorted(declared)} partitions but the "
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
        f"join {name!r}: the app does not declare its partition count; pass partitions= "
        "(--partitions): records are placed by murmur2(key) mod that count"
    )


def _load_inputs(spark: Any, source: Source, inputs: JoinInputs) -> Any:
    """Both sides' records; table sides ignore the source's start time (their earlier rows
    are the state the first joined records see)."""
    stream_topics = [
        t.name
        for side, t in (("left", inputs.left), ("right", inputs.right))
        if side not in inputs.state_sides
    ]
    state_topics = [t for t in inputs.topics if t not in stream_topics]
    frames = []
    if stream_topics:
        frames.append(load_records(spark, source, stream_topics))
    if state_topics:
        frames.append(load_records(spark, replace(source, start_timestamp_ms=None), state_topics))
    df = frames[0]
    for more in frames[1:]:
        df = df.unionByName(more)
    return df


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
    final_only: bool = False,
    kafka_packages: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    progress: Callable[[Progress], None] | None = None,
    progress_interval: float = 2.0,
) -> BackfillResult:
    """Run ``app``'s join ``join_name`` (any kind) over ``source`` and write to ``output``.

    ``spark``: an existing SparkSession (else one is built for ``master``; the Kafka
    connector is added when the source is Kafka). ``partitions``: the join's partition
    count when files are read and the app does not declare it. ``close_windows_at_end``
    (stream-stream): also emit the unmatched events of left/outer joins whose window is
    still open when the input ends (the workers would emit them once later events close the
    window). ``final_only`` (table-table): only the last change of each key. A source's
    start time selects the records joined (stream-table) or the changes emitted
    (table-table); table sides are still read from their beginning.
    """
    from pyspark.sql import functions as F

    from streamjoin.spark.kafka_io import ensure_topic, offset_bounds, partition_counts
    from streamjoin.spark.partitioning import with_kafka_partition
    from streamjoin.spark.session import get_session

    topology, config = app.topology(), app.config
    inputs = _find_join(topology, join_name)
    decl = inputs.decl

    def make_runner(out_partitions: int) -> Runner:
        return _runner_for(
            config,
            inputs,
            out_partitions,
            close_windows_at_end=close_windows_at_end,
            final_only=final_only,
            emit_from_ms=source.start_timestamp_ms,
        )

    make_runner(1)  # refuses options of another join kind before any work
    count = _join_partitions(config, inputs, source, partitions)
    if isinstance(source, KafkaSource) and source.ending_offsets == "latest":
        _, ends = offset_bounds(source.bootstrap_servers, inputs.topics, config.client_kwargs())
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
    runner = make_runner(out_partitions)
    counters = Counters(sc)
    verify = isinstance(source, KafkaSource)
    left_name = inputs.left.name
    left_rank, right_rank = runner.side_rank["left"], runner.side_rank["right"]
    side_of_rank = {rank: side for side, rank in runner.side_rank.items()}
    file_json = isinstance(output, FileSink) and output.resolved_format() == "json"
    sink_topic = output.topic if isinstance(output, KafkaSink) else None
    client_options = config.client_kwargs()
    out_label = decl.output.name if decl.output is not None else join_name

    df = _load_inputs(spark, source, inputs)
    keyed = df.where(F.col("key").isNotNull())
    keyed = with_kafka_partition(keyed, count).withColumn(
        "ordinal", F.coalesce(F.col("offset"), F.monotonically_increasing_id())
    )
    pairs = keyed.select(
        "kpart", "timestamp_ms", "topic", "partition", "ordinal", "key", "value"
    ).rdd.map(
        lambda r: (
            (
                r[0],
                r[1],
                left_rank if r[2] == left_name else right_rank,
                -1 if r[3] is None else r[3],
                r[4],
            ),
            (bytes(r[5]), None if r[6] is None else bytes(r[6])),
        )
    )
    ordered = pairs.repartitionAndSortWithinPartitions(count, partitionFunc=lambda k: k[0])

    def task(index: int, items: Iterator[Any]) -> Iterator[Any]:
        def records() -> Iterator[Record]:
            for (kpart, ts, side, src_partition, offset), (key, value) in items:
                if verify and src_partition != kpart:
                    raise CopartitioningError(
                        f"{_MISMATCH_TAG}: record at partition {src_partition} offset {offset} "
                        f"has key {key[:40]!r}, which murmur2 places in partition {kpart} of "
                        f"{count}: the input topics were not written with Kafka's keyed "
                        "partitioner, so joining them would miss matches"
                    )
                yield (side_of_rank[side], key, value, ts)

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
