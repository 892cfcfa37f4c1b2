"""What a bootstrap writes, shared by the topic-table and aggregation bootstraps: empty
changelogs to start from, each partition's state (to its changelog, and to a RocksDB
store), and the consumer group's offsets after the history read."""

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
    "write_partition_state",
]

#: keys per RocksDB write batch
_CHUNK = 10_000


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


def check_no_stores(stores_root: Path, tables: Iterable[str]) -> None:
    """Refuse a state dir that already holds stores of ``tables``."""
    for table in tables:
        existing = stores_root / "tables" / table
        if existing.exists() and any(existing.iterdir()):
            raise FileExistsError(f"{existing} already holds stores; use an empty state dir")


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
    with ``stores_root``, the RocksDB store holding them at the changelog offset of the
    last one, so a worker using that state dir restores nothing. The last offset (-1:
    nothing written)."""
    from streamjoin.spark.kafka_io import TaskProducer

    producer = TaskProducer(broker, options)
    try:
        for key, value in items:
            producer.send(changelog, partition, key, value, None)
        last = producer.flush().get(partition, -1)
    finally:
        producer.close()
    if stores_root is not None and items:
        from streamjoin.state.rocksdb import RocksDBStorePartition

        path = Path(stores_root) / "tables" / table / str(partition)
        store = RocksDBStorePartition(path, table=table, partition=partition)
        try:
            for start in range(0, len(items), _CHUNK):
                chunk = dict(items[start : start + _CHUNK])
                store.write(chunk, last if start + _CHUNK >= len(items) else None)
        finally:
            store.close()
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
