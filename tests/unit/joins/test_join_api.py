"""Declared joins through the in-memory test driver."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import streamjoin
from streamjoin.context import OutgoingRecord
from streamjoin.errors import ConfigurationError, CopartitioningError
from streamjoin.events import RawRecord
from streamjoin.testing.driver import TestDriver

MIN = 60_000


def ad_app(how: str = "inner") -> tuple[streamjoin.App, list[tuple[Any, Any, Any]]]:
    app = streamjoin.App("joins-unit")
    impressions = app.topic("impressions", key_serializer="str", partitions=4)
    clicks = app.topic("clicks", key_serializer="str", partitions=4)
    out = app.topic("attributed", key_serializer="str", partitions=4)
    calls: list[tuple[Any, Any, Any]] = []

    @app.join(
        impressions,
        clicks,
        window=timedelta(minutes=10),
        grace=timedelta(seconds=30),
        how=how,
        output=out,
    )
    def attribute(key: Any, impression: Any, click: Any) -> Any:
        calls.append((key, impression, click))
        return {"imp": impression, "click": click}

    return app, calls


def test_join_declares_buffer_and_copartition_group() -> None:
    app, _ = ad_app()
    assert "attribute" in app.joins
    assert "attribute-buffer" in app.tables
    group = next(g for g in app.copartition_groups if "impressions" in g)
    assert set(group) == {"impressions", "clicks", "joins-unit-attribute-buffer-changelog"}
    assert {t.name for a in app.agents.values() for t in a.topics} >= {"impressions", "clicks"}


async def test_inner_join_within_window() -> None:
    app, calls = ad_app()
    async with TestDriver(app) as driver:
        await driver.put("impressions", key="a1", value="imp-a1", timestamp_ms=0)
        await driver.put("clicks", key="a1", value="click-a1", timestamp_ms=5 * MIN)
        await driver.put("clicks", key="a2", value="orphan", timestamp_ms=5 * MIN)
        await driver.put("impressions", key="a3", value="imp-a3", timestamp_ms=6 * MIN)
        await driver.put("clicks", key="a3", value="too-late", timestamp_ms=17 * MIN)
        await driver.drain()
        out = driver.records("attributed")
    assert [(e.key, e.value) for e in out] == [("a1", {"imp": "imp-a1", "click": "click-a1"})]
    assert calls == [("a1", "imp-a1", "click-a1")]


async def test_left_join_emits_unmatched_impressions_when_the_window_closes() -> None:
    app, _ = ad_app(how="left")
    async with TestDriver(app) as driver:
        await driver.put("impressions", key="lonely", value="imp", timestamp_ms=0)
        await driver.drain()
        assert driver.records("attributed") == []  # window still open
        # stream time passes window + grace on that partition (same key => same partition)
        await driver.put("impressions", key="lonely", value="imp2", timestamp_ms=11 * MIN)
        await driver.drain()
        values = [e.value for e in driver.records("attributed")]
    assert {"imp": "imp", "click": None} in values


def test_mismatched_declared_partitions_are_rejected_with_advice() -> None:
    app = streamjoin.App("joins-unit")
    a = app.topic("a", partitions=4)
    b = app.topic("b", partitions=6)

    with pytest.raises(CopartitioningError, match="partition counts differ"):

        @app.join(a, b, window=1000)
        def j(key: Any, left: Any, right: Any) -> Any:
            return None


async def test_group_by_repartitions_into_a_copartitioned_topic() -> None:
    app = streamjoin.App("joins-unit")
    orders = app.topic("orders", key_serializer="str", partitions=3)
    payments = app.topic("payments", key_serializer="str", partitions=4)
    by_order = app.group_by(
        payments, lambda e: e.value["order"], name="payments-by-order", partitions=3
    )
    matched: list[Any] = []

    @app.join(orders, by_order, window=timedelta(hours=1))
    def pay(key: Any, order: Any, payment: Any) -> Any:
        matched.append((key, order["amount"], payment["amount"]))
        return None

    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value={"amount": 10}, timestamp_ms=1000)
        await driver.put(
            "payments", key="pay-9", value={"order": "o1", "amount": 10}, timestamp_ms=2000
        )
        await driver.drain()
        await driver.drain()
    assert matched == [("o1", 10, 10)]


async def test_stream_table_join_enriches_events() -> None:
    app = streamjoin.App("joins-unit")
    ads = app.topic("ads", key_serializer="str", partitions=2)
    views = app.topic("views", key_serializer="str", partitions=2)
    out = app.topic("enriched", key_serializer="str", partitions=2)
    ads_table = app.topic_table(ads)

    @app.join(views, ads_table, how="left", output=out)
    def enrich(key: Any, view: Any, ad: Any) -> Any:
        return {"view": view, "ad": ad}

    async with TestDriver(app) as driver:
        await driver.put("ads", key="ad1", value={"title": "shoes"})
        await driver.drain()
        await driver.put("views", key="ad1", value=1)
        await driver.put("views", key="ad2", value=2)
        await driver.drain()
        got = {e.key: e.value for e in driver.records("enriched")}
    assert got == {"ad1": {"view": 1, "ad": {"title": "shoes"}}, "ad2": {"view": 2, "ad": None}}


async def test_table_table_join_tracks_both_sides() -> None:
    app = streamjoin.App("joins-unit")
    users = app.topic("users", key_serializer="str", partitions=2)
    prefs = app.topic("prefs", key_serializer="str", partitions=2)
    out = app.topic("profiles", key_serializer="str", partitions=2)
    users_t = app.topic_table(users)
    prefs_t = app.topic_table(prefs)

    @app.join(users_t, prefs_t, how="inner", output=out, name="profiles")
    def profile(key: Any, user: Any, pref: Any) -> Any:
        return {**user, **pref}

    async with TestDriver(app) as driver:
        await driver.put("users", key="u1", value={"name": "ann"})
        await driver.drain()
        assert driver.records("profiles") == []
        await driver.put("prefs", key="u1", value={"lang": "fi"})
        await driver.drain()
        await driver.put("prefs", key="u1", value=None)  # tombstone: the join row disappears
        await driver.drain()
        values = [e.value for e in driver.records("profiles")]
    assert values == [{"name": "ann", "lang": "fi"}, None]


def test_stream_stream_join_needs_a_window() -> None:
    app = streamjoin.App("joins-unit")
    a = app.topic("a", partitions=1)
    b = app.topic("b", partitions=1)
    with pytest.raises(ValueError, match="needs window"):

        @app.join(a, b)
        def j(key: Any, left: Any, right: Any) -> Any:
            return None


def _enrich_app(**partitions: int) -> tuple[streamjoin.App, Any]:
    """A stream-table join whose topics give no partition count unless told."""
    app = streamjoin.App("joins-unit", topic_partitions=3)
    ads = app.topic("ads", key_serializer="str", partitions=partitions.get("ads"))
    views = app.topic("views", key_serializer="str", partitions=partitions.get("views"))
    out = app.topic("enriched", key_serializer="str")
    ads_table = app.topic_table(ads)

    @app.join(views, ads_table, how="left", output=out)
    def enrich(key: Any, view: Any, ad: Any) -> Any:
        return {"view": view, "ad": ad}

    return app, ads_table


async def test_a_stream_table_join_without_partition_counts_uses_the_app_default() -> None:
    app, ads_table = _enrich_app()  # used to raise TableAccessError here
    async with TestDriver(app) as driver:
        counts = dict(app.runtime_link.partitions)  # settled at start, declarations untouched
        assert counts["ads"] == counts["views"] == ads_table.partitions == 3, counts
        assert app.topics["ads"].partitions is None
        keys = [f"ad{i}" for i in range(12)]
        for key in keys:
            await driver.put("ads", key=key, value={"title": key.upper()})
        await driver.drain()
        for key in keys:
            await driver.put("views", key=key, value=1)
        await driver.drain()
        got = {e.key: e.value for e in driver.records("enriched")}
    assert got == {k: {"view": 1, "ad": {"title": k.upper()}} for k in keys}


def test_a_stream_table_join_takes_the_one_count_given() -> None:
    for given in ({"views": 5}, {"ads": 5}):
        app, ads_table = _enrich_app(**given)
        counts = app.topology().resolve_partitions({}, app.config.topic_partitions)
        assert counts["views"] == counts["ads"] == 5, given
        app.runtime_link.settle_partitions(counts)
        assert ads_table.partitions == 5


def test_a_table_table_join_without_partition_counts_declares() -> None:
    app = streamjoin.App("joins-unit", topic_partitions=3)
    users = app.topic_table(app.topic("users", key_serializer="str"))
    prefs = app.topic_table(app.topic("prefs", key_serializer="str"))

    @app.join(users, prefs, how="left")
    def merge(key: Any, user: Any, pref: Any) -> Any:
        return {"user": user, "pref": pref}

    counts = app.topology().resolve_partitions({}, app.config.topic_partitions)
    assert set(counts.values()) == {3}
    assert all(t.partitions is None for t in app.topics.values())  # declarations unchanged


def test_a_stream_table_join_is_read_by_the_tables_agent_in_timestamp_order() -> None:
    """The table's topic and the stream are one aligned group of ONE agent (the table's), its
    topic first on equal timestamps: each event sees its key's row as of its timestamp."""
    app, _ = _enrich_app()
    assert set(app.agents) == {"ads-table.materialize"}  # no separate agent for the stream
    agent = app.agents["ads-table.materialize"]
    assert {t.name for t in agent.topics} == {"ads", "views"}
    topology = app.topology()
    assert topology.aligned_groups() == [("ads", "views")]
    assert topology.ties_first() == {"ads"}


def test_a_join_with_a_table_written_by_an_agent_keeps_its_own_agent() -> None:
    app = streamjoin.App("joins-unit")
    views = app.topic("views", key_serializer="str", partitions=2)
    counts = app.table("counts", default=int, copartitioned_with=views)

    @app.join(views, counts, how="left")
    def enrich(key: Any, view: Any, count: Any) -> Any:
        return None

    assert set(app.agents) == {"enrich.stream"}
    assert app.topology().aligned_groups() == []


async def test_two_stream_table_joins_of_one_table_share_its_agent() -> None:
    app = streamjoin.App("joins-unit")
    ads = app.topic("ads", key_serializer="str", partitions=2)
    views = app.topic("views", key_serializer="str", partitions=2)
    clicks = app.topic("clicks", key_serializer="str", partitions=2)
    out = app.topic("enriched", key_serializer="str", partitions=2)
    ads_table = app.topic_table(ads)

    @app.join(views, ads_table, how="left", output=out)
    def enrich_views(key: Any, view: Any, ad: Any) -> Any:
        return {"view": view, "ad": ad}

    @app.join(clicks, ads_table, how="inner", output=out)
    def enrich_clicks(key: Any, click: Any, ad: Any) -> Any:
        return {"click": click, "ad": ad}

    assert set(app.agents) == {"ads-table.materialize"}
    assert app.topology().aligned_groups() == [("ads", "clicks", "views")]
    async with TestDriver(app) as driver:
        await driver.put("views", key="ad1", value=1, timestamp_ms=5)
        await driver.put("ads", key="ad1", value="shoes", timestamp_ms=10)
        await driver.put("clicks", key="ad1", value=2, timestamp_ms=20)
        await driver.put("views", key="ad1", value=3, timestamp_ms=30)
        await driver.drain()
        got = [e.value for e in driver.records("enriched")]
    assert got == [{"view": 1, "ad": None}, {"click": 2, "ad": "shoes"}, {"view": 3, "ad": "shoes"}]


def test_joins_of_one_table_with_different_error_policies_are_refused() -> None:
    app, ads_table = _enrich_app()
    with pytest.raises(ConfigurationError, match="same table 'ads-table' have on_error='stop'"):

        @app.join(app.topic("clicks", key_serializer="str"), ads_table, on_error="skip")
        def other(key: Any, click: Any, ad: Any) -> Any:
            return None


def test_one_stream_joined_with_two_tables_is_one_aligned_group() -> None:
    app, _ = _enrich_app()
    users_table = app.topic_table(app.topic("users", key_serializer="str"))

    @app.join(app.topics["views"], users_table, how="left")
    def with_user(key: Any, view: Any, user: Any) -> Any:
        return None

    topology = app.topology()
    assert topology.aligned_groups() == [("ads", "users", "views")]
    assert topology.ties_first() == {"ads", "users"}


async def test_a_table_in_a_stream_table_and_a_table_table_join_updates_both() -> None:
    """The table's agent, which now also enriches the stream, still calls the table's update
    listeners (the table-table join's)."""
    app = streamjoin.App("joins-unit")
    users = app.topic("users", key_serializer="str", partitions=2)
    prefs = app.topic("prefs", key_serializer="str", partitions=2)
    clicks = app.topic("clicks", key_serializer="str", partitions=2)
    profiles = app.topic("profiles", key_serializer="str", partitions=2)
    enriched = app.topic("enriched", key_serializer="str", partitions=2)
    users_t = app.topic_table(users)
    prefs_t = app.topic_table(prefs)

    @app.join(users_t, prefs_t, how="inner", output=profiles, name="profiles")
    def profile(key: Any, user: Any, pref: Any) -> Any:
        return {**user, **pref}

    @app.join(clicks, users_t, how="left", output=enriched)
    def click_user(key: Any, click: Any, user: Any) -> Any:
        return {"click": click, "user": user}

    async with TestDriver(app) as driver:
        await driver.put("prefs", key="u1", value={"lang": "fi"}, timestamp_ms=1)
        await driver.put("users", key="u1", value={"name": "ann"}, timestamp_ms=2)
        await driver.put("clicks", key="u1", value=7, timestamp_ms=3)
        await driver.drain()
        assert [e.value for e in driver.records("profiles")] == [{"name": "ann", "lang": "fi"}]
        assert [e.value for e in driver.records("enriched")] == [
            {"click": 7, "user": {"name": "ann"}}
        ]


# ---------------------------------------------------------------- join functions that await


def _sends_now_every_other(driver: TestDriver) -> list[str]:
    """Make the driver take every other output record at once (as a worker's producer does
    while a batch has room) and decline the others (then sent the long way, awaited): a
    join must emit in order across both paths. Returns the topics taken at once."""
    taken: list[str] = []
    calls = 0

    def send_now(record: OutgoingRecord) -> Any:
        topic, key, value, partition, _, timestamp_ms = record
        nonlocal calls
        calls += 1
        if topic not in ("attributed", "enriched") or calls % 2 == 0:
            return None
        assert partition is not None and timestamp_ms is not None
        log = driver._logs.setdefault(topic, {}).setdefault(partition, [])
        log.append(RawRecord(topic, partition, len(log), timestamp_ms, key, value))
        taken.append(topic)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    driver.send_now = send_now  # type: ignore[method-assign]
    return taken


async def _one_click_after_impressions(driver: TestDriver, impressions: int) -> list[Any]:
    """Put ``impressions`` impressions of key "a", then one click matching them all; the
    values joined to "attributed", in order."""
    for i in range(impressions):
        await driver.put("impressions", key="a", value=f"imp{i}", timestamp_ms=i)
    await driver.put("clicks", key="a", value="click", timestamp_ms=5)
    await driver.drain()
    return [e.value for e in driver.records("attributed")]


@pytest.mark.parametrize("kind", ["async def", "returns an awaitable"])
async def test_a_stream_stream_join_awaits_its_function_and_keeps_the_order(kind: str) -> None:
    app = streamjoin.App("joins-unit")
    impressions = app.topic("impressions", key_serializer="str", partitions=1)
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    out = app.topic("attributed", key_serializer="str", partitions=1)

    async def pair(key: Any, impression: Any, click: Any) -> Any:
        await asyncio.sleep(0)
        return [impression, click]

    if kind == "async def":
        app.join(impressions, clicks, window=timedelta(minutes=10), output=out)(pair)
    else:

        def pair_later(key: Any, impression: Any, click: Any) -> Any:
            return pair(key, impression, click)

        app.join(impressions, clicks, window=timedelta(minutes=10), output=out)(pair_later)
    async with TestDriver(app) as driver:
        taken = _sends_now_every_other(driver)
        got = await _one_click_after_impressions(driver, 3)
    assert got == [[f"imp{i}", "click"] for i in range(3)]
    assert taken == ["attributed"] * 2  # the first and third at once, the second awaited


async def test_a_stream_stream_join_emits_in_order_when_a_send_must_wait() -> None:
    """One click matching four impressions: the first result joins the open batch at once,
    the second must wait (the rest of the event's results follow it, in order)."""
    app, calls = ad_app()
    async with TestDriver(app) as driver:
        taken = _sends_now_every_other(driver)
        got = [value["imp"] for value in await _one_click_after_impressions(driver, 4)]
    assert got == [f"imp{i}" for i in range(4)]
    assert len(calls) == 4
    assert taken == ["attributed"] * 2  # the first and third at once, the others awaited


async def test_a_stream_table_join_awaits_an_async_function() -> None:
    app = streamjoin.App("joins-unit")
    ads = app.topic("ads", key_serializer="str", partitions=1)
    views = app.topic("views", key_serializer="str", partitions=1)
    out = app.topic("enriched", key_serializer="str", partitions=1)

    @app.join(views, app.topic_table(ads), how="left", output=out)
    async def enrich(key: Any, view: Any, ad: Any) -> Any:
        await asyncio.sleep(0)
        return {"view": view, "ad": ad}

    async with TestDriver(app) as driver:
        taken = _sends_now_every_other(driver)
        await driver.put("ads", key="ad1", value="shoes", timestamp_ms=1)
        for i in range(3):
            await driver.put("views", key="ad1", value=i, timestamp_ms=2 + i)
        await driver.drain()
        got = [e.value for e in driver.records("enriched")]
    assert got == [{"view": i, "ad": "shoes"} for i in range(3)]
    assert taken == ["enriched"] * 2


async def test_a_stream_table_join_sends_at_once_or_the_long_way_in_order() -> None:
    app, _ = _enrich_app(ads=1, views=1)
    app.topics["enriched"].partitions = 1
    async with TestDriver(app) as driver:
        taken = _sends_now_every_other(driver)
        await driver.put("ads", key="ad1", value="shoes", timestamp_ms=1)
        for i in range(5):
            await driver.put("views", key="ad1", value=i, timestamp_ms=2 + i)
        await driver.drain()
        got = [e.value["view"] for e in driver.records("enriched")]
    assert got == list(range(5))
    assert taken == ["enriched"] * 3


async def test_a_joins_run_state_lives_in_its_tasks_and_its_counters_on_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each task keeps its part of the join (the core, and the summary of its late
    events); the worker keeps the join's counters across tasks."""
    app, _ = ad_app()
    caplog.set_level("WARNING", logger="streamjoin.joins")
    async with TestDriver(app) as driver:
        await driver.put("impressions", key="k", value="imp", timestamp_ms=20 * MIN)
        for late in range(3):  # closed long ago (window 10 min, grace 30 s): dropped
            await driver.put("clicks", key="k", value="late", timestamp_ms=late)
        await driver.drain()
        assert driver.tasks is not None
        (task,) = [t for t in driver.tasks.live() if t.joins]
        part = task.joins["attribute"]
        assert part.core.view is task.tables["attribute-buffer"]
        assert part.core.stats.late == 3
        assert driver.runtime is not None
        counters = driver.runtime.join_stats["attribute"]
        assert counters.late == 3
        # the first late event is logged at once, the others are counted for the summary
        assert len([r for r in caplog.records if "late and dropped" in r.message]) == 1
        tps = [(topic, task.partition) for topic in ("impressions", "clicks")]
        await driver.revoke(tps)
        assert task.joins == {}  # gone with the task
        assert driver.runtime.join_stats["attribute"] is counters  # kept by the worker
        assert counters.late == 3
