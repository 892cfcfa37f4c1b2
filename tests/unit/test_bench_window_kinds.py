"""The window-kinds benchmark's models and checks (benchmarks/window_kinds.py): the answers
every system is judged by, so they are checked against brute force here."""

from __future__ import annotations

import json
import random
from pathlib import Path

from benchmarks.window_kinds import (
    SESSION_GAP_MS,
    CloseExpectation,
    Shape,
    check_final,
    check_windows,
    close_expectation,
    final_of,
    generate,
    hopping_model,
    hopping_starts,
    not_ticks,
    read_dump_rows,
    session_model,
    tick_keys,
)
from benchmarks.window_kinds_quix_app import current_windows

HOP = Shape("hopping", size_ms=300, step_ms=100, grace_ms=10)
SESSION = Shape("session", gap_ms=51, grace_ms=10)


def test_hopping_starts_are_every_window_holding_the_timestamp() -> None:
    for ts in [0, 1, 99, 100, 250, 299, 300, 1234]:
        brute = [s for s in range(0, ts + 1, 100) if s <= ts < s + 300]
        assert list(hopping_starts(ts, 300, 100)) == brute


def test_hopping_model_counts_each_event_in_each_of_its_windows() -> None:
    got = hopping_model([("a", 250), ("a", 320), ("b", 50)], HOP)
    assert got == {
        ("a", 0): 1,
        ("a", 100): 2,
        ("a", 200): 2,
        ("a", 300): 1,
        ("b", 0): 1,
    }


def brute_sessions(events: list[tuple[str, int]], gap: int) -> dict[tuple[object, ...], int]:
    """Sessions by merging, one event at a time in arrival order, as a stream processor does."""
    sessions: dict[str, list[list[int]]] = {}
    for key, ts in events:
        near = [s for s in sessions.get(key, []) if s[0] - gap <= ts <= s[1] + gap]
        merged = [min([ts, *(s[0] for s in near)]), max([ts, *(s[1] for s in near)])]
        merged.append(1 + sum(s[2] for s in near))
        sessions[key] = [s for s in sessions.get(key, []) if s not in near] + [merged]
    return {(k, s, e): n for k, ss in sessions.items() for s, e, n in ss}


def test_session_model_matches_merging_in_any_arrival_order() -> None:
    rng = random.Random(3)
    for _ in range(200):
        events = [
            (rng.choice("ab"), rng.randrange(0, 600) * 2) for _ in range(rng.randrange(1, 25))
        ]
        assert session_model(events, SESSION.gap_ms) == brute_sessions(events, SESSION.gap_ms)


def test_generated_timestamps_are_even_so_never_one_odd_gap_apart() -> None:
    records = generate(2_000, 50, seed=1)
    assert all(ts % 2 == 0 for *_, ts in records)
    assert SESSION_GAP_MS % 2 == 1
    assert [r[0] for r in records] == ["input"] * 2_000


def test_check_windows_names_missing_wrong_and_unexpected() -> None:
    truth = {("a", 0): 2, ("a", 100): 1, ("b", 0): 4}
    got = {("a", 0): 2, ("a", 100): 3, ("c", 0): 1}
    assert check_windows(truth, got) == {"expected": 3, "missing": 1, "wrong": 1, "unexpected": 1}
    assert check_windows(truth, dict(truth))["missing"] == 0


def test_close_expectation_splits_due_and_optional_by_partition_stream_time() -> None:
    # partition 0: times 0..900; 80% in at stream time 700
    events = [("a", t) for t in range(0, 1000, 100)]
    expected = close_expectation(events, lambda _key: 0, HOP)
    # a window [s, s + 300) closes at s + 310: due when <= 700, optional when <= 900
    assert sorted(expected.due) == [("a", 0), ("a", 100), ("a", 200), ("a", 300)]
    assert sorted(expected.optional) == [("a", 400), ("a", 500)]
    assert expected.due[("a", 300)] == 3
    later = close_expectation(events, lambda _key: 0, HOP, delay_ms=200)
    assert sorted(later.due) == [("a", 0), ("a", 100)]


def test_close_expectation_of_sessions_waits_a_gap_after_the_last_event() -> None:
    events = [("a", 0), ("a", 40), ("a", 200), ("a", 300), ("a", 400)]
    expected = close_expectation(events, lambda _key: 0, SESSION, due_fraction=0.8)
    # stream time 300 after 4 of 5 events: a session closes at its last event + 51 + 10
    assert expected.due == {("a", 0, 40): 2, ("a", 200, 200): 1}
    assert expected.optional == {("a", 300, 300): 1}  # closes at 361; (a, 400) still open


def test_check_final_counts_missing_wrong_duplicate_and_early() -> None:
    expected = CloseExpectation(due={("a", 0): 2, ("b", 0): 1}, optional={("a", 100): 5})
    results = [
        (("a", 0), 2),
        (("a", 0), 2),  # duplicate
        (("a", 100), 4),  # optional, but wrong
        (("c", 0), 1),  # not closed (or not a window at all)
    ]
    got = check_final(expected, results)
    assert got == {
        "expected": 2,
        "optional": 1,
        "emitted": 4,
        "missing": 1,
        "wrong": 1,
        "duplicate": 1,
        "early": 1,
    }


def test_final_of_reads_each_systems_output_format() -> None:
    ks = json.dumps({"start": 100, "end": 400, "count": 3}).encode()
    assert final_of("kstreams-close", b"a", ks, (), "hopping") == (("a", 100), 3)
    quix = json.dumps({"start": 10, "end": 21, "value": 2}).encode()
    assert final_of("quix-close", b"a", quix, (), "session") == (("a", 10, 20), 2)
    assert final_of("streamjoin-close", b"a", quix, (), "session") == (("a", 10, 20), 2)
    assert final_of("kstreams-close", b"a", ks, (), "session") == (("a", 100, 400), 3)
    bounds = [("window-start", b"100"), ("window-end", b"400")]
    assert final_of("streamjoin-close", b"a", b"7", bounds, "hopping") == (("a", 100), 7)


def test_read_dump_rows_takes_the_newest_dump_per_partition(tmp_path: Path) -> None:
    marks = tmp_path / "x.marks"
    (tmp_path / "x.marks.dump.p0").write_text('["a",0,1]\n["a",100,2]\n')
    (tmp_path / "x.marks.dump.p1").write_text('["b",5,9,3]\n')
    (tmp_path / "x.marks.dump.p1.tmp-1").write_text("not json")
    assert read_dump_rows([marks]) == {("a", 0): 1, ("a", 100): 2, ("b", 5, 9): 3}


def test_quix_dump_keeps_the_newest_of_overlapping_sessions() -> None:
    # [10, 30] was later merged with [60, 90] into [10, 90] (same start: replaced)
    latest = {
        ("a", 10): (91, 4, 2),
        ("a", 60): (91, 1, 1),  # [60, 90], merged away
        ("a", 500): (501, 1, 3),
        ("b", 60): (61, 1, 4),
    }
    rows = sorted(current_windows(latest, session=True), key=str)
    assert rows == sorted([["a", 10, 90, 4], ["a", 500, 500, 1], ["b", 60, 60, 1]], key=str)
    assert current_windows({("a", 0): (300, 2, 0)}, session=False) == [["a", 0, 2]]


def test_tick_keys_cover_every_partition_and_are_left_out() -> None:
    from streamjoin.partitioner import partition_for_key

    keys = tick_keys(8)
    assert sorted(keys) == list(range(8))
    assert all(partition_for_key(k.encode(), 8) == p for p, k in keys.items())
    assert not_ticks({(keys[0], 0): 1, ("user-1", 0): 2}) == {("user-1", 0): 2}
