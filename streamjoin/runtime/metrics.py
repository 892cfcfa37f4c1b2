"""The worker's metrics: cheap counters the runtime bumps, and their exported names.

The hot path only touches plain ints and lists: the consumer adds a fetched batch's
size to its partition's counter, an actor puts one event's duration into a
:class:`Histogram` it holds a reference to. Nothing is labelled or allocated per
event. Exporting is done on demand from a *snapshot* (a plain dict, see
:func:`streamjoin.runtime.ops.monitor.collect`): the Prometheus registry of each worker
(:func:`registry_for`, never the process-wide default: several workers may share a
process), ``App.metrics()``, ``/status.json`` and the OpenTelemetry bridge all read
the same snapshot, through :func:`samples`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = [
    "COMMIT_BUCKETS",
    "FLUSH_BUCKETS",
    "LATENCY_BUCKETS",
    "METRICS",
    "Histogram",
    "MetricSpec",
    "WorkerCounters",
    "registry_for",
    "samples",
]

#: seconds: one event's processing, from 50 µs to 10 s
LATENCY_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)
#: seconds: one commit (flush of the tables, then the offsets)
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: records sent to one changelog partition by one flush
FLUSH_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)


class Histogram:
    """Counts of observations per bucket (upper bounds inclusive), their sum and count."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        #: one slot per bound, plus one for "more than the last bound"
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> dict[str, Any]:
        """``{"buckets": [[upper bound, cumulative count], ...], "count": n, "sum": s}``;
        the last bucket's bound is ``"+Inf"``."""
        buckets: list[list[Any]] = []
        total = 0
        for bound, n in zip((*self.bounds, "+Inf"), self.counts, strict=True):
            total += n
            buckets.append([bound, total])
        return {"buckets": buckets, "count": total, "sum": self.sum}


class WorkerCounters:
    """What the runtime counts while it runs (one per worker; read by snapshots)."""

    def __init__(self) -> None:
        #: records handed to agents, per source partition (added a fetched batch at a time)
        self.records_in: dict[tuple[str, int], int] = {}
        #: records produced, per topic (agent outputs, dead letters, changelogs)
        self.records_out: dict[str, int] = {}
        #: one event's processing time, per agent (each actor holds its agent's histogram)
        self.processing_latency: dict[str, Histogram] = {}
        self.commit_latency = Histogram(COMMIT_BUCKETS)
        self.commits = 0
        self.changelog_flush_records = Histogram(FLUSH_BUCKETS)
        #: failed records by agent: dead-lettered, skipped
        self.dead_lettered: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        #: errors by kind ("decode", "processing", "send", "fatal", ...)
        self.errors: dict[str, int] = {}

    def latency_of(self, agent: str) -> Histogram:
        histogram = self.processing_latency.get(agent)
        if histogram is None:
            histogram = self.processing_latency[agent] = Histogram(LATENCY_BUCKETS)
        return histogram

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def sent(self, topic: str, records: int = 1) -> None:
        self.records_out[topic] = self.records_out.get(topic, 0) + records


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric: its Prometheus name, kind, label names and meaning."""

    name: str
    kind: str  # "counter", "gauge" or "histogram"
    labels: tuple[str, ...]
    help: str


def _spec(name: str, kind: str, labels: str, help: str) -> MetricSpec:
    return MetricSpec(name, kind, tuple(labels.split()), help)


#: every metric a worker exports (counters without their ``_total`` suffix, as
#: Prometheus names the family; the samples end in ``_total``)
METRICS: tuple[MetricSpec, ...] = (
    _spec("streamjoin_worker_info", "gauge", "app_id client_id member_id", "This worker (1)."),
    _spec("streamjoin_generation", "gauge", "", "Group generation of this member (-1: none)."),
    _spec("streamjoin_records_in", "counter", "topic partition", "Records handed to agents."),
    _spec("streamjoin_records_out", "counter", "topic", "Records produced (incl. changelogs)."),
    _spec(
        "streamjoin_processing_latency_seconds",
        "histogram",
        "agent",
        "Time an agent spent on one event (or one batch of stream.take).",
    ),
    _spec(
        "streamjoin_consumer_end_offset",
        "gauge",
        "topic partition",
        "End offset of a source partition (refreshed every few seconds).",
    ),
    _spec(
        "streamjoin_consumer_committed_offset",
        "gauge",
        "topic partition",
        "Committed offset of a source partition.",
    ),
    _spec(
        "streamjoin_consumer_processed_offset",
        "gauge",
        "topic partition",
        "Next offset after the records processed (and acknowledged).",
    ),
    _spec(
        "streamjoin_consumer_lag",
        "gauge",
        "topic partition",
        "End offset minus committed offset.",
    ),
    _spec(
        "streamjoin_consumer_lag_processed",
        "gauge",
        "topic partition",
        "End offset minus processed offset.",
    ),
    _spec("streamjoin_commit_latency_seconds", "histogram", "", "Duration of one commit."),
    _spec("streamjoin_commits", "counter", "", "Commits that committed offsets."),
    _spec(
        "streamjoin_changelog_flush_records",
        "histogram",
        "",
        "Records sent to one changelog partition by one flush.",
    ),
    _spec("streamjoin_partitions", "gauge", "kind role", "Partitions held, by kind and role."),
    _spec(
        "streamjoin_restore_records_left",
        "gauge",
        "table partition",
        "Changelog records left to restore (upper bound).",
    ),
    _spec(
        "streamjoin_restore_rate",
        "gauge",
        "table partition",
        "Records restored per second.",
    ),
    _spec(
        "streamjoin_restore_eta_seconds",
        "gauge",
        "table partition",
        "Estimated seconds until the restore ends.",
    ),
    _spec("streamjoin_restored_records", "counter", "", "Changelog records restored."),
    _spec(
        "streamjoin_standby_lag",
        "gauge",
        "table partition",
        "Changelog records a standby (or warmup) store is behind.",
    ),
    _spec("streamjoin_rebalances", "counter", "", "Completed rebalances."),
    _spec("streamjoin_failed_rebalances", "counter", "", "Failed join or sync attempts."),
    _spec(
        "streamjoin_rebalance_latency_seconds_avg",
        "gauge",
        "",
        "Average rebalance duration.",
    ),
    _spec("streamjoin_rebalance_latency_seconds_max", "gauge", "", "Longest rebalance."),
    _spec("streamjoin_rebalance_rate_per_hour", "gauge", "", "Rebalances in the last hour."),
    _spec(
        "streamjoin_last_rebalance_seconds_ago",
        "gauge",
        "",
        "Seconds since the last rebalance completed.",
    ),
    _spec(
        "streamjoin_rebalance_callback_seconds_max",
        "gauge",
        "callback",
        "Longest revoked/assigned/lost callback.",
    ),
    _spec("streamjoin_partitions_lost", "counter", "", "Partitions lost (fenced, expired)."),
    _spec("streamjoin_transactions_committed", "counter", "", "Transactions committed."),
    _spec("streamjoin_transactions_aborted", "counter", "", "Transactions aborted."),
    _spec("streamjoin_join_emitted", "counter", "join", "Join results emitted."),
    _spec("streamjoin_join_late", "counter", "join", "Join inputs dropped: their window closed."),
    _spec(
        "streamjoin_join_beyond_grace",
        "counter",
        "join",
        "Join inputs accepted beyond the grace period.",
    ),
    _spec(
        "streamjoin_window_results",
        "counter",
        "table",
        "Final results of closed windows (emit='close').",
    ),
    _spec(
        "streamjoin_window_late",
        "counter",
        "table",
        "Records dropped by windowed tables: their window had closed.",
    ),
    _spec(
        "streamjoin_window_result_errors",
        "counter",
        "table",
        "Final results whose on_window_close raised or that could not be encoded.",
    ),
    _spec(
        "streamjoin_table_expired_keys",
        "counter",
        "table",
        "Keys of TTL tables purged as expired (a changelog tombstone each).",
    ),
    _spec(
        "streamjoin_table_late_writes",
        "counter",
        "table",
        "Writes to a versioned table dropped: their timestamp was older than the history "
        "kept (stream time - history_ms).",
    ),
    _spec(
        "streamjoin_table_too_late_lookups",
        "counter",
        "table",
        "Stream-table join events dropped: their timestamp was older than the versioned "
        "table's history, so the row of their time may be purged.",
    ),
    _spec(
        "streamjoin_global_table_lag",
        "gauge",
        "table",
        "Records of a global table's topic not yet in this worker's copy.",
    ),
    _spec(
        "streamjoin_global_table_restored",
        "gauge",
        "table",
        "1 once this worker's copy of a global table is restored.",
    ),
    _spec("streamjoin_dead_lettered", "counter", "agent", "Records sent to a dead-letter topic."),
    _spec("streamjoin_skipped", "counter", "agent", "Records skipped after an error."),
    _spec("streamjoin_errors", "counter", "kind", "Errors by kind."),
    _spec("streamjoin_timer_runs", "counter", "timer", "Runs of a timer or app task."),
    _spec("streamjoin_timer_errors", "counter", "timer", "Runs that raised an error."),
    _spec(
        "streamjoin_timer_last_duration_seconds",
        "gauge",
        "timer",
        "Duration of a timer's last run.",
    ),
    _spec(
        "streamjoin_timer_ticks_skipped",
        "counter",
        "timer reason",
        "Ticks not run: a run overran them (overrun), or this worker did not lead (not_leader).",
    ),
)

Labels = tuple[str, ...]
Sample = tuple[Labels, float]


def _rows(snapshot: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    rows = snapshot.get(key)
    return list(rows) if isinstance(rows, list) else []


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def samples(snapshot: Mapping[str, Any]) -> dict[str, list[Sample]]:
    """The values of every non-histogram metric in ``snapshot``, by metric name:
    ``[(label values, value), ...]`` in the order of :data:`METRICS`' labels."""
    out: dict[str, list[Sample]] = {s.name: [] for s in METRICS if s.kind != "histogram"}

    def put(name: str, labels: Labels, value: Any) -> None:
        number = _number(value)
        if number is not None:
            out[name].append((labels, number))

    worker = snapshot.get("worker") or {}
    if worker:
        labels = (
            str(worker.get("app_id", "")),
            str(worker.get("client_id", "")),
            str(worker.get("member_id") or ""),
        )
        put("streamjoin_worker_info", labels, 1)
        put("streamjoin_generation", (), worker.get("generation"))
    roles: dict[tuple[str, str], int] = {}
    for row in _rows(snapshot, "partitions"):
        tp = (str(row["topic"]), str(row["partition"]))
        roles[("source", row["role"])] = roles.get(("source", row["role"]), 0) + 1
        put("streamjoin_records_in", tp, row.get("records_in"))
        put("streamjoin_consumer_end_offset", tp, row.get("end_offset"))
        put("streamjoin_consumer_committed_offset", tp, row.get("committed_offset"))
        put("streamjoin_consumer_processed_offset", tp, row.get("processed_offset"))
        put("streamjoin_consumer_lag", tp, row.get("lag"))
        put("streamjoin_consumer_lag_processed", tp, row.get("lag_processed"))
    for row in _rows(snapshot, "tables"):
        tp = (str(row["table"]), str(row["partition"]))
        role = str(row["role"])
        roles[("table", role)] = roles.get(("table", role), 0) + 1
        if role == "restoring":
            put("streamjoin_restore_records_left", tp, row.get("records_left"))
            put("streamjoin_restore_rate", tp, row.get("rate"))
            put("streamjoin_restore_eta_seconds", tp, row.get("eta_seconds"))
        elif role in ("standby", "warmup", "pending"):
            put("streamjoin_standby_lag", tp, row.get("lag"))
    for (kind, role), n in sorted(roles.items()):
        put("streamjoin_partitions", (kind, role), n)
    for topic, n in sorted((snapshot.get("records_out") or {}).items()):
        put("streamjoin_records_out", (topic,), n)
    put("streamjoin_commits", (), snapshot.get("commits"))
    put("streamjoin_restored_records", (), snapshot.get("restored_records"))
    rebalance = snapshot.get("rebalance") or {}
    put("streamjoin_rebalances", (), rebalance.get("rebalance-total"))
    put("streamjoin_failed_rebalances", (), rebalance.get("failed-rebalance-total"))
    put("streamjoin_rebalance_latency_seconds_avg", (), rebalance.get("rebalance-latency-avg"))
    put("streamjoin_rebalance_latency_seconds_max", (), rebalance.get("rebalance-latency-max"))
    put("streamjoin_rebalance_rate_per_hour", (), rebalance.get("rebalance-rate-per-hour"))
    put("streamjoin_last_rebalance_seconds_ago", (), rebalance.get("last-rebalance-seconds-ago"))
    for callback in ("revoked", "assigned", "lost"):
        value = rebalance.get(f"partition-{callback}-latency-max")
        put("streamjoin_rebalance_callback_seconds_max", (callback,), value)
    put("streamjoin_partitions_lost", (), rebalance.get("partitions-lost-total"))
    transactions = snapshot.get("transactions") or {}
    put("streamjoin_transactions_committed", (), transactions.get("transactions-committed"))
    put("streamjoin_transactions_aborted", (), transactions.get("transactions-aborted"))
    for join, stats in sorted((snapshot.get("joins") or {}).items()):
        put("streamjoin_join_emitted", (join,), stats.get("emitted"))
        put("streamjoin_join_late", (join,), stats.get("late"))
        put("streamjoin_join_beyond_grace", (join,), stats.get("beyond_grace"))
    for table, stats in sorted((snapshot.get("windows") or {}).items()):
        put("streamjoin_window_results", (table,), stats.get("closed"))
        put("streamjoin_window_late", (table,), stats.get("late"))
        put("streamjoin_window_result_errors", (table,), stats.get("callback_errors"))
    for table, n in sorted((snapshot.get("ttl_expired") or {}).items()):
        put("streamjoin_table_expired_keys", (table,), n)
    for table, n in sorted((snapshot.get("late_writes") or {}).items()):
        put("streamjoin_table_late_writes", (table,), n)
    for table, n in sorted((snapshot.get("too_late") or {}).items()):
        put("streamjoin_table_too_late_lookups", (table,), n)
    for table, row in sorted((snapshot.get("global_tables") or {}).items()):
        put("streamjoin_global_table_lag", (table,), row.get("lag"))
        put("streamjoin_global_table_restored", (table,), int(bool(row.get("restored"))))
    for name, key in (
        ("streamjoin_dead_lettered", "dead_lettered"),
        ("streamjoin_skipped", "skipped"),
    ):
        for agent, n in sorted((snapshot.get(key) or {}).items()):
            put(name, (agent,), n)
    for kind, n in sorted((snapshot.get("errors") or {}).items()):
        put("streamjoin_errors", (kind,), n)
    for timer, row in sorted((snapshot.get("timers") or {}).items()):
        put("streamjoin_timer_runs", (timer,), row.get("runs"))
        put("streamjoin_timer_errors", (timer,), row.get("errors"))
        put("streamjoin_timer_last_duration_seconds", (timer,), row.get("last_duration_seconds"))
        put("streamjoin_timer_ticks_skipped", (timer, "overrun"), row.get("skipped_overrun"))
        put("streamjoin_timer_ticks_skipped", (timer, "not_leader"), row.get("skipped_not_leader"))
    return out


def histograms(snapshot: Mapping[str, Any]) -> dict[str, list[tuple[Labels, Mapping[str, Any]]]]:
    """The histogram metrics of ``snapshot``: ``[(label values, Histogram.snapshot()), ...]``."""
    latency = snapshot.get("processing_latency") or {}
    out: dict[str, list[tuple[Labels, Mapping[str, Any]]]] = {
        "streamjoin_processing_latency_seconds": [
            ((agent,), h) for agent, h in sorted(latency.items())
        ],
        "streamjoin_commit_latency_seconds": [],
        "streamjoin_changelog_flush_records": [],
    }
    for name, key in (
        ("streamjoin_commit_latency_seconds", "commit_latency"),
        ("streamjoin_changelog_flush_records", "changelog_flush_records"),
    ):
        found = snapshot.get(key)
        if found:
            out[name].append(((), found))
    return out


class SnapshotCollector(Collector):
    """A Prometheus collector reading one worker's snapshot at each scrape."""

    def __init__(self, source: Callable[[], Mapping[str, Any]]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []  # no snapshot at registration time

    def collect(self) -> Iterator[Metric]:
        snapshot = self._source()
        values = samples(snapshot)
        hists = histograms(snapshot)
        for spec in METRICS:
            family: Metric
            if spec.kind == "histogram":
                family = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels)
                for labels, h in hists.get(spec.name, []):
                    buckets = [(_bound(b), float(c)) for b, c in h["buckets"]]
                    family.add_metric(list(labels), buckets, float(h["sum"]))
            else:
                cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
                family = cls(spec.name, spec.help, labels=spec.labels)
                for labels, value in values[spec.name]:
                    family.add_metric(list(labels), value)
            yield family


def _bound(bound: Any) -> str:
    return "+Inf" if bound == "+Inf" else repr(float(bound))


def registry_for(source: Callable[[], Mapping[str, Any]]) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) exporting ``source()``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(source))
    return registry
