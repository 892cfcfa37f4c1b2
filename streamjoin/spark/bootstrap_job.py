"""Bootstrap: build a table's state from history on Spark, so a new app starts warm.

Supported tables: those materialized from a topic with ``app.topic_table(topic)``
(latest value per key, a null value deletes the key). That state is a pure
function of the topic, so it can be computed offline; tables written by
arbitrary agent code cannot. The windowed tables of aggregations
(``app.aggregate``) are built by :mod:`streamjoin.spark.aggregation_jobs`.

The latest value per key is the record with the highest offset (files without
offsets: the highest timestamp, then file order), in the partition the worker
would hold it in. Then, per partition, in one Spark task:

* ``mode="changelog"``: the live keys are produced to the table's changelog
  (``<app id>-<table>-changelog``) with explicit partitions; a worker restores
  them as usual.
* ``mode="rocksdb"``: the same, and the task also stages the partition (an SST file)
  for the table's RocksDB database ``<state_dir>/stores/<table>``, holding exactly
  those keys with the offset of the last changelog record it produced; the driver
  ingests every staged partition at the end, so a worker using that state dir
  restores nothing: its store already is at the changelog's end.

Both modes require an empty changelog (otherwise the changelog's older keys and
the bootstrapped store would disagree). With a Kafka source, the app's consumer
group is also committed at the end offsets read (``commit_source_offsets``), so
the table's agent continues after the history instead of re-reading it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from streamjoin.errors import (
    ConfigurationError,
    CopartitioningError,
    NotFoundError,
    SparkJobError,
    UnknownTopicError,
)
from streamjoin.spark.bootstrap_writes import (
    check_no_stores,
    commit_source_ends,
    create_empty_changelogs,
    ingest_staged,
    write_partition_state,
)
from streamjoin.spark.outputs import MISMATCH_TAG as _MISMATCH_TAG
from streamjoin.spark.outputs import BootstrapResult, run_job
from streamjoin.spark.progress import Counters, Progress
from streamjoin.spark.session import SparkRun
from streamjoin.spark.sources import KafkaSource, Source, load_records, pin_ending_offsets

if TYPE_CHECKING:
    from streamjoin.app import App
    from streamjoin.topology import Topology

__all__ = ["BootstrapResult", "bootstrap"]

Mode = Literal["changelog", "rocksdb"]


def _why_not_bootstrappable(topology: Topology, table_name: str) -> str:
    """Why a table that is not a topic table cannot be built from history (for the error)."""
    from streamjoin.joins.api import TableTableJoinDecl
    from streamjoin.windowed import WindowedTable

    table = topology.tables[table_name]
    usable = "bootstrap builds tables declared with app.topic_table(topic) (latest value per key)"
    if isinstance(table, WindowedTable):
        return (
            f"table {table_name!r} is a windowed table written by agent code, which Spark "
            "cannot replay; declare it with app.aggregate(topic, window=..., agg=...) to "
            "bootstrap it, or rebuild it by replaying its agents' input with the workers "
            f"(streamjoin offsets reset --to-earliest); {usable} and the windowed tables of "
            "aggregations"
        )
    join = topology.joins.get(table_name)
    if isinstance(join, TableTableJoinDecl):
        return (
            f"table {table_name!r} is the result of table-table join {table_name!r} (of "
            f"{join.left.name!r} and {join.right.name!r}); bootstrapping a join's result is not "
            f"built ('streamjoin backfill {table_name} --final-only' computes its final rows "
            f"into a topic or files, not into this table's changelog); {usable}"
        )
    return f"table {table_name!r} is written by agents, not read from a topic; {usable}"


def bootstrap(
    app: App,
    table_name: str,
    *,
    source: Source,
    mode: Mode = "changelog",
    state_dir: str | Path | None = None,
    changelog_bootstrap: str | None = None,
    partitions: int | None = None,
    commit_source_offsets: bool = True,
    master: str = "local[*]",
    spark: Any = None,
    kafka_packages: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    progress: Callable[[Progress], None] | None = None,
    progress_interval: float = 2.0,
) -> BootstrapResult:
    """Build ``table_name``'s state from ``source`` (see the module docstring).

    ``state_dir``: where ``mode="rocksdb"`` writes stores (default
    ``app.config.state_path``); on a cluster it must be a path the executors can write that
    the worker then uses.
    ``changelog_bootstrap``: the broker holding the changelog (default: the Kafka source's,
    else the app's).
    """
    from pyspark.sql import functions as F

    from streamjoin.spark.kafka_io import partition_counts
    from streamjoin.spark.partitioning import with_kafka_partition

    if mode not in ("changelog", "rocksdb"):
        raise ConfigurationError(f"mode must be 'changelog' or 'rocksdb', got {mode!r}")
    topology, config = app.topology(), app.config
    table = topology.tables.get(table_name)
    if table is None:
        known = ", ".join(sorted(topology.tables)) or "none"
        raise NotFoundError(f"app {config.id!r} has no table {table_name!r} (tables: {known})")
    run = SparkRun(master, spark, kafka_packages, spark_conf, progress, progress_interval)
    aggregation = app.aggregations.get(table_name)
    if aggregation is not None:
        from streamjoin.spark.aggregation_jobs import bootstrap_aggregation

        return bootstrap_aggregation(
            app,
            aggregation,
            run,
            source=source,
            mode=mode,
            state_dir=state_dir,
            changelog_bootstrap=changelog_bootstrap,
            partitions=partitions,
            commit_source_offsets=commit_source_offsets,
        )
    owner = next((a for a in app.aggregations.values() if a.table.records is table), None)
    if owner is not None:
        raise SparkJobError(
            f"table {table_name!r} keeps the recent records of aggregation {owner.name!r}; "
            f"bootstrap {owner.name!r}, which writes both tables"
        )
    topic = topology.table_sources.get(table_name)
    if topic is None:
        raise SparkJobError(_why_not_bootstrappable(topology, table_name))
    from streamjoin.versioned_tables import VersionedTable

    if isinstance(table, VersionedTable):
        raise SparkJobError(
            f"table {table_name!r} is a versioned table (history_ms=): bootstrap writes the "
            "latest value per key, not its versions, so it does not build one; let the "
            "workers read its topic (they keep the history from the start)"
        )
    from streamjoin.ttl_tables import refuse_in_spark

    refuse_in_spark("bootstrap", table)
    kafka_source = source if isinstance(source, KafkaSource) else None
    broker = changelog_bootstrap or (
        kafka_source.bootstrap_servers if kafka_source is not None else config.broker
    )
    options = config.client_kwargs()

    # partition count: the source topic's (Kafka), else declared, else given
    count = partitions or topic.partitions
    if kafka_source is not None:
        counts = partition_counts(kafka_source.bootstrap_servers, [topic.name], options)
        if topic.name not in counts:
            raise UnknownTopicError(f"topic {topic.name!r} does not exist")
        if count is not None and count != counts[topic.name]:
            raise CopartitioningError(
                f"{topic.name!r} has {counts[topic.name]} partitions, not the expected {count}"
            )
        count = counts[topic.name]
    if count is None:
        raise ConfigurationError(
            f"the partition count of {topic.name!r} is not declared; pass partitions="
        )
    source, source_ends = pin_ending_offsets(source, [topic.name], options)

    changelog = table.changelog
    create_empty_changelogs(broker, [changelog], count, options)
    stores_root: Path | None = None
    if mode == "rocksdb":
        stores_root = Path(state_dir if state_dir is not None else config.state_path).resolve()
        check_no_stores(stores_root, [table_name])

    spark = run.session(
        f"streamjoin bootstrap {config.id}:{table_name}", kafka=kafka_source is not None
    )
    sc = spark.sparkContext
    counters = Counters(sc)
    verify = kafka_source is not None
    key_codec, value_codec = table.key_codec, table.value_codec
    changelog_name = changelog.name
    nparts = count

    df = load_records(spark, source, [topic.name]).where(F.col("key").isNotNull())
    keyed = with_kafka_partition(df, count).withColumn("ordinal", F.monotonically_increasing_id())
    rows = keyed.select("kpart", "key", "offset", "timestamp_ms", "ordinal", "value", "partition")

    def keyed_pair(r: Any) -> tuple[tuple[int, bytes], tuple[tuple[int, int, int], Any, int]]:
        kpart, key, offset, ts, ordinal, value, src = r
        if verify and src != kpart:
            raise CopartitioningError(
                f"{_MISMATCH_TAG}: {changelog_name}: record at partition {src} offset {offset} "
                f"has key {bytes(key)[:40]!r}, which murmur2 places in partition {kpart} of "
                f"{nparts}: the topic was not written with Kafka's keyed partitioner"
            )
        order = (-1 if offset is None else offset, ts, ordinal)
        return (kpart, bytes(key)), (order, None if value is None else bytes(value), 1)

    def latest(a: Any, b: Any) -> Any:
        """The later record of a key, and how many records of that key were read."""
        later = a if a[0] >= b[0] else b
        return later[0], later[1], a[2] + b[2]

    reduced = rows.rdd.map(keyed_pair).reduceByKey(
        latest, numPartitions=count, partitionFunc=lambda k: k[0]
    )
    root = None if stores_root is None else str(stores_root)

    def task(index: int, items: Iterator[Any]) -> Iterator[tuple[int, int, int, int]]:
        live: dict[bytes, bytes] = {}
        seen = 0
        for (_kpart, key), (_order, value, records) in items:
            seen += records
            if value is None:
                continue  # deleted: a fresh changelog needs no tombstone
            encoded_key = key_codec.dumps(key_codec.loads(key))
            encoded_value = value_codec.dumps(value_codec.loads(value))
            if encoded_key is None or encoded_value is None:
                continue
            live[encoded_key] = encoded_value
        state = [(key, live[key]) for key in sorted(live)]
        last = write_partition_state(
            broker, options, changelog_name, table_name, index, state, root
        )
        counters.records.add(seen)
        counters.outputs.add(len(live))
        counters.partitions.add(1)
        yield index, seen, len(live), last

    reporter = run.reporter(f"bootstrap {table_name}", counters, count)
    written = run_job(
        spark,
        f"streamjoin bootstrap {config.id}:{table_name} ({mode})",
        reporter,
        lambda: reduced.mapPartitionsWithIndex(task).collect(),
    )
    if root is not None:
        ingest_staged(root, [table_name], count)
    offsets = {p: last for p, _, n, last in written if n and last >= 0}
    committed = (
        commit_source_ends(kafka_source, config.id, topic.name, source_ends[topic.name], options)
        if commit_source_offsets and source_ends
        else {}
    )
    return BootstrapResult(
        table_name,
        changelog_name,
        count,
        sum(seen for _, seen, _, _ in written),
        sum(n for _, _, n, _ in written),
        offsets,
        root,
        committed,
        reporter.snapshot(finished=True).elapsed_s,
    )
