"""The workload benchmarks' completion marks and truths (benchmarks/progress_marks.py)."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.harness import read_marks
from benchmarks.progress_marks import Marks, format_last_offsets, parse_last_offsets
from benchmarks.window_count import generate, read_dumps


def test_last_offsets_round_trip() -> None:
    last = {("a-b:c", 0): 5, ("t", 7): 0}
    assert parse_last_offsets(format_last_offsets(last)) == last
    assert parse_last_offsets("") == {}


def test_done_when_every_partition_reached_its_last_offset(tmp_path: Path) -> None:
    path = tmp_path / "m"
    finished: list[tuple[str, int]] = []
    done: list[bool] = []
    marks = Marks(
        str(path),
        {("t", 0): 2, ("t", 1): 0},
        lambda t, p: finished.append((t, p)),
        lambda: done.append(True),
    )
    marks.seen("t", 0, 0)
    marks.seen("t", 0, 2)
    assert finished == [("t", 0)] and not done
    marks.seen("t", 0, 1)  # replayed events do not finish anything twice
    marks.seen("t", 1, 0)
    assert finished == [("t", 0), ("t", 1)] and done == [True]
    assert [(m[0], m[3]) for m in read_marks(path)] == [
        ("FIRST", ""),
        ("PDONE", "t:0"),
        ("PDONE", "t:1"),
        ("DONE", ""),
    ]


def test_window_truth_and_newest_dump_per_partition(tmp_path: Path) -> None:
    records, truth = generate(500, 20, seed=1)
    assert sum(truth.values()) == len(records) == 500
    assert all(start % 60_000 == 0 for _, start in truth)
    old, new = tmp_path / "w0.marks", tmp_path / "w1.marks"
    (tmp_path / "w0.marks.dump.p3").write_text('["k",0,1]\n')
    (tmp_path / "w1.marks.dump.p3").write_text('["k",0,2]\n["j",60000,1]\n')

    os.utime(tmp_path / "w0.marks.dump.p3", (1, 1))
    assert read_dumps([old, new]) == {("k", 0): 2, ("j", 60000): 1}
