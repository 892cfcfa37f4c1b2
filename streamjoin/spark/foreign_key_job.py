"""Backfill of a foreign-key join's final rows on Spark (``final_only`` only).

Each side's last record per key is found by a shuffle on its key (offset order for Kafka,
timestamp then file order for files); the live left rows are keyed by their foreign key
and left-outer-joined with the live right rows (the sides need not be co-partitioned);
each pair goes through :class:`~streamjoin.spark.foreign_key_rows.ForeignKeyRows`, the
same rules the pure tests check. The change history is not backfilled: which changes a
worker emits depends on when the responses arrive.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from streamjoin.errors import ConfigurationError
from streamjoin.spark.foreign_key_rows import ForeignKeyRows
from streamjoin.spark.outputs import (
    BackfillResult,
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
from streamjoin.ttl_tables import refuse_in_spark

if TYPE_CHECKING:
    from streamjoin.app import App
    from streamjoin.joins.foreign_key_api import ForeignKeyJoinDecl

__all__ = ["backfill_foreign_key", "refuse_history"]


def refuse_history(decl: ForeignKeyJoinDecl, final_only: bool, close_windows_at_end: bool) -> None:
    """Only the final rows of a foreign-key join can be backfilled: say so for anything else."""
    if not final_only:
        raise ConfigurationError(
            f"join {decl.name!r} is a foreign-key join: only its final rows can be backfilled "
            "(pass final_only=True, --final-only); its change history depends on when the "
            "responses reached the workers"
        )
    if close_windows_at_end:
        raise ConfigurationError(
            f"join {decl.name!r} is a foreign-key join: close_windows_at_end (--close-windows) "
            "applies to windowed stream-stream joins only"
        )


def backfill_foreign_key(
    app: App,
    decl: ForeignKeyJoinDecl,
    run: SparkRun,
    *,
    source: Source,
    output: Sink,
    partitions: int | None,
    parallelism: int | None,
) -> BackfillResult:
    """Write the rows ``decl``'s result table holds once a worker has read ``source``."""
    refuse_in_spark(f"join {decl.name!r}", decl.left, decl.right)
    if source.start_timestamp_ms is not None:
        raise ConfigurationError(
            f"join {decl.name!r} is a foreign-key join: its final rows need the tables from "
            "their beginning, so a start time does not apply"
        )
    config, name = app.config, decl.name
    left_topic, right_topic = decl.left_source, decl.right_source
    left_count = input_partitions(config, source, [left_topic], partitions, f"join {name!r}")
    if isinstance(source, KafkaSource):  # the right side has its own partition count
        input_partitions(config, source, [right_topic], None, f"join {name!r}")
    topics = [left_topic.name, right_topic.name]
    source, _ = pin_ending_offsets(source, topics, config.client_kwargs())
    spark = run.session(
        f"streamjoin backfill {config.id}:{name}", kafka=isinstance(source, KafkaSource)
    )
    sc = spark.sparkContext
    declared = decl.output.partitions if decl.output is not None else None
    sink_broker, out_partitions = output_partitions(config, output, source, declared, left_count)
    rows = ForeignKeyRows.for_join(config, decl, out_partitions)
    writer = ResultWriter(
        decl.output.name if decl.output is not None else name,
        output,
        sink_broker,
        config.client_kwargs(),
    )
    counters = Counters(sc)
    tasks = max(left_count, sc.defaultParallelism if parallelism is None else parallelism)
    records = load_records(spark, replace(source, start_timestamp_ms=None), topics)
    latest = _latest_per_key(records, counters)
    left_name = left_topic.name

    def live_left(items: Iterator[Any]) -> Iterator[Any]:
        for (topic, key), (_, value, ts) in items:
            if topic == left_name:
                found = rows.left_row(key, value, ts)
                if found is not None:
                    yield found

    def live_right(items: Iterator[Any]) -> Iterator[Any]:
        for (topic, key), (_, value, ts) in items:
            if topic != left_name:
                found = rows.right_row(key, value, ts)
                if found is not None:
                    yield found

    lefts = latest.mapPartitions(live_left, preservesPartitioning=False)
    rights = latest.mapPartitions(live_right, preservesPartitioning=False)
    joined = lefts.leftOuterJoin(rights, numPartitions=tasks)

    def task(items: Iterator[Any]) -> Iterator[Any]:
        def results() -> Iterator[Any]:
            for _, (left, right) in items:
                out = rows.result(left, right)
                if out is not None:
                    yield out

        count = 0

        def counted() -> Iterator[Any]:
            nonlocal count
            for out in results():
                count += 1
                yield out

        yield from writer.write(counted())
        counters.outputs.add(count)
        counters.partitions.add(1)

    results = joined.mapPartitions(task)
    reporter = run.reporter(f"backfill {name}", counters, tasks)
    target = run_job(
        spark,
        f"streamjoin backfill {config.id}:{name}",
        reporter,
        lambda: write_results(spark, results, output),
    )
    snap = reporter.snapshot(finished=True)
    return BackfillResult(
        name,
        left_count,
        snap.records_read,
        snap.outputs,
        0,
        snap.elapsed_s,
        target,
        tasks,
    )


def _latest_per_key(df: Any, counters: Counters) -> Any:
    """``((topic, key), (order, value, timestamp))`` of each key's last record (an RDD).

    The order is ``(partition, offset)`` for Kafka input (one key is in one partition),
    ``(timestamp, file position)`` for files without offsets."""
    from pyspark.sql import functions as F

    keyed = df.where(F.col("key").isNotNull()).select(
        "topic",
        "key",
        "value",
        "timestamp_ms",
        F.coalesce(F.col("partition"), F.lit(-1)).alias("partition"),
        F.coalesce(F.col("offset"), F.lit(-1)).alias("offset"),
        F.monotonically_increasing_id().alias("ordinal"),
    )

    def pairs(items: Iterator[Any]) -> Iterator[Any]:
        count = 0
        for r in items:
            count += 1
            order = (r.partition, r.offset) if r.offset >= 0 else (r.timestamp_ms, r.ordinal)
            value = None if r.value is None else bytes(r.value)
            yield (r.topic, bytes(r.key)), (order, value, r.timestamp_ms)
        counters.records.add(count)

    def later(a: Any, b: Any) -> Any:
        return b if b[0] > a[0] else a

    return keyed.rdd.mapPartitions(pairs).reduceByKey(later)
