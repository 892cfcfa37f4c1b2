"""A table partition's byte-level view merges buffered writes over the store, in order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.state.memory import MemoryStorePartition

keys = st.binary(min_size=0, max_size=3)
ops = st.lists(
    st.tuples(st.sampled_from(["put", "delete", "flush"]), keys, st.binary(max_size=2)),
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
        else:
            table.take_pending()
            offset += 1
            table.finish_flush({0: offset})
        assert view.get(key) == model.get(key)
    if len(operations) % 2:  # sometimes scan in the middle of a flush
        table.take_pending()
    expected = sorted((k, v) for k, v in model.items() if k >= lo and (hi is None or k < hi))
    assert list(view.scan(lo, hi)) == expected
