"""The Faust example apps ported to streamjoin (examples/from_faust/), run through the
in-memory TestDriver as a Faust user would test them, each checked against a simple model
computed from the records it was given."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest

import streamjoin
from examples.from_faust import crontab, hopping, windowed_aggregation, withdrawals, word_count
from streamjoin.aggregations import Count, Mean
from streamjoin.errors import TableAccessError
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.windows import HoppingWindows, SessionWindows, SlidingWindows, TumblingWindows
from streamjoin.testing.driver import TestDriver
from streamjoin.timers import Crontab

BASE_MS = 1_700_000_000_000  # a whole multiple of 10 s
HOUR_MS = 3_600_000


async def _until(condition: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not callable(condition) or not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition never held")
        await asyncio.sleep(0.001)


# -- word count: @app.task producing posts, agents chained through a keyed topic


async def test_word_count_counts_the_sender_tasks_posts_and_any_other_post(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(word_count, "POSTS_PER_WORD", 3)
    monkeypatch.setattr(word_count, "TALLY_AFTER_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger=word_count.__name__)
    extra = ["the quick fox", "fox jumps over the lazy dog"]
    async with TestDriver(word_count.app) as driver:
        for post in extra:
            await driver.put(word_count.posts_topic.name, value=post)
        posts = word_count.posts_topic.name
        await _until(lambda: len(driver.records(posts)) == len(extra) + 3 * 4)
        await driver.drain()
        await _until(lambda: "TALLY" in caplog.text)
        model = Counter(w for w in word_count.WORDS for _ in range(3))
        model.update(w for post in extra for w in post.split())
        assert {w: word_count.word_counts[w] for w in model} == dict(model)
        assert word_count.tally() == dict(sorted(model.items()))
        words = driver.records(word_count.count_words.topic.name)
        assert Counter(e.key for e in words) == model  # keyed by word: one partition each


# -- withdrawals: hourly and 10-second tumbling tables, one re-keyed through group_by


def _withdrawal(user: str, country: str, amount: float) -> withdrawals.Withdrawal:
    return withdrawals.Withdrawal(user, country, amount, datetime.now(UTC))


#: 200 withdrawals over 81 minutes, in time order, each user's two by two 20 s apart, with
#: 15 minutes of silence in the middle: 2 hourly windows, ~500 ten-second ones, 2 bursts
WITHDRAWALS = [
    (
        BASE_MS + i * 20_000 + (15 * 60_000 if i >= 100 else 0),
        ["ann", "bob", "cid"][i // 2 % 3],
        ["country_0", "country_1"][i % 7 % 2],
        float(i % 13),
    )
    for i in range(200)
]


async def _run_withdrawals(driver: TestDriver) -> dict[int, int]:
    """Put every withdrawal (keyed by user); the stream time of each source partition."""
    for ts, user, country, amount in WITHDRAWALS:
        await driver.put(
            withdrawals.withdrawals_topic.name,
            key=user,
            value=_withdrawal(user, country, amount),
            timestamp_ms=ts,
        )
    await driver.drain()
    stream_time: dict[int, int] = defaultdict(int)
    for record in driver.raw_records(withdrawals.withdrawals_topic.name):
        stream_time[record.partition] = max(stream_time[record.partition], record.timestamp)
    return stream_time


async def test_withdrawals_sums_per_user_hour_and_per_country_ten_seconds() -> None:
    assert BASE_MS % 10_000 == 0
    sent = WITHDRAWALS
    users = sorted({user for _, user, _, _ in sent})
    countries = sorted({country for _, _, country, _ in sent})
    async with TestDriver(withdrawals.app) as driver:
        await _run_withdrawals(driver)

        per_user_hour: dict[tuple[str, int], float] = defaultdict(float)
        per_country_window: dict[tuple[str, int], float] = defaultdict(float)
        for ts, user, country, amount in sent:
            per_user_hour[(user, ts - ts % HOUR_MS)] += amount
            per_country_window[(country, ts - ts % 10_000)] += amount
        for user in users:
            got = dict(withdrawals.user_to_total.windows_of(user, 0, BASE_MS + 10 * HOUR_MS))
            want = {start: v for (u, start), v in per_user_hour.items() if u == user}
            assert got == pytest.approx(want)

        # the 10-second windows are deleted 5 s after they end, by their partition's time
        repartitioned = driver.raw_records(withdrawals.by_country.name)
        stream_time: dict[int, int] = defaultdict(int)
        for record in repartitioned:
            stream_time[record.partition] = max(stream_time[record.partition], record.timestamp)
        for country in countries:
            p = partition_for_key(country.encode(), withdrawals.PARTITIONS)
            kept = {
                start: v
                for (c, start), v in per_country_window.items()
                if c == country and stream_time[p] < start + 10_000 + 5_000
            }
            got = dict(withdrawals.country_to_total.windows_of(country, 0, BASE_MS + 10 * HOUR_MS))
            assert kept and got == pytest.approx(kept)
        assert withdrawals.country_to_total.emission_stats().late == 0


async def test_withdrawal_bursts_and_sliding_minutes_match_a_brute_force_model() -> None:
    gap, sliding = 10 * 60_000, SlidingWindows(timedelta(minutes=1))
    async with TestDriver(withdrawals.app) as driver:
        stream_time = await _run_withdrawals(driver)
        finals = driver.records(withdrawals.bursts_topic.name)
        users = sorted({user for _, user, _, _ in WITHDRAWALS})
        tables = {
            user: (
                withdrawals.user_bursts.windows_with_ends(user, 0, 2**62),
                withdrawals.user_per_minute.windows_with_ends(user, 0, 2**62),
            )
            for user in users
        }
    closed, still_open = [], {}
    for user in users:
        mine = [(ts, amount) for ts, u, _, amount in WITHDRAWALS if u == user]
        now = stream_time[partition_for_key(user.encode(), withdrawals.PARTITIONS)]
        sessions: list[list[tuple[int, float]]] = []
        for ts, amount in mine:  # (in time order)
            if sessions and ts - sessions[-1][-1][0] <= gap:
                sessions[-1].append((ts, amount))
            else:
                sessions.append([(ts, amount)])
        for session in sessions:
            start, end = session[0][0], session[-1][0] + 1
            result = {"withdrawals": len(session), "total": sum(a for _, a in session)}
            if now >= end + gap:
                closed.append((user, start, end, result))
            else:
                still_open[user] = [(start, end, result)]
        bursts, minutes = tables[user]
        assert bursts == still_open.get(user, [])
        # every sliding window kept holds the sum of the user's withdrawals in it ...
        assert minutes
        for start, end, total in minutes:
            assert total == sum(a for ts, a in mine if start <= ts < end)
        # ... and the window ending at each withdrawal is kept until its retention
        kept = {(start, end) for start, end, _ in minutes}
        for ts, _ in mine:
            end = ts + 1
            if now < end + (sliding.retention_ms or 0):
                assert (max(end - sliding.size_ms, 0), end) in kept
    assert len(closed) == 3 and len(still_open) == 3  # (the silence split each user's)
    sent = [(e.key, e.value["start"], e.value["end"], e.value["value"]) for e in finals]
    assert sorted(sent, key=str) == sorted(closed, key=str)  # each closed burst once


# -- windowed aggregation: app.aggregate, emit="close", on_window_close, @app.timer


async def test_windowed_aggregation_sends_one_final_count_and_mean_per_closed_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=windowed_aggregation.__name__)
    size = int(windowed_aggregation.WINDOW.total_seconds() * 1000)
    # readings 0.7 s apart over 3.5 windows (event time: their date), then one far later
    dates = [BASE_MS + i * 700 for i in range(int(3.5 * size / 700))]
    values = [round((i * 37 % 100) / 100, 2) for i in range(len(dates))]
    last = BASE_MS + 10 * size
    async with TestDriver(windowed_aggregation.app) as driver:
        for date_ms, value in [*zip(dates, values, strict=True), (last, 0.5)]:
            date = datetime.fromtimestamp(date_ms / 1000, UTC)
            await driver.put(
                windowed_aggregation.source.name,
                key=windowed_aggregation.KEY,
                value=windowed_aggregation.RawModel(date=date, value=value),
                timestamp_ms=BASE_MS,  # the record time is not what windows them: the date is
            )
        await driver.drain()
        finals = driver.records(windowed_aggregation.sink.name)

    by_window: dict[int, list[float]] = defaultdict(list)
    for date_ms, value in zip(dates, values, strict=True):
        by_window[date_ms - date_ms % size].append(value)
    assert [e.value["start"] for e in finals] == sorted(by_window)  # once each, in order
    for event in finals:
        start, result = event.value["start"], event.value["value"]
        window_values = by_window[start]
        assert event.key == windowed_aggregation.KEY
        assert event.value["end"] == start + size
        assert result["count"] == len(window_values)
        assert result["mean"] == pytest.approx(sum(window_values) / len(window_values))
    # the callback (Faust's on_window_close_callback) saw each of them too
    logged = [r for r in caplog.records if r.getMessage().startswith("processing window")]
    assert [r.args[2] for r in logged] == sorted(by_window)  # type: ignore[index]


async def test_windowed_aggregation_timer_produces_one_reading_per_tick() -> None:
    name = "examples.from_faust.windowed_aggregation.produce"
    async with TestDriver(windowed_aggregation.app) as driver:
        assert await driver.run_timers() == [name]
        assert await driver.run_timers(name) == [name]
        readings = driver.records(windowed_aggregation.source.name)
        assert [e.key for e in readings] == [windowed_aggregation.KEY] * 2
        assert all(0 <= e.value.value < 1 for e in readings)


# -- hopping: a hopping table read through relative_to_stream (now/current/value/delta)


async def test_hopping_views_read_the_windows_a_model_gives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=hopping.__name__)
    spec = HoppingWindows(size_ms=10_000, step_ms=5_000)
    times = [BASE_MS + 2_000 * i for i in range(40)]  # a reading every 2 s, for 80 s
    async with TestDriver(hopping.app) as driver:
        for ts in times:
            await driver.put(
                hopping.hopping_topic.name, key="counter", value=hopping.Model(0.5), timestamp_ms=ts
            )
        await driver.drain()
    reads = [r.args for r in caplog.records if r.getMessage().startswith("now()")]
    assert len(reads) == len(times)

    def count(start: int, upto: int) -> int:
        return sum(1 for t in times[: upto + 1] if start <= t < start + spec.size_ms)

    for i, ts in enumerate(times):
        starts = [s for s, _ in spec.windows_for(ts)]
        earlier = [s for s, _ in spec.windows_for(ts - 30_000)]
        want = (
            count(min(starts), i),  # now(): the earliest window holding the stream time
            count(max(starts), i),  # current(): the latest-starting window of the event
            count(max(starts), i),  # value(): relative to the stream, the same
            count(max(earlier), i),  # delta(30): the window of 30 s before the event
        )
        assert reads[i] == want, (i, ts - BASE_MS)
    assert {r[3] for r in reads[20:]} == {5}  # Faust's comment: delta(30) settles at 5


async def test_hopping_timer_publishes_on_the_leader_only() -> None:
    name = "examples.from_faust.hopping.publish_every_2secs"
    async with TestDriver(hopping.app) as driver:
        assert await driver.run_timers(name) == [name]
        driver.leader = False
        assert await driver.run_timers(name) == []
        await driver.drain()
        assert len(driver.records(hopping.hopping_topic.name)) == 1
        windows = hopping.hopping_table.windows_of("counter", 0, 2**62)
        assert sorted(v for _, v in windows) == [1, 1]  # the reading's two hopping windows


# -- Faust's views on a declared aggregation (found porting: they showed the stored state)


async def test_views_on_an_aggregation_read_its_results_not_its_states() -> None:
    app = streamjoin.App("views-on-aggregates")
    readings = app.topic("readings", key_serializer="str", value_serializer="json")
    means = app.aggregate(
        readings, name="means", window=TumblingWindows(size_ms=10_000), agg=Mean("value")
    )
    read: list[tuple[object, object]] = []

    @app.agent(readings, name="reader")
    async def reader(stream: Stream) -> None:
        async for event in stream:
            windows = means.relative_to_stream()[event.key]
            read.append((windows.value(), windows.current()))

    async with TestDriver(app) as driver:
        for i, value in enumerate([1.0, 2.0, 6.0]):
            await driver.put("readings", key="k", value={"value": value}, timestamp_ms=BASE_MS + i)
            await driver.drain()  # (the aggregation and the reader in step)
        outside = means.relative_to_stream()["k"].value(driver.records("readings")[-1])
    assert read == [(1.0, 1.0), (1.5, 1.5), (3.0, 3.0)]
    assert outside == 3.0


async def test_views_on_session_and_sliding_aggregations_are_refused_by_name() -> None:
    app = streamjoin.App("views-on-dynamic-aggregates")
    readings = app.topic("readings", key_serializer="str", value_serializer="json")
    for window in (SessionWindows(gap_ms=1_000), SlidingWindows(difference_ms=1_000)):
        table = app.aggregate(readings, name=type(window).__name__, window=window, agg=Count())
        kind = type(window).__name__
        with pytest.raises(TableAccessError, match=f"{kind}.*windows_with_ends"):
            table.relative_to_stream()


# -- crontab (tz_aware): @app.crontab with a timezone, on the leader


async def test_crontab_port_is_due_at_20_16_pacific_and_publishes_on_the_leader(
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = "examples.from_faust.crontab.publish_at_8_20_pm_pacific"
    schedule = crontab.app.timers[name].schedule
    assert isinstance(schedule, Crontab)
    for after, due in [
        (datetime(2026, 7, 1, 12, tzinfo=UTC), datetime(2026, 7, 2, 3, 16, tzinfo=UTC)),  # PDT
        (datetime(2026, 1, 1, 12, tzinfo=UTC), datetime(2026, 1, 2, 4, 16, tzinfo=UTC)),  # PST
    ]:
        assert schedule.next_fire(after.timestamp()) == due.timestamp()
    caplog.set_level(logging.INFO, logger=crontab.__name__)
    async with TestDriver(crontab.app) as driver:
        driver.leader = False
        assert await driver.run_timers() == []
        driver.leader = True
        assert await driver.run_timers() == [name]
        await driver.drain()
        assert len(driver.records(crontab.tz_aware_topic.name)) == 1
    assert sum(r.getMessage().startswith("record: Model(") for r in caplog.records) == 1


# -- page views: group_by a record field, counted in a table


async def test_page_views_counts_each_pages_views_after_the_regrouping() -> None:
    from examples.from_faust import page_views

    views = [page_views.PageView(id=f"p{i % 3}", user=f"u{i % 7}") for i in range(40)]
    async with TestDriver(page_views.app) as driver:
        for view in views:
            await driver.put(page_views.page_view_topic.name, key=view.user, value=view)
        await driver.drain()
        model = Counter(view.id for view in views)
        assert {page: page_views.page_views[page] for page in model} == dict(model)
        regrouped = driver.records(page_views.by_page.name)
        assert sorted(r.key for r in regrouped) == sorted(view.id for view in views)
