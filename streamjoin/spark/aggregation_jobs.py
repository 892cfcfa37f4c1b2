"""Backfill and bootstrap of a declared aggregation (``app.aggregate``) on Spark.

Both read the aggregation's input topic (or files), place each record in the partition a
worker holds its key in, order each partition as the worker takes it, and run
:class:`~streamjoin.spark.aggregation_runner.AggregationRunner` (the workers' window code)
once per partition, in one Spark task each:

* **Order.** Without ``key=``, a worker's task reads the input partition in offset order
  and the partition's stream time is the largest timestamp read so far: the job uses the
  same order (Kafka: the offsets; files: ``partition`` then ``offset``, else file order),
  so late records are the same and dropped the same way. With ``key=``, the worker reads
  the repartition topic, whose order interleaves the upstream partitions as they happened
  to be written: the job re-keys each record as the repartition agent does and orders each
  new partition by ``(timestamp, source partition, offset)``, so no record is late.
* **Backfill** writes the results a worker sends (``emit="update"``: every changed window,
  or ``final_only`` the last result of each; ``emit="close"``: each final result) to a
  topic or files.
* **Bootstrap** writes the windowed table's state, as the workers' store holds it after
  the same records, to the table's changelog (and with ``mode="rocksdb"`` to the stores).

The shuffle and sort are Spark's (on the JVM, spilling to disk); each task holds one
partition's open windows in memory, as a worker does.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamjoin.errors import (
    ConfigurationError,
    CopartitioningError,
    SparkJobError,
)
from streamjoin.partitioner import partition_for_key
from streamjoin.spark.aggregation_runner import (
    AggregateRecord,
    AggregationRunner,
    Rekey,
)
from streamjoin.spark.bootstrap_writes import (
    check_no_stores,
    commit_source_ends,
    create_empty_changelogs,
    ingest_staged,
    write_partition_state,
)
from streamjoin.spark.outputs import (
    MISMATCH_TAG,
    BackfillResult,
    BootstrapResult,
    ResultWriter,
    Sink,
    output_partitions,
    run_job,
    write_results,
)
from streamjoin.spark.progress import Counters
from streamjoin.spark.session import SparkRun
from streamjoin.spark.sources import (
    KafkaSource,
    Source,
    input_partitions,
    load_records,
    pin_ending_offsets,
)
from streamjoin.state.windows import SlidingWindows

if TYPE_CHECKING:
    from streamjoin.app import App
    from streamjoin.config import AppConfig
    from streamjoin.tables import Table
    from streamjoin.topics import Topic
    from streamjoin.windowed_aggregation import WindowedAggregation

__all__ = ["aggregation_partitions", "backfill_aggregation", "bootstrap_aggregation"]


def _input_topic(decl: WindowedAggregation) -> Topic:
    """The topic the job reads: the one before re-keying, else the aggregated one."""
    return decl.original if decl.original is not None else decl.source


def aggregation_partitions(
    config: AppConfig, decl: WindowedAggregation, source: Source, override: int | None
) -> int:
    """The aggregation's partition count (its table's): the input topic's without ``key=``
    (:func:`~streamjoin.spark.sources.input_partitions`); with ``key=``, the
    repartition topic's (``override``, else the topic if it exists, else declared, else
    the app's ``topic_partitions``, as a worker creates it)."""
    from streamjoin.spark.kafka_io import partition_counts

    name, topic = decl.name, _input_topic(decl)
    kafka = source if isinstance(source, KafkaSource) else None
    options = config.client_kwargs()
    if decl.key is not None:
        if override is not None:
            return override
        if kafka is not None:
            existing = partition_counts(kafka.bootstrap_servers, [decl.source.name], options)
            if decl.source.name in existing:
                return existing[decl.source.name]
        return decl.source.partitions or config.topic_partitions
    return input_partitions(config, source, [topic], override, f"aggregation {name!r}")


def _ordered_rows(spark: Any, source: Source, decl: WindowedAggregation, count: int) -> Any:
    """The input's records as packed rows (see :func:`_unpack`), shuffled to ``count`` Spark
    partitions by the aggregation's partition and ordered within each as a worker takes
    them (the module docstring), all on the JVM but the re-keying."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

    from streamjoin.spark.partitioning import with_kafka_partition

    topic = _input_topic(decl)
    df = load_records(spark, source, [topic.name])
    df = df.withColumn("source_partition", F.coalesce(F.col("partition"), F.lit(-1))).withColumn(
        "ordinal", F.coalesce(F.col("offset"), F.monotonically_increasing_id())
    )
    if decl.key is None:
        keyed = df.where(F.col("key").isNotNull())
        if isinstance(source, KafkaSource):
            placed = keyed.withColumn("kpart", F.col("partition"))  # (checked in the task)
        else:
            placed = with_kafka_partition(keyed, count)
        order = ["kpart", "source_partition", "ordinal"]
    else:
        rekey = Rekey(
            decl.key,
            topic.name,
            topic.key_codec,
            topic.value_codec,
            decl.source.key_codec,
            decl.source.value_codec,
        )
        nparts = count

        def rekeyed(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
            for key, value, ts, src, ordinal in rows:
                new_key, new_value = rekey(
                    None if key is None else bytes(key),
                    None if value is None else bytes(value),
                    src,
                    ordinal,
                    ts,
                )
                if new_key is not None:
                    kpart = partition_for_key(new_key, nparts)
                    yield kpart, ts, src, ordinal, new_key, new_value

        schema = StructType(
            [
                StructField("kpart", IntegerType()),
                StructField("timestamp_ms", LongType()),
                StructField("source_partition", IntegerType()),
                StructField("ordinal", LongType()),
                StructField("key", BinaryType()),
                StructField("value", BinaryType()),
            ]
        )
        columns = df.select("key", "value", "timestamp_ms", "source_partition", "ordinal")
        placed = spark.createDataFrame(columns.rdd.mapPartitions(rekeyed), schema)
        order = ["kpart", "timestamp_ms", "source_partition", "ordinal"]
    rows = placed.select("kpart", "timestamp_ms", "source_partition", "ordinal", "key", "value")
    if hasattr(rows, "repartitionById"):  # Spark 4.1+: the partition is the Spark partition
        shuffled = rows.repartitionById(count, F.col("kpart").cast("int"))
    else:
        shuffled = rows.repartition(count, F.col("kpart"))
    ordered = shuffled.sortWithinPartitions(*order)

    def int64(column: Any) -> Any:
        return F.unhex(F.lpad(F.hex(column.cast("long")), 16, "0"))

    header = [int64(F.col(c)) for c in ("kpart", "timestamp_ms", "source_partition", "ordinal")]
    null_value = int64(F.when(F.col("value").isNull(), F.lit(-1)).otherwise(F.lit(0)))
    value = F.coalesce(F.col("value"), F.lit(b""))
    return ordered.select(
        F.concat(*header, int64(F.octet_length("key")), null_value, F.col("key"), value).alias(
            "row"
        )
    )


_HEADER = struct.Struct(">qqqqqq")

#: ``(aggregation partition, timestamp_ms, source partition, ordinal, key, value)``
Row = tuple[int, int, int, int, bytes, bytes | None]


def _unpack(items: Iterable[Any]) -> Iterator[Row]:
    """Packed rows: six big-endian int64 (partition, timestamp, source partition, ordinal,
    key length, -1 for a null value else 0), the key, the value."""
    unpack, size = _HEADER.unpack_from, _HEADER.size
    for (packed,) in items:
        kpart, ts, src, ordinal, key_length, null = unpack(packed)
        end = size + key_length
        yield (
            kpart,
            ts,
            src,
            ordinal,
            bytes(packed[size:end]),
            None if null < 0 else bytes(packed[end:]),
        )


def run_partitions(
    runner: AggregationRunner,
    rows: Iterable[Row],
    *,
    partitions: int,
    verify: bool,
    sequence: bool,
    after: Callable[[int], Iterator[Any]] | None = None,
) -> Iterator[Any]:
    """Run ``runner`` once per aggregation partition in ``rows`` (pure: no Spark).

    ``verify`` (Kafka input read as is): each key's murmur2 partition must be the partition
    it was read from, else :class:`CopartitioningError`. ``sequence``: give the runner each
    record's position in its partition as its offset (re-keyed records, whose upstream
    offsets collide). ``after(partition)`` runs after each partition (state mode)."""
    for kpart, group in itertools.groupby(rows, key=lambda r: r[0]):
        records = _records(group, kpart, partitions, verify, sequence)
        yield from runner.run(kpart, records)
        if after is not None:
            yield from after(kpart)


def _records(
    rows: Iterable[Row], kpart: int, partitions: int, verify: bool, sequence: bool
) -> Iterator[AggregateRecord]:
    for position, (_, ts, src, ordinal, key, value) in enumerate(rows):
        if verify:
            placed = partition_for_key(key, partitions)
            if placed != src or placed != kpart:
                raise CopartitioningError(
                    f"{MISMATCH_TAG}: record at partition {src} offset {ordinal} has key "
                    f"{key[:40]!r}, which murmur2 places in partition {placed} of "
                    f"{partitions}: the topic was not written with Kafka's keyed "
                    "partitioner, so a worker would hold its key elsewhere"
                )
        yield key, value, ts, position if sequence else ordinal


def backfill_aggregation(
    app: App,
    decl: WindowedAggregation,
    run: SparkRun,
    *,
    source: Source,
    output: Sink,
    partitions: int | None = None,
    parallelism: int | None = None,
    close_windows_at_end: bool = False,
    final_only: bool = False,
) -> BackfillResult:
    """:func:`~streamjoin.spark.backfill_job.backfill` of an aggregation (module docstring)."""
    config, name = app.config, decl.name
    if parallelism is not None:
        raise ConfigurationError(
            f"aggregation {name!r}: parallelism (--parallelism) is for joins; an aggregation "
            "runs one task per partition (its stream time is the whole partition's)"
        )
    AggregationRunner.for_aggregation(
        config, decl, 1, final_only=final_only, close_windows_at_end=close_windows_at_end
    )  # refuses options of the other emission before any work
    count = aggregation_partitions(config, decl, source, partitions)
    source, _ = pin_ending_offsets(source, [_input_topic(decl).name], config.client_kwargs())
    spark = run.session(
        f"streamjoin backfill {config.id}:{name}", kafka=isinstance(source, KafkaSource)
    )
    declared = decl.emit_to if decl.emit == "update" else decl.table.final_to or decl.table.emit_to
    sink_broker, out_partitions = output_partitions(
        config, output, source, declared.partitions if declared is not None else None, count
    )
    runner = AggregationRunner.for_aggregation(
        config,
        decl,
        out_partitions,
        final_only=final_only,
        close_windows_at_end=close_windows_at_end,
    )
    counters = Counters(spark.sparkContext)
    verify = isinstance(source, KafkaSource) and decl.key is None
    sequence = decl.key is not None
    writer = ResultWriter(runner.out_topic, output, sink_broker, config.client_kwargs())
    rows = _ordered_rows(spark, source, decl, count)

    def task(index: int, items: Iterator[Any]) -> Iterator[Any]:
        totals = {"records": 0, "outputs": 0, "late": 0}

        def after(_: int) -> Iterator[Any]:
            for stat in totals:
                totals[stat] += runner.stats.get(stat, 0)
            counters.partitions.add(1)
            return iter(())

        yield from writer.write(
            run_partitions(
                runner,
                _unpack(items),
                partitions=count,
                verify=verify,
                sequence=sequence,
                after=after,
            )
        )
        counters.records.add(totals["records"])
        counters.outputs.add(totals["outputs"])
        counters.late.add(totals["late"])

    results = rows.rdd.mapPartitionsWithIndex(task)
    reporter = run.reporter(f"backfill {name}", counters, count)
    target = run_job(
        spark,
        f"streamjoin backfill {config.id}:{name}",
        reporter,
        lambda: write_results(spark, results, output),
    )
    snap = reporter.snapshot(finished=True)
    return BackfillResult(
        name,
        count,
        snap.records_read,
        snap.outputs,
        int(counters.late.value),
        snap.elapsed_s,
        target,
        count,
    )


def bootstrap_aggregation(
    app: App,
    decl: WindowedAggregation,
    run: SparkRun,
    *,
    source: Source,
    mode: str = "changelog",
    state_dir: str | Path | None = None,
    changelog_bootstrap: str | None = None,
    partitions: int | None = None,
    commit_source_offsets: bool = True,
) -> BootstrapResult:
    """:func:`~streamjoin.spark.bootstrap_job.bootstrap` of an aggregation's windowed table:
    each partition's state after the history, in the workers' layout, to the table's
    changelog (and with ``mode="rocksdb"`` the stores); sliding windows also write their
    records table (``<name>-records``)."""
    from streamjoin.spark.kafka_io import partition_counts

    if mode not in ("changelog", "rocksdb"):
        raise ConfigurationError(f"mode must be 'changelog' or 'rocksdb', got {mode!r}")
    config, name = app.config, decl.name
    options = config.client_kwargs()
    topic = _input_topic(decl)
    sliding = isinstance(decl.window, SlidingWindows)
    if decl.key is not None and sliding:
        raise SparkJobError(
            f"aggregation {name!r} re-keys its input (key=) and has sliding windows: their "
            f"records table ({name}-records) keys each record by its offset in the "
            "repartition topic, which a job reading the original topic cannot know; "
            "bootstrapping it is not built (backfill its results instead, or run the workers)"
        )
    count = aggregation_partitions(config, decl, source, partitions)
    kafka_source = source if isinstance(source, KafkaSource) else None
    source, source_ends = pin_ending_offsets(source, [topic.name], options)
    broker = changelog_bootstrap or (
        kafka_source.bootstrap_servers if kafka_source is not None else config.broker
    )
    tables: list[Table] = [decl.table]
    if sliding and decl.table.records is not None:
        tables.append(decl.table.records)
    changelogs = {t.name: t.changelog.name for t in tables}
    repartition: list[str] = []
    if decl.key is not None and decl.source.name in partition_counts(
        broker, [decl.source.name], options
    ):
        repartition.append(decl.source.name)
    create_empty_changelogs(
        broker, [t.changelog for t in tables], count, options, also_empty=repartition
    )
    stores_root: Path | None = None
    if mode == "rocksdb":
        stores_root = Path(state_dir if state_dir is not None else config.state_path).resolve()
        check_no_stores(stores_root, changelogs)
    spark = run.session(f"streamjoin bootstrap {config.id}:{name}", kafka=kafka_source is not None)
    counters = Counters(spark.sparkContext)
    runner = AggregationRunner.for_aggregation(config, decl, count, mode="state")
    verify = kafka_source is not None and decl.key is None
    sequence = decl.key is not None
    root = None if stores_root is None else str(stores_root)
    rows = _ordered_rows(spark, source, decl, count)

    def write_state(kpart: int) -> Iterator[tuple[int, str, int, int]]:
        """The partition's stores after the run: to the changelogs (and the stores)."""
        counters.records.add(runner.stats.get("records", 0))
        counters.partitions.add(1)
        for table, store in runner.stores.items():
            items = list(store.items())
            last = write_partition_state(
                broker, options, changelogs[table], table, kpart, items, root
            )
            counters.outputs.add(len(items))
            yield kpart, table, len(items), last

    def task(index: int, items: Iterator[Any]) -> Iterator[Any]:
        yield from run_partitions(
            runner,
            _unpack(items),
            partitions=count,
            verify=verify,
            sequence=sequence,
            after=write_state,
        )

    reporter = run.reporter(f"bootstrap {name}", counters, count)
    written = run_job(
        spark,
        f"streamjoin bootstrap {config.id}:{name} ({mode})",
        reporter,
        lambda: rows.rdd.mapPartitionsWithIndex(task).collect(),
    )
    if root is not None:
        ingest_staged(root, list(changelogs), count)
    offsets = {p: last for p, table, n, last in written if table == name and n and last >= 0}
    committed = (
        commit_source_ends(kafka_source, config.id, topic.name, source_ends[topic.name], options)
        if commit_source_offsets and source_ends
        else {}
    )
    snap = reporter.snapshot(finished=True)
    return BootstrapResult(
        name,
        changelogs[name],
        count,
        snap.records_read,
        sum(n for _, table, n, _ in written if table == name),
        offsets,
        root,
        committed,
        snap.elapsed_s,
    )
