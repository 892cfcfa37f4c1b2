"""A stream-table join walking a run of a batch's events itself (``TableEnricher.enrich_run``):
each event is the current one while it is joined, an error is its event's alone, and the
rows read are those of the table partition at that event's place in the timestamp order.

The join function holds its first event until every record is put, so that the join's
agent takes the rest in batches of many events (runs of one stream between the table's
rows)."""

from __future__ import annotations

import asyncio
from typing import Any

import streamjoin
from streamjoin.context import current_record
from streamjoin.events import Event
from streamjoin.testing.driver import TestDriver

VIEWS = 240
ADS = 12


def _app(
    how: str = "left", on_error: str = "stop"
) -> tuple[streamjoin.App, list[Any], asyncio.Event]:
    app = streamjoin.App("enrich-runs")
    gate = asyncio.Event()
    ads = app.topic("ads", key_serializer="str", partitions=1)
    views = app.topic("views", key_serializer="str", partitions=1)
    out = app.topic("enriched", key_serializer="str", partitions=1)
    seen: list[Any] = []

    @app.join(views, app.topic_table(ads), how=how, output=out, on_error=on_error)  # type: ignore[arg-type]
    def enrich(key: Any, view: Any, ad: Any) -> Any:
        record = current_record()
        assert record is not None
        seen.append((key, view, record.topic, record.key, record.value))
        if on_error == "skip" and view % 7 == 3:
            raise ValueError(f"view {view} refused")
        if len(seen) == 1:
            return _after(gate, {"view": view, "ad": ad})  # (an awaitable result)
        return {"view": view, "ad": ad}

    return app, seen, gate


async def _after(gate: asyncio.Event, result: Any) -> Any:
    await gate.wait()
    return result


async def _put_views(driver: TestDriver, first_ts: int, gate: asyncio.Event) -> None:
    for i in range(VIEWS):
        await driver.put("views", key=f"ad{i % (ADS + 3)}", value=i, timestamp_ms=first_ts + i)
    gate.set()


async def _rows_then_views(app: streamjoin.App, gate: asyncio.Event) -> list[Event]:
    """The join's output after the table's rows, then the views, each processed."""
    async with TestDriver(app) as driver:
        for i in range(ADS):
            await driver.put("ads", key=f"ad{i}", value=f"title{i}", timestamp_ms=i)
        await driver.drain()
        await _put_views(driver, 1_000, gate)
        await driver.drain()
        return driver.records("enriched")


async def test_each_event_of_a_run_is_the_current_one_while_it_is_joined() -> None:
    app, seen, gate = _app()
    enriched = await _rows_then_views(app, gate)
    got = {e.value["view"]: (e.key, e.value["ad"]) for e in enriched}
    assert len(enriched) == VIEWS
    # the record current_record() gave is the event's own (its key and value bytes)
    assert [(k, rk.decode(), int(rv)) for k, _, _, rk, rv in seen] == [
        (k, k, v) for k, v, *_ in seen
    ]
    assert {topic for _, _, topic, _, _ in seen} == {"views"}
    assert sorted(v for _, v, *_ in seen) == list(range(VIEWS))
    want = {
        i: (f"ad{i % (ADS + 3)}", f"title{i % (ADS + 3)}" if i % (ADS + 3) < ADS else None)
        for i in range(VIEWS)
    }
    assert got == want


async def test_a_failing_event_in_a_run_gets_the_policy_alone() -> None:
    app, seen, gate = _app(on_error="skip")
    async with TestDriver(app) as driver:
        for i in range(ADS):
            await driver.put("ads", key=f"ad{i}", value=f"title{i}", timestamp_ms=i)
        await _put_views(driver, 1_000, gate)
        await driver.drain()
        sent = [e.value["view"] for e in driver.records("enriched")]
    assert sent == [i for i in range(VIEWS) if i % 7 != 3]  # each once, in order, none lost
    # every event was joined once: the events after a failing one were handed out again,
    # not joined twice
    assert sorted(v for _, v, *_ in seen) == list(range(VIEWS))


async def test_rows_between_the_events_of_a_batch_are_seen_in_timestamp_order() -> None:
    app, _, gate = _app()
    async with TestDriver(app) as driver:
        # four keys' rows rewritten every 10 ms of event time, put in timestamp order
        # with the views between them
        for ts in range(VIEWS + 5):
            if ts % 10 == 0:
                for k in range(4):
                    await driver.put("ads", key=f"ad{k}", value=f"v{ts}", timestamp_ms=ts)
            if ts >= 5:
                i = ts - 5
                await driver.put("views", key=f"ad{i % 4}", value=i, timestamp_ms=ts)
        gate.set()
        await driver.drain()
        got = {e.value["view"]: e.value["ad"] for e in driver.records("enriched")}
    # event i (at i + 5 ms) sees the row written at the last multiple of 10 at or before it
    assert got == {i: f"v{(i + 5) // 10 * 10}" for i in range(VIEWS)}


async def test_an_inner_join_sends_only_the_events_with_a_row() -> None:
    app, seen, gate = _app(how="inner")
    got = sorted(e.value["view"] for e in await _rows_then_views(app, gate))
    assert got == [i for i in range(VIEWS) if i % (ADS + 3) < ADS]
    assert len(seen) == len(got)  # the function is not called without a row
