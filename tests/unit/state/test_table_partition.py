"""A table partition merges its buffered writes over its store, in order, through flushes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.runtime.table_state.flush import apply_writes, send_writes, take_writes
from streamjoin.state.keys import length_prefixed
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.window_layout import DATA, data_group

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
    view = TablePartition("t", 0, MemoryStorePartition())
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
            view.take_pending()
        else:
            view.take_pending()
            offset += 1
            view.finish_flush(offset)
        assert view.get(key) == model.get(key)
    if len(operations) % 2:  # sometimes scan in the middle of a flush
        view.take_pending()
    expected = sorted((k, v) for k, v in model.items() if k >= lo and (hi is None or k < hi))
    assert list(view.scan(lo, hi)) == expected


class _CountingDict(dict[bytes, bytes | None]):
    """Buffered writes that count the values range scans read from them."""

    def __init__(self, items: Iterator[tuple[bytes, bytes]], counter: list[int]) -> None:
        super().__init__(items)
        self.counter = counter

    def get(self, key: bytes, default: Any = None) -> Any:
        self.counter[0] += 1
        return super().get(key, default)


def test_scan_reads_only_what_it_is_asked_for() -> None:
    """The first item of a range costs a few steps however many writes are buffered in it
    (the join core asks for the next expiring entry once per event)."""
    view = TablePartition("t", 0, MemoryStorePartition())
    taken = [0]
    view.pending = _CountingDict(((i.to_bytes(2, "big"), b"v") for i in range(5000)), taken)
    assert next(iter(view.scan(b"", None))) == (bytes(2), b"v")
    assert taken[0] <= 2


def test_abandon_forgets_unflushed_writes_and_keeps_the_store() -> None:
    """A lost partition's writes never reach the store (its next owner replays them)."""
    store = MemoryStorePartition()
    view = TablePartition("t", 0, store)
    view.put(b"a", b"1")
    view.take_pending()
    view.finish_flush(0)
    view.put(b"a", b"2")
    view.put(b"b", b"3")
    view.take_pending()  # a flush began and did not finish
    view.put(b"c", b"4")
    assert view.abandon() == 3
    assert dict(view.scan(b"", None)) == {b"a": b"1"}
    assert store.changelog_offset() == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "delete", "take", "flush", "scan"]),
            keys,
            st.binary(max_size=2),
        ),
        max_size=80,
    )
)
def test_scans_between_writes_see_every_write(operations: list[tuple[str, bytes, bytes]]) -> None:
    """Buffers start as plain dicts and turn sorted at their first scan, whenever that is:
    scans and reads agree with a dict model at every step."""
    view = TablePartition("t", 0, MemoryStorePartition())
    model: dict[bytes, bytes] = {}
    offset = 0
    for op, key, value in operations:
        if op == "put":
            view.put(key, value)
            model[key] = value
        elif op == "delete":
            view.delete(key)
            model.pop(key, None)
        elif op == "take":
            view.take_pending()
        elif op == "flush":
            view.take_pending()
            offset += 1
            view.finish_flush(offset)
        else:
            assert list(view.scan(key, None)) == sorted(
                (k, v) for k, v in model.items() if k >= key
            )
        assert view.get(key) == model.get(key)
    assert list(view.scan(b"", None)) == sorted(model.items())


# Keys of a join buffer's shape (``DATA + side + length_prefixed(key) + tail``) mixed with
# arbitrary ones: grouped scans must agree with the dict model as ungrouped ones do.
grouped_keys = st.one_of(
    keys,
    st.builds(
        lambda side, key, tail: DATA + side + length_prefixed(key) + tail,
        st.sampled_from([b"L", b"R"]),
        st.binary(max_size=2),
        st.binary(max_size=2),
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "delete", "take", "flush", "scan", "group_scan", "abandon"]),
            grouped_keys,
            st.binary(max_size=2),
        ),
        max_size=80,
    ),
    st.booleans(),
)
def test_grouped_scans_see_every_write(
    operations: list[tuple[str, bytes, bytes]], group_first: bool
) -> None:
    """With keys grouped (as join buffers do), scans inside one group and scans across
    groups and other keys agree with a dict model at every step, through flushes."""
    store = MemoryStorePartition()
    view = TablePartition("t", 0, store)
    group_of = data_group(space_length=1)
    if group_first:
        view.group_keys_by(group_of)
    model: dict[bytes, bytes] = {}
    offset = 0
    for i, (op, key, value) in enumerate(operations):
        if i == len(operations) // 2:
            view.group_keys_by(group_of)  # grouping may start with writes buffered
        if op == "put":
            view.put(key, value)
            model[key] = value
        elif op == "delete":
            view.delete(key)
            model.pop(key, None)
        elif op == "take":
            view.take_pending()
        elif op == "flush":
            view.take_pending()
            offset += 1
            view.finish_flush(offset)
        elif op == "abandon":  # the partition moved away and came back: the store remains
            view.abandon()
            view = TablePartition("t", 0, store)
            view.group_keys_by(group_of)
            model = dict(store.items())
        elif op == "scan":
            assert list(view.scan(key, None)) == sorted(
                (k, v) for k, v in model.items() if k >= key
            )
        else:
            group = group_of(key)
            if group is not None:
                end = group + value
                assert list(view.scan(key, end)) == sorted(
                    (k, v) for k, v in model.items() if key <= k < end
                )
        assert view.get(key) == model.get(key)
    assert list(view.scan(b"", None)) == sorted(model.items())
    assert list(view.scan(DATA, b"\x03")) == sorted(
        (k, v) for k, v in model.items() if DATA <= k < b"\x03"
    )


# a few keys, grouped and not, so that operations meet the same key often
few_keys = st.sampled_from(
    [
        b"\x01a",
        b"\x01b",
        *(DATA + side + length_prefixed(b"k") + t for side in (b"L", b"R") for t in (b"1", b"2")),
    ]
)


class _Changelog:
    """What send_writes needs of a table and a sender: records what reaches the changelog."""

    def __init__(self) -> None:
        self.name = "t-changelog"
        self.changelog = self
        self.compacted: dict[bytes, bytes] = {}
        self.sent = 0
        #: the last flush completed: no tombstone for a key the changelog does not hold
        self.strict = True

    async def send_many(self, topic: str, partition: int, records: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        for key, value in records:
            # a tombstone only for a key the changelog holds (the store never had others)
            assert value is not None or key in self.compacted or not self.strict, key
            if value is None:
                self.compacted.pop(key, None)
            else:
                self.compacted[key] = value
            self.sent += 1
        future.set_result(self.sent)
        return future


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                ["put", "delete", "insert", "remove", "take", "flush", "group_scan", "abandon"]
            ),
            st.one_of(grouped_keys, few_keys),
            st.binary(max_size=2),
        ),
        max_size=80,
    ),
)
def test_insert_and_remove_hints_keep_reads_and_the_changelog_exact(
    operations: list[tuple[str, bytes, bytes]],
) -> None:
    """insert (a key known absent) and remove (a key known present), as the join core calls
    them, read like put and delete; a key inserted and removed again before a flush leaves
    nothing, and a removed stored key gets its tombstone without a store lookup: the
    changelog always ends up holding exactly what the store holds."""
    store = MemoryStorePartition()
    log = _Changelog()
    tables: Any = {"t": log}
    group_of = data_group(space_length=1)
    view = TablePartition("t", 0, store)
    view.group_keys_by(group_of)
    model: dict[bytes, bytes] = {}

    async def flush(states: list[TablePartition]) -> None:
        log.strict = not states[0].flush_interrupted
        sending = await send_writes(take_writes(states), tables, log)
        offsets = await asyncio.gather(*(f for _, f in sending if f is not None))
        apply_writes(sending, offsets)

    for op, key, value in operations:
        if op == "put" or (op == "insert" and key in model):
            view.put(key, value)
            model[key] = value
        elif op == "insert":
            view.insert(key, value, group_of(key))
            model[key] = value
        elif op == "delete" or (op == "remove" and key not in model):
            view.delete(key)
            model.pop(key, None)
        elif op == "remove":
            view.remove(key, group_of(key))
            del model[key]
        elif op == "take":
            view.take_pending()
        elif op == "flush":
            asyncio.run(flush([view]))
            assert log.compacted == dict(store.items())
        elif op == "abandon":
            view.abandon()
            view = TablePartition("t", 0, store)
            view.group_keys_by(group_of)
            model = dict(store.items())
        else:
            group = group_of(key)
            if group is not None:
                end = group + value
                assert view.scan_group(group, key, end) == sorted(
                    (k, v) for k, v in model.items() if key <= k < end
                )
        assert view.get(key) == model.get(key)
        assert list(view.scan(b"", None)) == sorted(model.items())
    asyncio.run(flush([view]))
    assert dict(store.items()) == model
    assert log.compacted == model


def test_keys_of_no_group_stay_sorted_as_they_arrive() -> None:
    """Keys of no group written after the first scan that sorted them (join expiry keys, in
    nearly increasing order, and deletes of older ones) are sorted in at the next scan."""
    view = TablePartition("t", 0, MemoryStorePartition())
    view.group_keys_by(data_group(space_length=1))
    model: dict[bytes, bytes] = {}
    for step in range(6):
        for i in (5, 3, 4, 9, 1, 2, 8, 7, 6, 0, 11, 10):  # more than a few at once, unsorted
            key = (step * 100 + i).to_bytes(4, "big")
            view.put(key, b"v")
            model[key] = b"v"
        for i in (2, 1):  # fewer than a few
            key = (step * 100 + 50 + i).to_bytes(4, "big")
            view.put(key, b"w")
            model[key] = b"w"
        if step % 2:
            old = (step * 100 - 100 + 3).to_bytes(4, "big")
            view.delete(old)
            model.pop(old, None)
        if step == 4:  # many keys below the last one at once
            for i in range(40):
                key = (step * 100 - 60 + i).to_bytes(4, "big") + b"x"
                view.put(key, b"x")
                model[key] = b"x"
        assert list(view.scan(b"", None)) == sorted(model.items())
        assert list(view.scan((step * 100).to_bytes(4, "big"), None)) == sorted(
            (k, v) for k, v in model.items() if k >= (step * 100).to_bytes(4, "big")
        )


class _NoLookups(MemoryStorePartition):
    def contains(self, key: bytes) -> bool:
        raise AssertionError(f"looked up {key!r}")


def test_removing_a_stored_key_sends_its_tombstone_without_a_lookup() -> None:
    """remove() of a key in neither buffer knows the store holds it: its flush sends the
    tombstone without asking the store; an inserted key removed again sends nothing."""
    store = _NoLookups()
    log = _Changelog()
    tables: Any = {"t": log}
    view = TablePartition("t", 0, store)
    view.group_keys_by(data_group(space_length=1))

    async def flush() -> None:
        sending = await send_writes(take_writes([view]), tables, log)
        apply_writes(sending, await asyncio.gather(*(f for _, f in sending if f is not None)))

    stored = DATA + b"L" + length_prefixed(b"k") + b"1"
    view.insert(stored, b"v", DATA + b"L" + length_prefixed(b"k"))
    view.insert(b"\x01i", b"f", None)
    asyncio.run(flush())
    assert log.compacted == {stored: b"v", b"\x01i": b"f"}
    view.remove(stored, DATA + b"L" + length_prefixed(b"k"))
    view.remove(b"\x01i", None)
    short_lived = DATA + b"R" + length_prefixed(b"k") + b"1"
    view.insert(short_lived, b"w", DATA + b"R" + length_prefixed(b"k"))
    view.remove(short_lived, DATA + b"R" + length_prefixed(b"k"))
    assert short_lived not in view.pending
    asyncio.run(flush())
    assert log.compacted == {} == dict(store.items())
    assert log.sent == 4


def test_removing_a_key_while_its_flush_runs_sends_its_tombstone_without_a_lookup() -> None:
    """A key removed while the flush that writes it is under way is in the store once that
    flush is done: the next flush sends its tombstone without asking the store."""
    store = _NoLookups()
    log = _Changelog()
    tables: Any = {"t": log}
    view = TablePartition("t", 0, store)
    view.group_keys_by(data_group(space_length=1))
    key = DATA + b"L" + length_prefixed(b"k") + b"1"
    view.insert(key, b"v", DATA + b"L" + length_prefixed(b"k"))

    async def flush_with_remove_during_send() -> None:
        sending = await send_writes(take_writes([view]), tables, log)
        view.remove(
            key, DATA + b"L" + length_prefixed(b"k")
        )  # an event processed while the changelog send is under way
        assert view.get(key) is None
        apply_writes(sending, await asyncio.gather(*(f for _, f in sending if f is not None)))

    async def flush() -> None:
        sending = await send_writes(take_writes([view]), tables, log)
        apply_writes(sending, await asyncio.gather(*(f for _, f in sending if f is not None)))

    asyncio.run(flush_with_remove_during_send())
    assert dict(store.items()) == {key: b"v"}
    asyncio.run(flush())
    assert log.compacted == {} == dict(store.items())


def test_the_first_scan_since_a_flush_sorts_only_the_keys_in_its_range() -> None:
    """A windowed table's expiry pass scans a short range once per flush: it picks the
    buffered keys in range instead of sorting them all; a second scan builds the sorted
    list that later scans keep up to date."""
    view = TablePartition("t", 0, MemoryStorePartition())
    for i in range(1000):
        view.put(i.to_bytes(2, "big"), b"v")
    low, high = (10).to_bytes(2, "big"), (13).to_bytes(2, "big")
    assert [k for k, _ in view.scan(low, high)] == [i.to_bytes(2, "big") for i in (10, 11, 12)]
    assert view._sorted is None
    assert [k for k, _ in view.scan(low, high)] == [i.to_bytes(2, "big") for i in (10, 11, 12)]
    assert view._sorted is not None and len(view._sorted) == 1000
    view.take_pending()
    view.finish_flush(1)  # the index starts again
    view.put(b"\x00\x0b", b"w")
    assert list(view.scan(low, high)) == [
        (b"\x00\x0a", b"v"),
        (b"\x00\x0b", b"w"),
        (b"\x00\x0c", b"v"),
    ]
    assert view._sorted is None
