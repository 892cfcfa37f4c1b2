"""Window arithmetic: which windows hold a timestamp, when they expire.

How windows are stored is tested in test_window_layout.py and test_windowed_table.py.
Hypothesis prints the falsifying example and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.errors import ConfigurationError
from streamjoin.state.windows import HoppingWindows, TumblingWindows, may_start_between

# ------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("ts", "expected"),
    [(0, [(0, 10)]), (9, [(0, 10)]), (10, [(10, 20)]), (12345, [(12340, 12350)])],
)
def test_tumbling_windows(ts: int, expected: list[tuple[int, int]]) -> None:
    assert TumblingWindows(size_ms=10, retention_ms=10).windows_for(ts) == expected


@pytest.mark.parametrize(
    ("size", "step", "ts", "expected"),
    [
        (10, 5, 0, [(0, 10)]),  # near the epoch: no negative starts
        (10, 5, 4, [(0, 10)]),
        (10, 5, 5, [(0, 10), (5, 15)]),
        (10, 5, 9, [(0, 10), (5, 15)]),
        (10, 5, 10, [(5, 15), (10, 20)]),
        (10, 3, 9, [(0, 10), (3, 13), (6, 16), (9, 19)]),  # size not a multiple of step
        (10, 3, 10, [(3, 13), (6, 16), (9, 19)]),
        (10, 10, 10, [(10, 20)]),  # step == size: tumbling
    ],
)
def test_hopping_windows(size: int, step: int, ts: int, expected: list[tuple[int, int]]) -> None:
    assert HoppingWindows(size_ms=size, step_ms=step, retention_ms=size).windows_for(ts) == expected


@given(st.integers(1, 40), st.data(), st.integers(0, 500))
def test_hopping_windows_are_exactly_the_covering_aligned_windows(
    size: int, data: st.DataObject, ts: int
) -> None:
    step = data.draw(st.integers(1, size))
    expected = [(s, s + size) for s in range(0, ts + 1, step) if s <= ts < s + size]
    assert HoppingWindows(size_ms=size, step_ms=step).windows_for(ts) == expected


@pytest.mark.parametrize("ts", [-1, True, 1.5])
def test_bad_timestamps_are_rejected(ts: Any) -> None:
    with pytest.raises(ConfigurationError, match="timestamps are ints >= 0"):
        TumblingWindows(size_ms=10).windows_for(ts)
    with pytest.raises(ConfigurationError, match="timestamps are ints >= 0"):
        HoppingWindows(size_ms=10, step_ms=5).windows_for(ts)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TumblingWindows(size_ms=0),
        lambda: TumblingWindows(size_ms=10, grace_ms=5, retention_ms=4),
        lambda: TumblingWindows(size_ms=10, grace_ms=-1),
        lambda: HoppingWindows(size_ms=10, step_ms=0),
        lambda: HoppingWindows(size_ms=10, step_ms=11),
        lambda: HoppingWindows(size_ms=10, step_ms=5, grace_ms=2, retention_ms=1),
        lambda: HoppingWindows(size_ms=-10, step_ms=5),
        lambda: HoppingWindows(size_ms=True, step_ms=1),
    ],
)
def test_invalid_window_definitions_are_rejected(make: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"_ms\b.*must be"):
        make()


def test_expiry_boundary_keeps_while_stream_time_is_below_end_plus_retention() -> None:
    for windows in (
        TumblingWindows(size_ms=10, retention_ms=15),
        HoppingWindows(size_ms=10, step_ms=5, retention_ms=15),
    ):
        assert not windows.expired(window_end_ms=10, stream_time_ms=24)
        assert windows.expired(window_end_ms=10, stream_time_ms=25)
        assert windows.expired(window_end_ms=10, stream_time_ms=1000)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=(1 << 62)), st.integers(min_value=1, max_value=10**7))
def test_tumbling_windows_are_hopping_windows_with_a_step_of_their_size(ts: int, size: int) -> None:
    assert TumblingWindows(size_ms=size).windows_for(ts) == HoppingWindows(
        size_ms=size, step_ms=size
    ).windows_for(ts)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "5"])
def test_tumbling_windows_refuse_bad_timestamps(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="timestamps are ints >= 0"):
        TumblingWindows(size_ms=10).windows_for(bad)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    step=st.integers(1, 50),
    size_steps=st.integers(1, 4),
    low=st.integers(-100, 1_000),
    span=st.integers(0, 120),
    tumbling=st.booleans(),
)
def test_may_start_between_is_whether_a_window_starts_in_the_interval(
    step: int, size_steps: int, low: int, span: int, tumbling: bool
) -> None:
    """An expiry pass skips its scan only when no window can start in (last cutoff, cutoff]:
    checked against the windows themselves (each start is the start of some timestamp's
    window)."""
    spec: TumblingWindows | HoppingWindows = (
        TumblingWindows(size_ms=step)
        if tumbling
        else HoppingWindows(size_ms=step * size_steps, step_ms=step)
    )
    high = low + span
    starts = {start for ts in range(0, high + 1) for start, _ in spec.windows_for(ts)}
    assert may_start_between(spec, low, high) == any(low < s <= high for s in starts)


def test_may_start_between_knows_nothing_of_other_specs() -> None:
    class Custom:
        size_ms = 10
        retention_ms = 10

        def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
            return [(timestamp_ms, timestamp_ms + 10)]

        def expired(self, window_end_ms: int, stream_time_ms: int) -> bool:
            return stream_time_ms >= window_end_ms + 10

    assert may_start_between(Custom(), 5, 5)
