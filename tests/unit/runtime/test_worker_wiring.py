"""What the Worker derives from an AppConfig for the parts it builds (no broker)."""

from __future__ import annotations

import streamjoin
from streamjoin.config import AppConfig
from streamjoin.runtime.worker import membership_settings
from streamjoin.topology import Topology


def test_group_options_among_the_consumer_options_configure_the_membership() -> None:
    config = AppConfig(
        id="wiring",
        group_instance_id="w-1",
        rebalance_protocol="eager",
        consumer_options={
            "session_timeout_ms": "12000",
            "heartbeat_interval_ms": 4_000,
            "max_poll_interval_ms": 90_000,
            "retry_backoff_ms": 250,
            "fetch_max_bytes": 1_000,
        },
    )
    settings = membership_settings(config)
    assert (settings.group_id, settings.group_instance_id) == ("wiring", "w-1")
    assert not settings.cooperative
    assert settings.session_timeout_ms == 12_000
    assert settings.heartbeat_interval_ms == 4_000
    assert settings.rebalance_timeout_ms == 90_000  # the Java consumer's max.poll.interval
    assert settings.retry_backoff_ms == 250


def test_the_rebalance_timeout_wins_over_the_poll_interval() -> None:
    config = AppConfig(
        id="wiring",
        consumer_options={"max_poll_interval_ms": 90_000, "rebalance_timeout_ms": 30_000},
    )
    assert membership_settings(config).rebalance_timeout_ms == 30_000


def test_without_group_options_the_membership_keeps_its_defaults() -> None:
    settings = membership_settings(AppConfig(id="wiring", processing_guarantee="exactly_once"))
    assert settings.exactly_once and settings.cooperative
    assert (settings.session_timeout_ms, settings.rebalance_timeout_ms) == (10_000, 60_000)


def test_partition_counts_are_settled_without_touching_declarations() -> None:
    app = streamjoin.App("wiring")
    a = app.topic("a")
    b = app.topic("b", partitions=3)
    c = app.topic("c")
    app.table("t", default=int, copartitioned_with=b)
    topology: Topology = app.topology()
    counts = topology.resolve_partitions({"a": 5}, default=8)
    assert counts["a"] == 5  # existing
    assert counts["b"] == 3  # declared
    assert counts["c"] == 8  # the default
    assert counts["wiring-t-changelog"] == 3  # co-partitioned with b
    assert (a.partitions, b.partitions, c.partitions) == (None, 3, None)
