"""What the Spark jobs write to and report: sinks, results, and a task's partition mismatch.

Shared by the join jobs (:mod:`streamjoin.spark.backfill_job`,
:mod:`streamjoin.spark.bootstrap_job`) and the aggregation jobs
(:mod:`streamjoin.spark.aggregation_jobs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from streamjoin.errors import CopartitioningError
from streamjoin.spark.sources import KafkaSource, Source

if TYPE_CHECKING:
    from streamjoin.config import AppConfig
    from streamjoin.spark.progress import ProgressReporter
    from streamjoin.spark.runners import OutputRecord

__all__ = [
    "MISMATCH_TAG",
    "BackfillResult",
    "BootstrapResult",
    "FileSink",
    "KafkaSink",
    "ResultWriter",
    "Sink",
    "output_partitions",
    "rethrow_mismatch",
    "run_job",
    "write_files",
    "write_results",
]

T = TypeVar("T")

#: the tag a task's CopartitioningError carries through Spark's exception text
MISMATCH_TAG = "streamjoin.CopartitioningError"


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
    tasks: int = 0  #: Spark tasks the join ran in (partitions x parts per partition)


@dataclass
class BootstrapResult:
    """What a bootstrap wrote."""

    table: str
    changelog: str
    partitions: int
    records_read: int
    keys: int
    #: last changelog offset written per partition (absent: the partition is empty)
    changelog_offsets: dict[int, int]
    state_dir: str | None
    committed_source_offsets: dict[int, int]
    elapsed_s: float


def rethrow_mismatch(exc: BaseException) -> None:
    """Raise the :class:`CopartitioningError` a Spark task failed with, if it did."""
    text = str(exc)
    if MISMATCH_TAG in text:
        start = text.index(MISMATCH_TAG) + len(MISMATCH_TAG) + 2
        raise CopartitioningError(text[start:].splitlines()[0]) from None


def write_files(spark: Any, rows: Any, sink: FileSink) -> None:
    """Write ``rows`` (``topic, partition, key, value, timestamp``) to ``sink``'s files."""
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


def output_partitions(
    config: AppConfig, output: Sink, source: Source, declared: int | None, count: int
) -> tuple[str | None, int]:
    """Where a backfill's results go, and in how many partitions: a Kafka sink's broker
    (its own, else the Kafka source's, else the app's; None for files) and the output
    topic's partition count (the existing topic's, else ``declared``, else ``count``,
    creating the topic)."""
    partitions = declared or count
    if not isinstance(output, KafkaSink):
        return None, partitions
    from streamjoin.spark.kafka_io import ensure_topic, partition_counts

    broker = output.bootstrap_servers or (
        source.bootstrap_servers if isinstance(source, KafkaSource) else config.broker
    )
    existing = partition_counts(broker, [output.topic], config.client_kwargs())
    if output.topic in existing:
        return broker, existing[output.topic]
    ensure_topic(broker, output.topic, partitions, config.client_kwargs())
    return broker, partitions


#: a result row for the files: ``label, partition, key, value, timestamp``
ResultRow = tuple[str, int, Any, Any, int | None]


@dataclass(frozen=True)
class ResultWriter:
    """How a backfill task hands on its results (built on the driver, shipped to tasks):
    sent by the task to a Kafka sink (``broker`` set), else yielded as :data:`ResultRow`
    for :func:`write_files` (``json``: key and value as text)."""

    label: str
    output: Sink
    broker: str | None
    client_options: Mapping[str, Any]

    def write(self, outputs: Iterable[OutputRecord]) -> Iterator[ResultRow]:
        output = self.output
        if isinstance(output, KafkaSink):
            from streamjoin.spark.kafka_io import TaskProducer

            assert self.broker is not None  # (output_partitions gives a Kafka sink one)
            producer = TaskProducer(self.broker, self.client_options)
            try:
                for out in outputs:
                    producer.send(
                        output.topic,
                        out.partition,
                        out.key,
                        out.value,
                        out.timestamp_ms,
                        out.headers,
                    )
            finally:
                producer.close()
        elif output.resolved_format() == "json":
            for out in outputs:
                yield (
                    self.label,
                    out.partition,
                    None if out.key is None else out.key.decode("utf-8", "replace"),
                    None if out.value is None else out.value.decode("utf-8", "replace"),
                    out.timestamp_ms,
                )
        else:
            for out in outputs:
                yield (self.label, out.partition, out.key, out.value, out.timestamp_ms)


def run_job(spark: Any, description: str, reporter: ProgressReporter, action: Callable[[], T]) -> T:
    """``action()``, the Spark action that runs a job, named ``description`` in Spark's UI
    and reported by ``reporter``; a task's partition mismatch is raised as the
    :class:`CopartitioningError` it was."""
    sc = spark.sparkContext
    sc.setJobDescription(description)
    try:
        with reporter:
            return action()
    except Exception as exc:
        rethrow_mismatch(exc)
        raise
    finally:
        sc.setJobDescription(None)


def write_results(spark: Any, results: Any, output: Sink) -> str:
    """Run the tasks producing ``results`` (an RDD of :data:`ResultRow`; empty for a Kafka
    sink, which the tasks write) and write the files; what was written, for the result."""
    if isinstance(output, FileSink):
        write_files(spark, results, output)
        return output.path
    results.count()
    return f"kafka topic {output.topic}"
