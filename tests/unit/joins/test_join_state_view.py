"""MemoryKeyValueView: the in-memory state the join core runs on in tests and backfills."""

from __future__ import annotations

import pytest

from streamjoin.errors import InternalError
from streamjoin.joins.state import KeyValueView, MemoryKeyValueView


def test_get_put_delete() -> None:
    view = MemoryKeyValueView()
    assert view.get(b"a") is None
    view.put(b"a", b"1")
    view.put(b"a", b"2")
    assert view.get(b"a") == b"2"
    view.delete(b"a")
    view.delete(b"never-there")
    assert view.get(b"a") is None
    assert len(view) == 0


def test_scan_is_sorted_start_inclusive_end_exclusive() -> None:
    view = MemoryKeyValueView({b"b": b"2", b"a": b"1", b"c": b"3", b"\xff": b"4"})
    assert list(view.scan(b"a", b"c")) == [(b"a", b"1"), (b"b", b"2")]
    assert list(view.scan(b"b", None)) == [(b"b", b"2"), (b"c", b"3"), (b"\xff", b"4")]
    assert list(view.scan(b"c", b"c")) == []


def test_scan_reflects_earlier_writes() -> None:
    view = MemoryKeyValueView({b"a": b"1", b"b": b"2"})
    view.delete(b"a")
    view.put(b"ab", b"3")
    assert list(view.scan(b"", None)) == [(b"ab", b"3"), (b"b", b"2")]


def test_writing_during_an_open_scan_is_refused() -> None:
    view = MemoryKeyValueView({b"a": b"1", b"b": b"2"})
    scan = view.scan(b"", None)
    next(scan)
    view.put(b"c", b"3")
    with pytest.raises(InternalError, match="written while this scan was open"):
        next(scan)


def test_only_bytes_are_stored() -> None:
    with pytest.raises(TypeError):
        MemoryKeyValueView().put("a", b"1")  # type: ignore[arg-type]


def test_snapshot_is_a_copy() -> None:
    view = MemoryKeyValueView({b"a": b"1"})
    snap = view.snapshot()
    view.put(b"b", b"2")
    assert snap == {b"a": b"1"}


def test_memory_view_satisfies_the_protocol() -> None:
    view: KeyValueView = MemoryKeyValueView()
    assert view.get(b"x") is None
