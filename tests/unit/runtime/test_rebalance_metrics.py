"""Rebalance metrics: the KIP-429 names, latencies and hourly rates from injected times."""

from __future__ import annotations

from streamjoin.runtime.group.rebalance_metrics import RebalanceMetrics, RebalanceRecord


def record(generation: int) -> RebalanceRecord:
    return RebalanceRecord(generation, "cooperative", 0.0, 2, 1, 5, False, False)


def test_latency_counts_and_rates() -> None:
    metrics = RebalanceMetrics()
    metrics.started(100.0)
    metrics.started(100.5)  # a second join attempt belongs to the same rebalance
    done = metrics.completed(101.0, record(7))
    assert done.seconds == 1.0 and done.generation == 7
    metrics.failed(200.0)
    metrics.started(300.0)
    metrics.completed(303.0, record(8))
    metrics.revoked.add(0.25)
    metrics.lost.add(0.5)
    snap = metrics.snapshot(310.0)
    assert snap["rebalance-total"] == 2
    assert snap["rebalance-latency-avg"] == 2.0
    assert snap["rebalance-latency-max"] == 3.0
    assert snap["rebalance-latency-total"] == 4.0
    assert snap["failed-rebalance-total"] == 1
    assert snap["last-rebalance-seconds-ago"] == 7.0
    assert snap["partition-revoked-latency-max"] == 0.25
    assert snap["partition-lost-latency-avg"] == 0.5
    assert snap["rebalance-rate-per-hour"] == 2
    # an hour later the rates forget, the totals do not
    later = metrics.snapshot(303.0 + 3601)
    assert later["rebalance-rate-per-hour"] == 0 and later["failed-rebalance-rate-per-hour"] == 0
    assert later["rebalance-total"] == 2


def test_nothing_yet() -> None:
    snap = RebalanceMetrics().snapshot(5.0)
    assert snap["rebalance-total"] == 0 and snap["last-rebalance-seconds-ago"] is None
    assert not RebalanceMetrics().in_progress
