"""Window kinds: units, grace, retention, and the sliding and session cores against
brute-force models that compute every window from every record at once.

Hypothesis prints the falsifying example and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.errors import ConfigurationError
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.sessions import SessionUpdate, session_for, sessions_of
from streamjoin.state.sliding import SlidingUpdate, slide, windows_of
from streamjoin.state.windows import (
    HoppingWindows,
    SessionWindows,
    SlidingWindows,
    TumblingWindows,
    Window,
)
from streamjoin.testing.driver import TestDriver

# ------------------------------------------------------------------ units


def test_durations_are_timedeltas_or_keyword_milliseconds() -> None:
    assert TumblingWindows(timedelta(minutes=1)) == TumblingWindows(size_ms=60_000)
    assert HoppingWindows(timedelta(minutes=5), timedelta(minutes=1)) == HoppingWindows(
        size_ms=300_000, step_ms=60_000
    )
    assert SlidingWindows(timedelta(seconds=2)).difference_ms == 2_000
    assert SessionWindows(timedelta(seconds=3), grace=timedelta(seconds=1)).grace_ms == 1_000
    mixed = HoppingWindows(timedelta(seconds=10), step_ms=5_000, grace=timedelta(seconds=1))
    assert (mixed.size_ms, mixed.step_ms, mixed.grace_ms) == (10_000, 5_000, 1_000)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TumblingWindows(3600),
        lambda: TumblingWindows(3600, 86400),  # Faust's tumbling(size, expires), in seconds
        lambda: HoppingWindows(300, 60),
        lambda: SlidingWindows(5.0),
        lambda: SessionWindows(30),
    ],
)
def test_bare_numbers_are_refused_naming_both_forms(make: Callable[[], Any]) -> None:
    with pytest.raises(ConfigurationError, match=r"bare number.*timedelta\(seconds=.*_ms="):
        make()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: TumblingWindows(timedelta(seconds=1), 86400), "extra positional"),
        (lambda: TumblingWindows(timedelta(seconds=1), size_ms=1000), "not both"),
        (lambda: TumblingWindows(size_ms=10, retention=None, retention_ms=5), "not both"),
        (lambda: TumblingWindows(timedelta(microseconds=1500)), "whole number of milli"),
        (lambda: TumblingWindows(size_ms=1.5), r"size_ms must be an int"),
        (lambda: TumblingWindows("1m"), "must be a datetime.timedelta"),
        (lambda: TumblingWindows(), r"needs size= .* or size_ms="),
        (lambda: HoppingWindows(size_ms=10), r"needs step="),
        (lambda: SessionWindows(gap_ms=0), r"gap_ms must be >= 1"),
        (lambda: SlidingWindows(difference_ms=10, grace_ms=-1), r"grace_ms must be >= 0"),
        (lambda: TumblingWindows(size_ms=10, grace_ms=5, retention_ms=4), r"retention_ms \(4\)"),
        (lambda: SessionWindows(gap_ms=10, grace_ms=5, retention_ms=14), r"gap_ms \+ grace_ms"),
    ],
)
def test_bad_definitions_name_the_problem(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_retention_defaults_to_size_plus_grace_and_may_be_shorter_than_the_window() -> None:
    assert TumblingWindows(size_ms=10, grace_ms=3).retention_ms == 13
    assert HoppingWindows(size_ms=10, step_ms=5, grace_ms=3).retention_ms == 13
    assert SlidingWindows(difference_ms=10, grace_ms=3).retention_ms == 14  # (size 11)
    assert SessionWindows(gap_ms=10, grace_ms=3).retention_ms == 13
    short = TumblingWindows(timedelta(hours=1), retention=timedelta(minutes=1))
    assert short.retention_ms == 60_000
    assert not short.expired(window_end_ms=3_600_000, stream_time_ms=3_659_999)
    assert short.expired(window_end_ms=3_600_000, stream_time_ms=3_660_000)


@pytest.mark.parametrize(
    "spec",
    [
        TumblingWindows(size_ms=10, retention=None),
        HoppingWindows(size_ms=10, step_ms=5, retention_ms=None),
        SlidingWindows(difference_ms=10, retention=None),
        SessionWindows(gap_ms=10, retention_ms=None),
    ],
)
def test_retention_none_never_expires(spec: Any) -> None:
    assert spec.retention_ms is None
    assert not spec.expired(window_end_ms=10, stream_time_ms=10**15)


def test_close_time_is_end_plus_grace_and_sessions_also_wait_their_gap() -> None:
    assert TumblingWindows(size_ms=10, grace_ms=4).close_time(20) == 24
    assert HoppingWindows(size_ms=10, step_ms=5, grace_ms=4).close_time(20) == 24
    assert SlidingWindows(difference_ms=10, grace_ms=4).close_time(20) == 24
    assert SessionWindows(gap_ms=7, grace_ms=4).close_time(20) == 31
    assert TumblingWindows(size_ms=10).close_time(20) == 20  # (grace defaults to 0)


def test_specs_are_values_that_pickle_and_replace() -> None:
    for spec in (
        TumblingWindows(size_ms=10, grace_ms=1),
        HoppingWindows(size_ms=10, step_ms=5, retention=None),
        SlidingWindows(difference_ms=10),
        SessionWindows(gap_ms=10, grace_ms=2),
    ):
        assert pickle.loads(pickle.dumps(spec)) == spec
        assert hash(spec) == hash(pickle.loads(pickle.dumps(spec)))
    assert dataclasses.replace(TumblingWindows(size_ms=10), grace_ms=2) == TumblingWindows(
        size_ms=10, grace_ms=2, retention_ms=10
    )
    assert repr(SessionWindows(gap_ms=5)) == "SessionWindows(gap_ms=5, grace_ms=0, retention_ms=5)"


# ------------------------------------------------------------------ brute-force models


def model_sliding(difference: int, timestamps: list[int]) -> dict[Window, list[int]]:
    """Every sliding window of the records, by definition: each record's left window, each
    record's right window when it holds a record; contents are the records in it."""
    starts = {max(0, t - difference) for t in timestamps}
    starts |= {t + 1 for t in timestamps if any(t < v <= t + 1 + difference for v in timestamps)}
    return {
        (s, s + difference + 1): sorted(v for v in timestamps if s <= v <= s + difference)
        for s in starts
    }


def model_sessions(gap: int, timestamps: list[int]) -> list[Window]:
    """Sessions by repeated merging of any two within ``gap`` of each other, until none is."""
    sessions = [(t, t) for t in timestamps]  # (first, last), inclusive
    merged = True
    while merged:
        merged = False
        for i in range(len(sessions)):
            for j in range(i + 1, len(sessions)):
                a, b = sessions[i], sessions[j]
                if b[0] - a[1] <= gap and a[0] - b[1] <= gap:  # no more than gap apart
                    sessions[i] = (min(a[0], b[0]), max(a[1], b[1]))
                    del sessions[j]
                    merged = True
                    break
            if merged:
                break
    return sorted((first, last + 1) for first, last in sessions)


def test_the_models_on_hand_made_cases() -> None:
    # Kafka Streams' docs: records at 8 and 10 (ms), difference 5: windows [3, 8] {8},
    # [5, 10] {8, 10}, [9, 14] {10}
    assert model_sliding(5, [8, 10]) == {(3, 9): [8], (5, 11): [8, 10], (9, 15): [10]}
    # early records share the window starting at 0
    assert model_sliding(10, [2, 5]) == {(0, 11): [2, 5], (3, 14): [5]}
    assert model_sessions(10, [0, 5, 20, 12, 40]) == [(0, 21), (40, 41)]
    assert model_sessions(10, [0, 11]) == [(0, 1), (11, 12)]  # 11 apart: two sessions
    assert model_sessions(10, [0, 10]) == [(0, 11)]  # exactly the gap: one


records_strategy = st.lists(
    st.tuples(st.sampled_from("ab"), st.integers(0, 80), st.integers(1, 9)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 20), st.lists(st.integers(0, 80), max_size=25))
def test_batch_windows_are_the_models(difference: int, timestamps: list[int]) -> None:
    spec = SlidingWindows(difference_ms=max(difference, 1))
    assert windows_of(spec, timestamps) == sorted(model_sliding(spec.difference_ms, timestamps))
    sessions = SessionWindows(gap_ms=max(difference, 1))
    assert sessions_of(sessions, timestamps) == model_sessions(sessions.gap_ms, timestamps)


# ------------------------------------------------------------------ sliding windows


def test_slide_on_a_hand_made_case() -> None:
    spec = SlidingWindows(difference_ms=10, grace_ms=20)
    update = slide(spec, [5, 12, 30], timestamp_ms=14, stream_time_ms=30)
    assert update == SlidingUpdate(created=((4, 15), (13, 24)), updated=((6, 17),), late=False)
    # grace 0: 14's left window (4, 15) closed at stream time 15
    late = slide(SlidingWindows(difference_ms=10), [5, 12, 30], 14, stream_time_ms=30)
    assert late.late
    assert not slide(SlidingWindows(difference_ms=10), [5], 14, stream_time_ms=14).late
    assert slide(SlidingWindows(difference_ms=10), [5], 14, stream_time_ms=15).late


@settings(max_examples=400, deadline=None)
@given(records_strategy, st.integers(1, 15), st.integers(0, 30))
def test_sliding_windows_any_arrival_order_matches_the_model(
    records: list[tuple[str, int, int]], difference: int, grace: int
) -> None:
    """Records arrive in any order (keys share the stream time): the sums of the windows
    built by :func:`slide` equal the model's over the records taken; a record is late
    exactly when a window it would change has closed; a closed window never changes."""
    spec = SlidingWindows(difference_ms=difference, grace_ms=grace)
    taken: dict[str, list[tuple[int, int]]] = {}
    sums: dict[str, dict[Window, int]] = {}
    finals: dict[tuple[str, Window], int] = {}
    stream_time: int | None = None
    for key, ts, value in records:
        mine = taken.setdefault(key, [])
        windows = sums.setdefault(key, {})
        update = slide(spec, [t for t, _ in mine], ts, stream_time)
        now = ts if stream_time is None else max(stream_time, ts)
        before = model_sliding(difference, [t for t, _ in mine])
        after = model_sliding(difference, [t for t, _ in mine] + [ts])
        changed = {w for w in after if before.get(w) != after[w]}
        assert set(update.created) | set(update.updated) == changed
        assert set(update.created) == set(after) - set(before)
        assert update.late == any(spec.close_time(w[1]) <= now for w in changed)
        stream_time = now
        if update.late:
            continue
        mine.append((ts, value))
        for w in update.updated:
            windows[w] += value
        for w in update.created:
            windows[w] = sum(v for t, v in mine if w[0] <= t < w[1])
        for w, total in windows.items():  # what emit-on-close would send, once
            if spec.close_time(w[1]) <= now:
                assert finals.setdefault((key, w), total) == total
    for key, mine in taken.items():
        model = model_sliding(difference, [t for t, _ in mine])
        expected = {w: sum(v for t, v in mine if w[0] <= t < w[1]) for w in model}
        assert sums[key] == expected


@settings(max_examples=200, deadline=None)
@given(records_strategy, st.integers(1, 15))
def test_sliding_windows_within_grace_match_the_model_of_all_records(
    records: list[tuple[str, int, int]], difference: int
) -> None:
    spec = SlidingWindows(difference_ms=difference, grace_ms=1_000)  # nothing is late
    seen: dict[str, list[int]] = {}
    counts: dict[str, dict[Window, int]] = {}
    for key, ts, _ in records:
        windows = counts.setdefault(key, {})
        mine = seen.setdefault(key, [])
        update = slide(spec, mine, ts, max((t for _, t, _ in records), default=0))
        assert not update.late
        mine.append(ts)
        for w in update.updated:
            windows[w] += 1
        for w in update.created:
            windows[w] = sum(1 for t in mine if w[0] <= t < w[1])
    for key, mine in seen.items():
        assert counts[key] == {w: len(v) for w, v in model_sliding(difference, mine).items()}


def test_slide_reads_only_the_records_within_reach() -> None:
    spec = SlidingWindows(difference_ms=10)
    low, high = spec.reach(50)
    assert (low, high) == (39, 61)
    near = [39, 45, 61]
    assert slide(spec, [*near, 0, 38, 62, 100], 50, None) == slide(spec, near, 50, None)


# ------------------------------------------------------------------ session windows


def test_session_for_on_hand_made_cases() -> None:
    spec = SessionWindows(gap_ms=10, grace_ms=5)
    bridge = session_for(spec, [(0, 6), (20, 21)], timestamp_ms=12, stream_time_ms=20)
    assert bridge == SessionUpdate((0, 21), ((0, 6), (20, 21)), late=False)
    inside = session_for(spec, [(0, 6)], timestamp_ms=3, stream_time_ms=5)
    assert inside == SessionUpdate((0, 6), ((0, 6),), late=False)
    alone = session_for(spec, [(0, 6)], timestamp_ms=16, stream_time_ms=5)  # 11 after 5
    assert alone == SessionUpdate((16, 17), (), late=False)
    # (0, 6) closes at 6 + 10 + 5 = 21: a record joining it then is late
    assert session_for(spec, [(0, 6)], 8, stream_time_ms=20).late is False
    assert session_for(spec, [(0, 6)], 8, stream_time_ms=21).late is True
    # ... and so is one bridging it with an open session
    assert session_for(spec, [(0, 6), (14, 30)], 10, stream_time_ms=21).late is True


@settings(max_examples=400, deadline=None)
@given(records_strategy, st.integers(1, 15), st.integers(0, 30))
def test_sessions_any_arrival_order_match_the_model(
    records: list[tuple[str, int, int]], gap: int, grace: int
) -> None:
    """As for sliding windows: sums merged by :func:`session_for` equal the model's over
    the records taken; late exactly when a closed session would change; a closed session
    never changes."""
    spec = SessionWindows(gap_ms=gap, grace_ms=grace)
    taken: dict[str, list[tuple[int, int]]] = {}
    sums: dict[str, dict[Window, int]] = {}
    finals: dict[tuple[str, Window], int] = {}
    stream_time: int | None = None
    for key, ts, value in records:
        mine = taken.setdefault(key, [])
        sessions = sums.setdefault(key, {})
        update = session_for(spec, list(sessions), ts, stream_time)
        now = ts if stream_time is None else max(stream_time, ts)
        before = model_sessions(gap, [t for t, _ in mine])
        after = model_sessions(gap, [t for t, _ in mine] + [ts])
        assert update.session in after
        assert set(update.absorbed) == {s for s in before if s not in after} | (
            {update.session} & set(before)
        )
        changed = {*update.absorbed, update.session}
        assert update.late == any(spec.close_time(s[1]) <= now for s in changed)
        stream_time = now
        if update.late:
            continue
        mine.append((ts, value))
        total = sum(sessions.pop(s) for s in update.absorbed) + value
        sessions[update.session] = total
        for s, session_total in sessions.items():
            if spec.close_time(s[1]) <= now:
                assert finals.setdefault((key, s), session_total) == session_total
    for key, mine in taken.items():
        expected = {
            s: sum(v for t, v in mine if s[0] <= t < s[1])
            for s in model_sessions(gap, [t for t, _ in mine])
        }
        assert sums[key] == expected


@settings(max_examples=200, deadline=None)
@given(records_strategy, st.integers(1, 15))
def test_sessions_within_grace_match_the_model_of_all_records(
    records: list[tuple[str, int, int]], gap: int
) -> None:
    spec = SessionWindows(gap_ms=gap, grace_ms=1_000)
    counts: dict[str, dict[Window, int]] = {}
    seen: dict[str, list[int]] = {}
    for key, ts, _ in records:
        sessions = counts.setdefault(key, {})
        update = session_for(spec, list(sessions), ts, 80)
        assert not update.late
        seen.setdefault(key, []).append(ts)
        sessions[update.session] = sum(sessions.pop(s) for s in update.absorbed) + 1
    for key, mine in seen.items():
        model = model_sessions(gap, mine)
        assert counts[key] == {s: sum(1 for t in mine if s[0] <= t < s[1]) for s in model}


def test_session_for_ignores_sessions_out_of_reach() -> None:
    spec = SessionWindows(gap_ms=10)
    assert spec.reach(50) == (40, 60)
    far = [(0, 30), (61, 70)]  # last record 29 < 40; first 61 > 60
    assert session_for(spec, far, 50, None) == SessionUpdate((50, 51), (), late=False)
    near = [(0, 41), (60, 70)]
    assert session_for(spec, near, 50, None).absorbed == ((0, 41), (60, 70))


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_the_cores_refuse_bad_timestamps(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="timestamps are ints >= 0"):
        slide(SlidingWindows(difference_ms=5), [], bad, None)
    with pytest.raises(ConfigurationError, match="timestamps are ints >= 0"):
        session_for(SessionWindows(gap_ms=5), [], bad, None)


# ------------------------------------------------------------------ windowed tables


@pytest.mark.parametrize(
    ("retention", "kept"),
    [(None, [(0, 1), (120_000, 1)]), (timedelta(minutes=1), [(120_000, 1)])],
)
async def test_windowed_tables_keep_windows_for_their_retention_or_forever(
    retention: timedelta | None, kept: list[tuple[int, int]]
) -> None:
    app = streamjoin.App("kinds-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    table = app.table(
        "per-minute",
        default=int,
        key_serializer="str",
        window=TumblingWindows(timedelta(minutes=1), retention=retention),
        copartitioned_with=clicks,
    )

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            table[event.key] += 1

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="k", value=1, timestamp_ms=0)
        await driver.put("clicks", key="k", value=1, timestamp_ms=120_000)
        await driver.drain()  # (flushes: an expiry pass at stream time 2 min)
        # [0, 1 min) expires at stream time 1 min + retention: 2 min
        assert table.windows_of("k", 0, 200_000) == kept
