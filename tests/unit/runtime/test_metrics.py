"""The metrics module, the snapshot's exports (Prometheus, OpenTelemetry), the status page
and the status line, without a broker."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import streamjoin
from streamjoin.errors import ConfigurationError
from streamjoin.runtime.metrics import (
    LATENCY_BUCKETS,
    METRICS,
    Histogram,
    WorkerCounters,
    registry_for,
    samples,
)
from streamjoin.runtime.ops.monitor import WorkerMonitor, status_line
from streamjoin.runtime.ops.status_page import render_status_page
from streamjoin.runtime.table_state.service import RestoreProgress
from streamjoin.runtime.tasks import actors
from streamjoin.runtime.tasks.offset_ledger import OffsetTracker
from streamjoin.stream import Stream
from streamjoin.testing.driver import TestDriver

DASHBOARD = Path(__file__).parents[3] / "docs" / "grafana-dashboard.json"


def example_snapshot() -> dict[str, Any]:
    latency = Histogram((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.005, 0.5):
        latency.observe(seconds)
    return {
        "worker": {
            "app_id": "orders",
            "client_id": "orders-host-1",
            "member_id": "m-1",
            "generation": 7,
            "uptime_seconds": 12.0,
        },
        "throughput": {"records_in": 30, "records_out": 10},
        "partitions": [
            {
                "topic": "in",
                "partition": 0,
                "role": "active",
                "records_in": 20,
                "rate": 2.5,
                "end_offset": 25,
                "committed_offset": 20,
                "processed_offset": 22,
                "lag": 5,
                "lag_processed": 3,
            },
            {
                "topic": "in",
                "partition": 1,
                "role": "restoring",
                "records_in": 10,
                "rate": 0.0,
                "end_offset": None,
                "committed_offset": None,
                "processed_offset": None,
                "lag": None,
                "lag_processed": None,
            },
        ],
        "tables": [
            {"table": "totals", "partition": 0, "role": "active", "lag": 0, "rate": 0.0},
            {
                "table": "totals",
                "partition": 1,
                "role": "restoring",
                "lag": 400,
                "rate": 100.0,
                "records_left": 400,
                "eta_seconds": 4.0,
            },
            {"table": "totals", "partition": 2, "role": "standby", "lag": 3, "rate": 9.0},
        ],
        "records_out": {"out": 10},
        "processing_latency": {"count<er>": latency.snapshot()},
        "commit_latency": Histogram((0.1,)).snapshot(),
        "commits": 4,
        "changelog_flush_records": Histogram((10,)).snapshot(),
        "restored_records": 600,
        "rebalance": {"rebalance-total": 2, "failed-rebalance-total": 1},
        "transactions": {},
        "joins": {"clicks": {"emitted": 5, "late": 2, "beyond_grace": 1}},
        "dead_lettered": {"checker": 1},
        "skipped": {"tolerant": 3},
        "errors": {"processing": 4},
    }


def scrape(snapshot: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry_for(lambda: snapshot)).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_histogram_buckets_are_inclusive_upper_bounds_and_cumulative() -> None:
    h = Histogram((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.005, 0.5):
        h.observe(seconds)
    assert h.snapshot() == {
        "buckets": [[0.001, 2], [0.01, 3], ["+Inf", 4]],
        "count": 4,
        "sum": pytest.approx(0.5065),
    }


def test_prometheus_export_reads_the_snapshot() -> None:
    values = scrape(example_snapshot())
    assert values[("streamjoin_records_in_total", (("partition", "0"), ("topic", "in")))] == 20
    assert values[("streamjoin_consumer_lag", (("partition", "0"), ("topic", "in")))] == 5
    assert values[("streamjoin_consumer_lag_processed", (("partition", "0"), ("topic", "in")))] == 3
    # unknown values are left out, not exported as 0
    assert ("streamjoin_consumer_lag", (("partition", "1"), ("topic", "in"))) not in values
    assert values[("streamjoin_records_out_total", (("topic", "out"),))] == 10
    assert (
        values[("streamjoin_restore_records_left", (("partition", "1"), ("table", "totals")))]
        == 400
    )
    assert (
        values[("streamjoin_restore_eta_seconds", (("partition", "1"), ("table", "totals")))] == 4
    )
    assert values[("streamjoin_standby_lag", (("partition", "2"), ("table", "totals")))] == 3
    assert values[("streamjoin_partitions", (("kind", "table"), ("role", "standby")))] == 1
    assert values[("streamjoin_partitions", (("kind", "source"), ("role", "active")))] == 1
    assert values[("streamjoin_join_late_total", (("join", "clicks"),))] == 2
    assert values[("streamjoin_join_beyond_grace_total", (("join", "clicks"),))] == 1
    assert values[("streamjoin_skipped_total", (("agent", "tolerant"),))] == 3
    assert values[("streamjoin_dead_lettered_total", (("agent", "checker"),))] == 1
    assert values[("streamjoin_errors_total", (("kind", "processing"),))] == 4
    assert values[("streamjoin_rebalances_total", ())] == 2
    assert values[("streamjoin_generation", ())] == 7
    agent = (("agent", "count<er>"),)
    assert values[("streamjoin_processing_latency_seconds_count", agent)] == 4
    assert values[("streamjoin_processing_latency_seconds_bucket", (*agent, ("le", "0.001")))] == 2
    assert values[("streamjoin_processing_latency_seconds_bucket", (*agent, ("le", "+Inf")))] == 4


def test_each_worker_has_its_own_registry_not_the_global_one() -> None:
    first, second = example_snapshot(), example_snapshot()
    second["partitions"][0]["records_in"] = 99
    key = ("streamjoin_records_in_total", (("partition", "0"), ("topic", "in")))
    assert scrape(first)[key] == 20
    assert scrape(second)[key] == 99
    assert b"streamjoin_" not in generate_latest(REGISTRY)


def test_every_metric_is_exported_even_before_it_has_values() -> None:
    text = generate_latest(registry_for(dict)).decode()
    for spec in METRICS:
        name = f"{spec.name}_total" if spec.kind == "counter" else spec.name
        assert f"# TYPE {name} {spec.kind}" in text or f"# TYPE {spec.name} {spec.kind}" in text
    assert all(not values for values in samples({}).values())


async def test_agents_count_latency_and_failed_records_by_policy() -> None:
    app = streamjoin.App("metrics-unit")
    topic = app.topic("t", partitions=1)

    @app.agent(topic, on_error="skip", name="tolerant")
    async def tolerant(stream: Stream) -> None:
        async for event in stream:
            if event.value == "boom":
                raise ValueError("boom")

    @app.agent(app.topic("u", partitions=1), on_error="dead_letter", name="checker")
    async def checker(stream: Stream) -> None:
        async for event in stream:
            if event.value == "bad":
                raise ValueError("bad")

    async with TestDriver(app) as driver:
        for value in ("a", "boom", "b", "boom"):
            await driver.put("t", value=value)
        for value in ("bad", "ok"):
            await driver.put("u", value=value)
        await driver.drain()
        assert driver.runtime is not None
        counters = driver.runtime.counters
    assert counters.skipped == {"tolerant": 2}
    assert counters.dead_lettered == {"checker": 1}
    assert counters.errors == {"processing": 3}
    # events the function finished: the failed ones are not timed
    assert counters.processing_latency["tolerant"].count == 2
    assert counters.processing_latency["checker"].count == 1
    # the latencies counted per event join the sum before the agent waits for more
    assert counters.processing_latency["tolerant"].sum > 0
    assert counters.processing_latency["checker"].sum > 0


async def test_an_agents_latency_buckets_are_the_histograms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The actor counts each event's latency into the histogram itself (inline, native):
    the buckets, bounds included, and the sum are those of ``Histogram.observe``."""
    bounds = LATENCY_BUCKETS
    took = [bounds[0] / 2, *bounds, *(b * 1.5 for b in bounds), 100.0]
    # the actor reads the clock when it hands an event out (0.0 here) and when it is
    # asked for the next one (the event's latency)
    readings = iter([x for latency in took for x in (0.0, latency)])
    monkeypatch.setattr(actors, "perf_counter", lambda: next(readings, 0.0))
    app = streamjoin.App("latency-unit")
    topic = app.topic("t", partitions=1)

    @app.agent(topic, name="timed")
    async def timed(stream: Stream) -> None:
        async for _event in stream:
            pass

    async with TestDriver(app) as driver:
        for n in range(len(took)):
            await driver.put("t", value=str(n))
        await driver.drain()
        assert driver.runtime is not None
        counted = driver.runtime.counters.processing_latency["timed"]
    expected = Histogram(bounds)
    for latency in took:
        expected.observe(latency)
    assert counted.counts == expected.counts
    assert counted.sum == pytest.approx(expected.sum)


def test_offset_tracker_reports_processed_and_committed_positions() -> None:
    tracker = OffsetTracker()
    assert tracker.positions(("t", 0)) == (None, None)
    for offset in (5, 6, 7):
        tracker.register(("t", 0), offset, 1)
    tracker.ack(("t", 0), 5)
    tracker.ack(("t", 0), 7)
    assert tracker.positions(("t", 0)) == (6, None)
    tracker.mark_committed({("t", 0): 6})
    tracker.ack(("t", 0), 6)
    assert tracker.positions(("t", 0)) == (8, 6)


def test_restore_eta_is_records_left_over_rate() -> None:
    assert RestoreProgress(False, 100, 400, 100.0).eta_seconds == 4.0
    assert RestoreProgress(False, 0, 400, 0.0).eta_seconds is None


def test_status_line_is_one_line_of_throughput_lag_and_roles() -> None:
    line = status_line(example_snapshot(), 30.0, (300, 60))
    assert "\n" not in line
    assert line == (
        "status: in 10.0 records/s, out 2.0 records/s over 30s; lag 5 records on 1 partitions; "
        "source partitions: 1 active, 1 restoring; table partitions: 1 active, 1 restoring, "
        "1 standby"
    )


class _Counting:
    """Just enough of a worker for the monitor's rates (a table's changelog is not output)."""

    def __init__(self) -> None:
        self.counters = WorkerCounters()
        self.topology = streamjoin.App("a").topology()


def test_monitor_rates_are_records_per_second_since_the_last_sample() -> None:
    worker = _Counting()
    app = streamjoin.App("a")
    app.table("counts", default=int)
    worker.topology = app.topology()
    monitor = WorkerMonitor(worker, status_log_interval=None)  # type: ignore[arg-type]
    worker.counters.records_in[("t", 0)] = 10
    monitor._sample(100.0)
    worker.counters.records_in[("t", 0)] = 60
    worker.counters.records_in[("t", 1)] = 5
    worker.counters.sent("out", 20)
    worker.counters.sent("a-counts-changelog", 500)
    monitor._sample(105.0)
    assert monitor.rates == {("t", 0): 10.0, ("t", 1): 1.0}
    assert monitor.rate_in == 11.0
    assert monitor.rate_out == 4.0


def test_status_page_is_self_contained_and_shows_every_partition() -> None:
    page = render_status_page(example_snapshot())
    assert page.startswith("<!DOCTYPE html>")
    assert '<meta http-equiv="refresh"' in page
    # no external assets: no src attributes, no links off the worker
    assert " src=" not in page
    assert not re.search(r'href="(https?:)?//', page)
    assert page.count('<tr class="active">') == 2  # one source, one table partition
    assert '<tr class="restoring">' in page
    assert '<tr class="standby">' in page
    assert "orders-host-1" in page and "m-1" in page
    assert "clicks" in page  # the joins section


def test_status_page_escapes_what_it_shows() -> None:
    snapshot = example_snapshot()
    snapshot["partitions"][0]["topic"] = "<script>x</script>"
    page = render_status_page(snapshot)
    assert "<script>x</script>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page


def test_status_page_renders_an_empty_snapshot() -> None:
    page = render_status_page({})
    assert "no source partitions" in page
    assert "no table partitions" in page


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("web_port", 70000, "web_port must be a port number"),
        ("web_port", "8080", "web_port must be a port number"),
        ("web_host", "", "web_host must be"),
        ("status_log_interval", 0, "status_log_interval must be > 0"),
    ],
)
def test_web_settings_are_validated(setting: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        streamjoin.App("a", **{setting: value})


def test_web_settings_default_to_no_server_and_a_status_line_every_30s() -> None:
    config = streamjoin.App("a").config
    assert config.web_port is None
    assert config.web_host == "127.0.0.1"
    assert config.status_log_interval == 30.0


def test_opentelemetry_export_reads_the_snapshot() -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from streamjoin.otel import instrument

    snapshot = example_snapshot()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instrument(lambda: snapshot, provider)
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, tuple(sorted((point.attributes or {}).items())))
                    points[key] = point.value  # type: ignore[union-attr]
    assert points[("streamjoin_records_in", (("partition", "0"), ("topic", "in")))] == 20
    assert points[("streamjoin_consumer_lag", (("partition", "0"), ("topic", "in")))] == 5
    assert points[("streamjoin_join_late", (("join", "clicks"),))] == 2
    agent = (("agent", "count<er>"),)
    assert points[("streamjoin_processing_latency_seconds_count", agent)] == 4
    # the values change with the snapshot
    snapshot["partitions"][0]["records_in"] = 21
    data = reader.get_metrics_data()
    assert data is not None
    found = [
        p.value  # type: ignore[union-attr]
        for r in data.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        if m.name == "streamjoin_records_in"
        for p in m.data.data_points
        if (p.attributes or {}).get("partition") == "0"
    ]
    assert found == [21]


def test_grafana_dashboard_queries_only_metrics_we_export() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    exported = {
        family.name + suffix
        for family in registry_for(dict).collect()
        for suffix in suffixes[family.type]
    }
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert len(exprs) >= 8
    for expr in exprs:
        names = set(re.findall(r"\bstreamjoin_[a-z_]+", expr))
        assert names, expr
        assert names <= exported, (expr, names - exported)
