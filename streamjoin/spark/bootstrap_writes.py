"""What a bootstrap writes, shared by the topic-table and aggregation bootstraps: empty
changelogs to start from, each partition's state (to its changelog, and to the table's
RocksDB database), and the consumer group's offsets after the history read.

A table's database has one writer, and Spark tasks run in parallel (in other processes):
so each task stages its partition as an SST file (:func:`write_staged_partition`) and the
driver ingests them all into the database at the end (:func:`ingest_staged`; a worker
opening the database would too). The partitions then hold the same keys and values, at
the same changelog offsets, as a worker's stores would."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamjoin.errors import SparkJobError

if TYPE_CHECKING:
    from streamjoin.spark.sources import KafkaSource
    from streamjoin.topics import Topic

__all__ = [
    "check_no_stores",
    "commit_source_ends",
    "create_empty_changelogs",
    "ingest_staged",
    "write_partition_state",
]


def create_empty_changelogs(
    broker: str,
    changelogs: Sequence[Topic],
    partitions: int,
    options: Mapping[str, Any],
    *,
    also_empty: Sequence[str] = (),
) -> None:
    """Create ``changelogs`` with ``partitions`` partitions if missing, and refuse to go
    on if one of them, or a topic of ``also_empty`` (a repartition topic), holds records:
    their older keys and the bootstrapped state would disagree."""
    from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
    from streamjoin.spark.kafka_io import _run, offset_bounds

    specs = [
        TopicSpec(t.name, partitions, t.replication_factor, dict(t.config)) for t in changelogs
    ]
    _run(ensure_topics(broker, specs, **options))
    names = [t.name for t in changelogs]
    begin, end = offset_bounds(broker, [*names, *also_empty], options)
    for name, used in end.items():
        if any(used[p] > begin[name][p] for p in used):
            what = "changelog" if name in names else "repartition topic"
            raise SparkJobError(
                f"{what} {name!r} already holds records (end offsets {used}); "
                "bootstrap a new app id, or delete the topic first"
            )


def _database(stores_root: Path, table: str) -> Path:
    from streamjoin.state.inspect import store_path

    return store_path(stores_root, table)


def check_no_stores(stores_root: Path, tables: Iterable[str]) -> None:
    """Refuse a state dir that already holds stores of ``tables``."""
    for table in tables:
        existing = _database(stores_root, table)
        if existing.exists() and any(existing.iterdir()):
            raise FileExistsError(f"{existing} already holds stores; use an empty state dir")


def ingest_staged(stores_root: Path | str, tables: Iterable[str], partitions: int) -> None:
    """Ingest what the tasks staged into each table's database (on the driver, after the
    job): the stores are then complete and readable (``streamjoin tables``)."""
    from streamjoin.state.rocksdb import TableDatabase

    for table in tables:
        path = _database(Path(stores_root), table)
        if path.is_dir():
            TableDatabase(path, table, partitions=range(partitions)).close()


def write_partition_state(
    broker: str,
    options: Mapping[str, Any],
    changelog: str,
    table: str,
    partition: int,
    items: Sequence[tuple[bytes, bytes]],
    stores_root: str | None,
) -> int:
    """Write one partition's state (from a Spark task): ``items`` to the changelog, then,
    with ``stores_root``, the partition staged for the table's RocksDB database, holding
    them at the changelog offset of the last one, so a worker using that state dir
    restores nothing. The last offset (-1: nothing written)."""
    from streamjoin.spark.kafka_io import TaskProducer

    producer = TaskProducer(broker, options)
    try:
        for key, value in items:
            producer.send(changelog, partition, key, value, None)
        last = producer.flush().get(partition, -1)
    finally:
        producer.close()
    if stores_root is not None and items:
        from streamjoin.state.rocksdb import write_staged_partition

        database = _database(Path(stores_root), table)
        write_staged_partition(database, partition, sorted(items), last)
    return last


def commit_source_ends(
    source: KafkaSource | None,
    group: str,
    topic: str,
    ends: Mapping[int, int],
    options: Mapping[str, Any],
) -> dict[int, int]:
    """Commit the app's consumer group at the end offsets read from a Kafka source, so the
    table's agent continues after the history; the offsets committed (none for files)."""
    if source is None or not ends:
        return {}
    from streamjoin.spark.kafka_io import commit_group_offsets

    commit_group_offsets(source.bootstrap_servers, group, {topic: dict(ends)}, options)
    return dict(ends)
