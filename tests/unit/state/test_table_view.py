"""A table partition's byte-level view merges buffered writes over the store, in order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedDict

import streamjoin
from streamjoin.state.memory import MemoryStorePartition

keys = st.binary(min_size=0, max_size=3)
ops = st.lists(
    st.tuples(st.sampled_from(["put", "delete", "take", "flush"]), keys, st.binary(max_size=2)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops, keys, st.one_of(st.none(), keys))
def test_scan_matches_a_dict_model(
    operations: list[tuple[str, bytes, bytes]], lo: bytes, hi: bytes | None
) -> None:
    app = streamjoin.App("view-test")
    table = app.table("t", partitions=1)
    table.stores[0] = MemoryStorePartition()
    table.ready.add(0)
    view = table.view(0)
    model: dict[bytes, bytes] = {}
    offset = 0
    for op, key, value in operations:
        if op == "put":
            view.put(key, value)
            model[key] = value
        elif op == "delete":
            view.delete(key)
            model.pop(key, None)
        elif op == "take":  # a flush has started: writes so far are in the flushing layer
            table.take_pending()
        else:
            table.take_pending()
            offset += 1
            table.finish_flush({0: offset})
        assert view.get(key) == model.get(key)
    if len(operations) % 2:  # sometimes scan in the middle of a flush
        table.take_pending()
    expected = sorted((k, v) for k, v in model.items() if k >= lo and (hi is None or k < hi))
    assert list(view.scan(lo, hi)) == expected


def _counting_layer(keys: Iterator[bytes], counter: list[int]) -> SortedDict[bytes, bytes]:
    """A buffered-writes layer that counts the keys range scans take from it."""
    layer: SortedDict[bytes, bytes] = SortedDict((k, b"v") for k in keys)
    plain_irange = layer.irange  # SortedDict binds irange per instance

    def irange(*args: Any, **kwargs: Any) -> Iterator[bytes]:
        for key in plain_irange(*args, **kwargs):
            counter[0] += 1
            yield key

    layer.irange = irange  # type: ignore[method-assign]
    return layer


def test_scan_reads_only_what_it_is_asked_for() -> None:
    """The first item of a range costs a few steps however many writes are buffered in it
    (the join core asks for the next expiring entry once per event)."""
    app = streamjoin.App("view-test")
    table = app.table("t", partitions=1)
    table.stores[0] = MemoryStorePartition()
    table.ready.add(0)
    taken = [0]
    table.pending[0] = _counting_layer((i.to_bytes(2, "big") for i in range(5000)), taken)
    assert next(iter(table.view(0).scan(b"", None))) == (bytes(2), b"v")
    assert taken[0] <= 2
