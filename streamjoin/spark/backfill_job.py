"""Backfill: run an app's declared join over history on Spark.

Records are placed in the join partition a worker would have read them from
(murmur2 of the serialized key, mod the join's partition count), sorted per
partition by ``(timestamp, side, source partition, offset)`` with left before
right on ties, and fed through the same :class:`~streamjoin.joins.core.StreamStreamJoin`
the workers run, over a :class:`~streamjoin.joins.state.MemoryKeyValueView`.
Because input is in event-time order nothing is late, so the result equals the
workers' whenever their input's lateness stayed within the grace period.

The shuffle and the sort are Spark's own (DataFrame ``repartitionById`` and
``sortWithinPartitions``, on the JVM, spilling to disk); Python tasks only
stream the sorted rows through the join. A join only matches equal keys, so a
join partition can be split further by a second hash of the key (``parallelism``):
each part is a set of whole keys, and sees its keys' records in the same order.
Only stream time differs (a part sees some of the partition's timestamps), so at
its end each part advances to its whole partition's largest timestamp, computed
up front: it then has closed exactly the windows the whole partition closed.

The join function is called like the worker calls it (decoded key and values,
awaited if async); its non-None results are encoded with the output topic's
codecs and written to Kafka (explicit partitions, the join's timestamps) or to
files.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from streamjoin.errors import (
    ArgumentTypeError,
    ConfigurationError,
    CopartitioningError,
    NotFoundError,
    SparkJobError,
)
from streamjoin.partitioner import partition_for_key
from streamjoin.spark.outputs import MISMATCH_TAG as _MISMATCH_TAG
from streamjoin.spark.outputs import (
    BackfillResult,
    FileSink,
    KafkaSink,
    ResultWriter,
    Sink,
    output_partitions,
    run_job,
    write_results,
)
from streamjoin.spark.progress import Counters, Progress
from streamjoin.spark.runners import (
    JoinRunner,
    OutputRecord,
    Record,
    Runner,
    StreamTableRunner,
    TableTableRunner,
)
from streamjoin.spark.session import SparkRun
from streamjoin.spark.sources import (
    KafkaSource,
    Source,
    input_partitions,
    load_records,
    pin_ending_offsets,
)

if TYPE_CHECKING:
    from streamjoin.app import App
    from streamjoin.config import AppConfig
    from streamjoin.joins.api import StreamStreamJoinDecl, StreamTableJoinDecl, TableTableJoinDecl
    from streamjoin.topics import Topic
    from streamjoin.topology import Topology

    JoinDecl = StreamStreamJoinDecl | StreamTableJoinDecl | TableTableJoinDecl

__all__ = [
    "BackfillResult",
    "FileSink",
    "JoinRunner",
    "KafkaSink",
    "OutputRecord",
    "Sink",
    "backfill",
    "split_count",
]


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
            raise SparkJobError(
                f"join {name!r}: its table {decl.table.name!r} is written by agents, so the "
                "table's history is not in a topic; a backfill joins streams with topic tables "
                "(declared with app.topic_table(topic))"
            )
        found = JoinInputs(decl, decl.stream, decl.table_source, frozenset({"right"}))
    elif isinstance(decl, TableTableJoinDecl):
        found = JoinInputs(decl, decl.left_source, decl.right_source, frozenset({"left", "right"}))
    else:
        raise SparkJobError(f"join {name!r} is a {type(decl).__name__}; it cannot be backfilled")
    if found.left.name == found.right.name:
        raise SparkJobError(f"join {name!r} joins {found.left.name!r} with itself; not supported")
    from streamjoin.ttl_tables import refuse_in_spark

    refuse_in_spark(f"join {name!r}", *(getattr(decl, s, None) for s in ("table", "left", "right")))
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


def split_count(partitions: int, parallelism: int) -> int:
    """Parts per join partition so that ``partitions x parts >= parallelism`` (at least 1)."""
    for name, value in (("partitions", partitions), ("parallelism", parallelism)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(f"{name} must be an int, got {value!r}")
        if value < 1:
            raise ConfigurationError(f"{name} must be >= 1, got {value}")
    return max(1, math.ceil(parallelism / partitions))


#: ``(join partition, timestamp_ms, side rank, source partition, ordinal, key, value)``, the
#: rows a backfill task receives, sorted by their first five fields
SortedRow = tuple[int, int, int, int, int, Any, Any]


def join_sorted_rows(
    runner: Runner,
    rows: Iterable[SortedRow],
    *,
    partitions: int,
    verify: bool,
    ends: Mapping[int, int] | None = None,
    stats: dict[str, int] | None = None,
) -> Iterator[OutputRecord]:
    """Run ``runner`` once per join partition present in ``rows`` (pure: no Spark).

    ``verify`` (Kafka input): each key's murmur2 partition must be the partition it was
    read from, else :class:`CopartitioningError`. ``ends``: per join partition, the stream time to
    advance to at the end (its largest timestamp, when only part of it is here).
    ``stats`` receives the runs' record, output and late counts, summed.
    """
    totals = stats if stats is not None else {}
    for kpart, group in itertools.groupby(rows, key=_join_partition):
        end = None if ends is None else ends.get(kpart)
        try:
            records = _records(group, kpart, partitions, verify, runner.side_rank)
            yield from runner.run(records, stream_time_at_end_ms=end)
        finally:
            for name, value in runner.stats.items():
                totals[name] = totals.get(name, 0) + value


def _records(
    rows: Iterable[SortedRow],
    kpart: int,
    partitions: int,
    verify: bool,
    side_rank: Mapping[str, int],
) -> Iterator[Record]:
    """One join partition's rows as the runner's ``(side, key, value, timestamp_ms)``.

    ``verify`` (Kafka input, grouped by source partition): each key's murmur2 partition
    must be the partition it was read from."""
    sides = {rank: side for side, rank in side_rank.items()}
    for _, ts, rank, src_partition, ordinal, raw_key, value in rows:
        key = bytes(raw_key)
        if verify:
            placed = partition_for_key(key, partitions)
            if placed != src_partition or placed != kpart:
                raise CopartitioningError(
                    f"{_MISMATCH_TAG}: record at partition {src_partition} offset {ordinal} "
                    f"has key {key[:40]!r}, which murmur2 places in partition "
                    f"{placed} of {partitions}: the input topics were not written with "
                    "Kafka's keyed partitioner, so joining them would miss matches"
                )
        yield sides[rank], key, None if value is None else bytes(value), ts


def _join_partition(row: SortedRow) -> int:
    return row[0]


def _sorted_rows(
    keyed: Any,
    partitions: int,
    parts: int,
    left_topic: str,
    side_rank: Mapping[str, int],
    *,
    by_source: bool,
) -> Any:
    """``keyed`` records as :data:`SortedRow` columns, shuffled to ``partitions x parts`` Spark
    partitions (join partition, then a second hash of the key) and sorted within each, all
    on the JVM.

    ``by_source``: Kafka input, grouped by the partition each record was read from, which
    the task checks against murmur2 (so the keys are not sent through Python twice);
    otherwise the join partition is computed by the murmur2 UDF."""
    from pyspark.sql import functions as F

    from streamjoin.spark.partitioning import with_kafka_partition

    if by_source:
        placed = keyed.withColumn("kpart", F.col("partition"))
    else:
        placed = with_kafka_partition(keyed, partitions)
    rows = placed.select(
        "kpart",
        "timestamp_ms",
        F.when(F.col("topic") == F.lit(left_topic), F.lit(side_rank["left"]))
        .otherwise(F.lit(side_rank["right"]))
        .alias("side"),
        F.coalesce(F.col("partition"), F.lit(-1)).alias("source_partition"),
        F.coalesce(F.col("offset"), F.monotonically_increasing_id()).alias("ordinal"),
        "key",
        "value",
    )
    # xxhash64 is independent of Kafka's murmur2, so the parts of a partition are even
    task = F.col("kpart") * F.lit(parts) + F.pmod(F.xxhash64(F.col("key")), F.lit(parts))
    tasks = partitions * parts
    if hasattr(rows, "repartitionById"):  # Spark 4.1+: the task id is the Spark partition
        shuffled = rows.repartitionById(tasks, task.cast("int"))
    else:  # Spark 4.0: hashed, so some tasks may share a Spark partition (still correct)
        shuffled = rows.repartition(tasks, task)
    ordered = shuffled.sortWithinPartitions(
        "kpart", "timestamp_ms", "side", "source_partition", "ordinal"
    )

    # one binary column per row (see unpack_rows): a Row of seven fields costs Python
    # several times more to unpickle than one of a single bytes value
    def int64(column: Any) -> Any:
        return F.unhex(F.lpad(F.hex(column.cast("long")), 16, "0"))

    header = [
        int64(F.col(name))
        for name in ("kpart", "timestamp_ms", "side", "source_partition", "ordinal")
    ]
    key_length = int64(F.octet_length("key"))
    # -1: a null value (a table side's tombstone), which must not become empty bytes
    null_value = int64(F.when(F.col("value").isNull(), F.lit(-1)).otherwise(F.lit(0)))
    value = F.coalesce(F.col("value"), F.lit(b""))
    return ordered.select(
        F.concat(*header, key_length, null_value, F.col("key"), value).alias("row")
    )


_PACKED_HEADER = struct.Struct(">qqqqqqq")


def unpack_rows(items: Iterable[Any]) -> Iterator[SortedRow]:
    """The task's packed rows as :data:`SortedRow`: seven big-endian int64 (join partition,
    timestamp, side rank, source partition, ordinal, key length, -1 for a null value else
    0), the key, the value."""
    unpack = _PACKED_HEADER.unpack_from
    size = _PACKED_HEADER.size
    for (packed,) in items:
        kpart, ts, side, src_partition, ordinal, key_length, null = unpack(packed)
        end = size + key_length
        value = None if null < 0 else packed[end:]
        yield kpart, ts, side, src_partition, ordinal, packed[size:end], value


def _partition_stream_ends(keyed: Any, partitions: int, *, by_source: bool) -> dict[int, int]:
    """The largest timestamp of each join partition: one aggregate, before the join runs.

    ``by_source``: Kafka input, whose source partition must equal the join partition (the
    join checks it), so no key is hashed here."""
    from pyspark.sql import functions as F

    from streamjoin.spark.partitioning import with_kafka_partition

    if by_source:
        column, frame = "partition", keyed
    else:
        column, frame = "kpart", with_kafka_partition(keyed, partitions)
    rows = frame.groupBy(column).agg(F.max("timestamp_ms").alias("end")).collect()
    return {int(r[0]): int(r[1]) for r in rows if r[0] is not None}


def backfill(
    app: App,
    join_name: str,
    *,
    source: Source,
    output: Sink,
    master: str = "local[*]",
    spark: Any = None,
    partitions: int | None = None,
    parallelism: int | None = None,
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
    count when files are read and the app does not declare it. ``parallelism``: Spark
    tasks to run the join in (default: the cluster's default parallelism); above the
    partition count, each join partition is split by a second hash of the key into
    ``ceil(parallelism / partitions)`` parts. ``close_windows_at_end`` (stream-stream):
    also emit the unmatched events of left/outer joins whose window is still open when the
    input ends (the workers would emit them once later events close the window).
    ``final_only`` (table-table): only the last change of each key (foreign-key joins:
    required, :mod:`streamjoin.spark.foreign_key_job`). A source's start time
    selects the records joined (stream-table) or the changes emitted (table-table); table
    sides are still read from their beginning.

    ``join_name`` may also name an aggregation (``app.aggregate``): its results, as the
    workers send them (:mod:`streamjoin.spark.aggregation_jobs`; ``final_only``: with
    ``emit="update"``, the last result of each window; ``close_windows_at_end``: with
    ``emit="close"``, also the windows still open at the end).
    """
    from pyspark.sql import functions as F

    topology, config = app.topology(), app.config
    run = SparkRun(master, spark, kafka_packages, spark_conf, progress, progress_interval)
    aggregation = app.aggregations.get(join_name)
    if aggregation is not None:
        from streamjoin.spark.aggregation_jobs import backfill_aggregation

        return backfill_aggregation(
            app,
            aggregation,
            run,
            source=source,
            output=output,
            partitions=partitions,
            parallelism=parallelism,
            close_windows_at_end=close_windows_at_end,
            final_only=final_only,
        )
    if join_name not in topology.joins and app.aggregations:
        raise NotFoundError(
            f"app {topology.app_id!r} has no join or aggregation named {join_name!r} (joins: "
            f"{', '.join(sorted(topology.joins)) or 'none'}; aggregations: "
            f"{', '.join(sorted(app.aggregations))})"
        )
    from streamjoin.joins.foreign_key_api import ForeignKeyJoinDecl

    foreign_key_join = topology.joins.get(join_name)
    if isinstance(foreign_key_join, ForeignKeyJoinDecl):
        from streamjoin.spark.foreign_key_job import backfill_foreign_key, refuse_history

        refuse_history(foreign_key_join, final_only, close_windows_at_end)
        return backfill_foreign_key(
            app,
            foreign_key_join,
            run,
            source=source,
            output=output,
            partitions=partitions,
            parallelism=parallelism,
        )
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
    count = input_partitions(
        config, source, [inputs.left, inputs.right], partitions, f"join {join_name!r}"
    )
    source, _ = pin_ending_offsets(source, inputs.topics, config.client_kwargs())
    spark = run.session(
        f"streamjoin backfill {config.id}:{join_name}", kafka=isinstance(source, KafkaSource)
    )
    sc = spark.sparkContext
    declared = decl.output.partitions if decl.output is not None else None
    sink_broker, out_partitions = output_partitions(config, output, source, declared, count)
    runner = make_runner(out_partitions)
    counters = Counters(sc)
    verify = isinstance(source, KafkaSource)
    writer = ResultWriter(
        decl.output.name if decl.output is not None else join_name,
        output,
        sink_broker,
        config.client_kwargs(),
    )
    parts = split_count(count, sc.defaultParallelism if parallelism is None else parallelism)
    tasks = count * parts

    df = _load_inputs(spark, source, inputs)
    keyed = df.where(F.col("key").isNotNull())
    ends_by_partition: dict[int, int] | None = None
    if (
        parts > 1
        and isinstance(runner, JoinRunner)
        and runner.spec.how != "inner"
        and not close_windows_at_end
    ):
        ends_by_partition = _partition_stream_ends(keyed, count, by_source=verify)
    rows = _sorted_rows(keyed, count, parts, inputs.left.name, runner.side_rank, by_source=verify)
    ends = sc.broadcast(ends_by_partition)

    def task(index: int, items: Iterator[Any]) -> Iterator[Any]:
        stats: dict[str, int] = {}
        yield from writer.write(
            join_sorted_rows(
                runner,
                unpack_rows(items),
                partitions=count,
                verify=verify,
                ends=ends.value,
                stats=stats,
            )
        )
        counters.records.add(stats.get("records", 0))
        counters.outputs.add(stats.get("outputs", 0))
        counters.late.add(stats.get("late", 0))
        counters.partitions.add(1)

    results = rows.rdd.mapPartitionsWithIndex(task)
    reporter = run.reporter(f"backfill {join_name}", counters, tasks)
    try:
        target = run_job(
            spark,
            f"streamjoin backfill {config.id}:{join_name}",
            reporter,
            lambda: write_results(spark, results, output),
        )
    finally:
        ends.destroy()
    snap = reporter.snapshot(finished=True)
    return BackfillResult(
        join_name,
        count,
        snap.records_read,
        snap.outputs,
        int(counters.late.value),
        snap.elapsed_s,
        target,
        tasks,
    )
