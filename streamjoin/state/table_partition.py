"""One table partition at run time: its store plus the writes not yet in it (pure, no I/O).

Writes made while processing events are buffered here and reach the changelog and
the store only when the worker flushes. Buffered writes are plain dicts (a write is
one dict assignment); range scans merge them over the store lazily, through an index
of the buffered keys:

- keys of a *group* (see :meth:`TablePartition.group_keys_by`: a join buffer groups
  its events by side and key) are indexed per group, unsorted. A scan inside one
  group (every partner of an event: one per event) sorts that group's few buffered
  keys in range and never touches the others;
- every other key goes into one sorted list, built at the second scan that needs it
  since the last flush and kept from then on: keys buffered after it wait in an
  unsorted tail that the next such scan sorts in (join expiry keys arrive nearly in
  time order, so that is a short sort and an append, not an insertion per write). The
  first such scan (a windowed table's expiry pass runs one per flush) only picks the
  buffered keys in its range, which costs less than sorting them all.

Writers that know more about a key say so, and save work: :meth:`TablePartition.insert`
(a key absent from the partition, with its group) needs no group computed and, deleted
again before the next flush through :meth:`TablePartition.remove` (a key present),
leaves no write at all; a key ``remove`` finds in the store is known to need a
changelog tombstone (:meth:`TablePartition.stored_deletes`), without a store lookup.

Records to send with the partition's next flush (a window's final result, a join's
unmatched result found by a pass over an idle partition) are queued with
:meth:`TablePartition.emit`, usually from a :meth:`~TablePartition.before_take` hook: the
flusher sends them before the changelog writes of the same flush (at-least-once: a write
saying they were sent reaches the changelog only after they were acknowledged) and, under
exactly-once, in the same transaction.

The worker flushes: :meth:`take_pending` hands them out, :meth:`finish_flush`
applies them with the changelog offset they reached, :meth:`abandon` forgets them
when the partition is lost (its next owner replays the events that made them). Reads
always see the newest layer first: pending, then flushing, then the store. This is
the partition's transaction: nothing written through it is durable before a flush.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

from streamjoin.errors import StoreCorrupted
from streamjoin.state.base import StorePartition
from streamjoin.state.keys import prefix_range
from streamjoin.state.ttl import Expiry

__all__ = ["Buffer", "Emitted", "GroupOf", "TablePartition"]

#: buffered writes, key -> value (None = delete)
Buffer = dict[bytes, bytes | None]
#: a key's group: a prefix of the key that every key beginning with it maps to (None: none)
GroupOf = Callable[[bytes], bytes | None]
#: a record queued by :meth:`TablePartition.emit`: ``(topic, key, value, partition, headers,
#: timestamp_ms)``, the same tuple as :data:`streamjoin.context.OutgoingRecord` (spelled out
#: here: a pure core does not import the context)
Emitted = tuple[
    str, bytes | None, bytes | None, int | None, Sequence[tuple[str, bytes]], int | None
]

_MISSING: Final = object()


class TablePartition:
    """The store and the buffered writes of partition ``partition`` of table ``table``."""

    __slots__ = (
        "_flushing_stored",
        "_fresh",
        "_gone",
        "_group_high",
        "_group_low",
        "_group_of",
        "_groups",
        "_read_cache",
        "_scanned",
        "_sorted",
        "_stored_deletes",
        "_tail",
        "_take_hooks",
        "abandoned",
        "corrupted",
        "flushing",
        "outbox",
        "partition",
        "pending",
        "store",
        "table",
        "ttl",
    )

    def __init__(self, table: str, partition: int, store: StorePartition) -> None:
        self.table = table
        self.partition = partition
        self.store = store
        #: the store's read cache when it has one (see ``RocksDBStorePartition.read_cache``):
        #: :meth:`lookup` answers its hits without a call into the store
        cache = getattr(store, "read_cache", None)
        self._read_cache: dict[bytes, bytes | None] | None = cache if type(cache) is dict else None
        #: key -> value bytes (None = delete), written since the last flush began
        self.pending: Buffer = {}
        #: writes of the flush under way (read through while it runs)
        self.flushing: Buffer = {}
        #: the partition was lost: a flush under way must not send or apply its writes
        self.abandoned = False
        #: a flush's read found the store corrupted (the commit reports it for a rebuild)
        self.corrupted: StoreCorrupted | None = None
        # The index of buffered keys (pending and flushing alike; see the module docstring).
        self._group_of: GroupOf | None = None
        #: group -> its buffered keys
        self._groups: dict[bytes, set[bytes]] = {}
        #: the smallest and largest group indexed (a scan outside them needs no group)
        self._group_low: bytes | None = None
        self._group_high: bytes | None = None
        #: the buffered keys of no group, sorted; None until a scan needs them
        self._sorted: list[bytes] | None = None
        #: keys of no group buffered since ``_sorted`` was last brought up to date
        self._tail: list[bytes] = []
        #: a scan outside one group ran since the index was last reset: the next one sorts
        #: the keys into ``_sorted`` (the first one only picks those in its range)
        self._scanned = False
        #: pending keys put by insert() (absent from flushing and the store)
        self._fresh: set[bytes] = set()
        #: keys remove() dropped from both layers but left in the index (reading them finds
        #: nothing, and the store cannot hold them before the next flush reindexes)
        self._gone: set[bytes] = set()
        #: pending deletes of keys remove() found in neither buffer: the store has them
        self._stored_deletes: set[bytes] = set()
        #: the same for the writes being flushed
        self._flushing_stored: set[bytes] = set()
        #: called before every take_pending (see before_take)
        self._take_hooks: list[Callable[[], None]] = []
        #: records to send with the next flush, in order (see emit)
        self.outbox: list[Emitted] = []
        #: a TTL table's stream time and expiry index (made on first use: see
        #: :mod:`streamjoin.ttl_tables`); None for every other table
        self.ttl: Expiry | None = None

    def __repr__(self) -> str:
        return f"TablePartition({self.table!r}, {self.partition})"

    def group_keys_by(self, group_of: GroupOf) -> None:
        """Index buffered keys by ``group_of(key)``, which must return a prefix of the key
        that every key beginning with it maps to as well (or None: no group). Scans whose
        start and end share a group then read only that group's buffered writes."""
        if group_of is self._group_of:
            return
        self._group_of = group_of
        self._reindex()

    def before_take(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` at the start of every :meth:`take_pending`: a writer that keeps a
        value in memory between flushes (the join core's metadata) writes it there."""
        self._take_hooks.append(hook)

    def emit(self, record: Emitted) -> None:
        """Queue ``record`` to be sent by the partition's next flush, before its changelog
        writes (and, under exactly-once, in the same transaction): what a
        :meth:`before_take` hook writes in the same pass (a "sent" marker) is durable only
        together with it. Dropped if the partition is lost first (its next owner replays)."""
        self.outbox.append(record)

    def take_emitted(self) -> list[Emitted]:
        """The records queued by :meth:`emit` since the last take, in order (the flusher
        calls it right after :meth:`take_pending`, whose hooks may emit)."""
        emitted, self.outbox = self.outbox, []
        return emitted

    # ------------------------------------------------------------ the KeyValueView contract

    def lookup(self, key: bytes) -> bytes | None:
        # (an empty buffer is not searched: a table read by a join is written rarely)
        pending = self.pending
        value = pending.get(key, _MISSING) if pending else _MISSING
        if value is _MISSING:
            flushing = self.flushing
            value = flushing.get(key, _MISSING) if flushing else _MISSING
            if value is _MISSING:
                cache = self._read_cache
                if cache is not None:
                    value = cache.get(key, _MISSING)
                    if value is not _MISSING:
                        return value  # type: ignore[return-value]
                return self.store.get(key)
        return value  # type: ignore[return-value]

    def get(self, key: bytes) -> bytes | None:
        return self.lookup(key)

    def put(self, key: bytes, value: bytes | None) -> None:
        pending = self.pending
        if (
            (self._sorted is not None or self._group_of is not None)
            and key not in pending
            and (not self.flushing or key not in self.flushing)
        ):
            # (without a group index or a sorted list there is nothing to index: the usual
            # case between two flushes of a table that is not a join buffer)
            self._index(key)
        pending[key] = value

    def delete(self, key: bytes) -> None:
        self.put(key, None)

    def insert(self, key: bytes, value: bytes, group: bytes | None) -> None:
        """:meth:`put` of a key the caller knows is absent (``get`` would return None),
        whose group (under :meth:`group_keys_by`'s grouping) is ``group``."""
        pending = self.pending
        if key in pending or (self.flushing and key in self.flushing):
            pending[key] = value  # a buffered delete (or a flush's write) stays known
            return
        pending[key] = value
        self._fresh.add(key)
        if self._group_of is not None:
            self._index_in(key, group)
        elif self._sorted is not None:  # (else nothing indexes: no call)
            self._index_in(key, None)

    def remove(self, key: bytes, group: bytes | None) -> None:
        """:meth:`delete` of a key the caller knows is present (``get`` returns a value),
        whose group is ``group`` (as for :meth:`insert`)."""
        pending = self.pending
        if key in self._fresh:
            # inserted since the last flush began: it never reached the changelog or the
            # store, so it simply goes (its index entry stays: see _gone)
            self._fresh.discard(key)
            del pending[key]
            self._gone.add(key)
            return
        if key not in pending:
            flushing = self.flushing
            if not flushing or key not in flushing:
                self._stored_deletes.add(key)  # present, and in neither buffer: in the store
                if self._group_of is not None:
                    self._index_in(key, group)
                elif self._sorted is not None:
                    self._index_in(key, None)
            elif flushing[key] is not None:
                # the flush under way writes it: the store has it once that flush is done
                # (the next flush filters tombstones only if it was)
                self._stored_deletes.add(key)
        pending[key] = None

    def stored_deletes(self) -> set[bytes]:
        """Keys the store is known to hold among the writes being flushed (a delete of one
        needs a changelog tombstone; other deletes may be of keys the store never had)."""
        return self._flushing_stored

    def scan_group(self, group: bytes, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """:meth:`scan` of a range inside one group (every key in [start, end) begins with
        ``group``, a group under :meth:`group_keys_by`'s grouping), read at once."""
        if self._group_of is None:
            return list(self.scan(start, end))
        keys = self._groups.get(group)
        stored = self.store.range_items(start, end)
        if not keys:
            return stored
        hits = [key for key in keys if start <= key < end]
        if not hits:
            return stored
        hits.sort()
        if not stored:  # (a key's events since the last flush, nothing older: the usual case)
            return [(key, value) for key, value in self._newest(hits) if value is not None]
        return list(_merge(self._newest(hits), iter(stored)))

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Sorted items in [start, end), buffered writes merged over the store.

        Lazy: taking the first few items costs a few seeks however many writes are
        buffered in the range.
        """
        group_of = self._group_of
        if group_of is not None and end is not None:
            group = group_of(start)
            if group is not None and end.startswith(group):
                # every key in [start, end) begins with ``group``: only its keys can be in range
                return self._scan_keys(self._groups.get(group, ()), start, end)
        if not self.pending and not self.flushing:
            return self.store.items(start, end)
        if self._sorted is None and not self._scanned:
            # the first such scan since the last flush (a windowed table's expiry pass, once
            # per flush): picking the buffered keys in range costs less than sorting them all
            self._scanned = True
            return _merge(self._newest(self._buffered_in(start, end)), self.store.items(start, end))
        ordered = self._ordered()
        low = bisect_left(ordered, start)
        high = len(ordered) if end is None else bisect_left(ordered, end, low)
        keys: Iterable[bytes] = ordered[low:high]
        if self._groups and self._may_hold_groups(start, end):
            keys = sorted([*keys, *self._grouped_in(start, end)])
        return _merge(self._newest(keys), self.store.items(start, end))

    def _buffered_in(self, start: bytes, end: bytes | None) -> list[bytes]:
        """The buffered keys in [start, end), sorted, without the index."""
        pending, flushing = self.pending, self.flushing
        keys = [k for k in pending if start <= k and (end is None or k < end)]
        if flushing:
            keys += [
                k for k in flushing if k not in pending and start <= k and (end is None or k < end)
            ]
        keys.sort()
        return keys

    # ------------------------------------------------------------ the index of buffered keys

    def _index(self, key: bytes) -> None:
        """Index a key newly buffered (in neither layer yet)."""
        group_of = self._group_of
        self._index_in(key, None if group_of is None else group_of(key))

    def _index_in(self, key: bytes, group: bytes | None) -> None:
        """:meth:`_index`, given the key's group."""
        if group is None:
            if self._sorted is not None:
                if key in self._gone:
                    self._gone.discard(key)  # still indexed
                else:
                    self._tail.append(key)
            return
        keys = self._groups.get(group)
        if keys is not None:
            keys.add(key)
        else:
            self._new_group(group, key)

    def _new_group(self, group: bytes, key: bytes) -> None:
        self._groups[group] = {key}
        if self._group_low is None or group < self._group_low:
            self._group_low = group
        if self._group_high is None or group > self._group_high:
            self._group_high = group

    def _ordered(self) -> list[bytes]:
        """The sorted keys of no group, brought up to date."""
        ordered = self._sorted
        if ordered is None:
            ordered = self._sorted = sorted(self._ungrouped())
            self._tail = []
            self._gone = set()  # (not in either layer: not in the list)
            return ordered
        tail = self._tail
        if tail:
            self._tail = []
            tail.sort()
            # keys past the last one are appended; a few others are inserted one by one (a
            # move of the list's end in C each), many make one merge of two sorted runs
            inside = bisect_right(tail, ordered[-1]) if ordered else 0
            if inside > 8 and inside * 32 > len(ordered):
                ordered.extend(tail)
                ordered.sort()
            else:
                for key in tail[:inside]:
                    insort(ordered, key)
                ordered.extend(tail[inside:])
        return ordered

    def _reindex(self) -> None:
        self._scanned = False
        self._groups = {}
        self._group_low = self._group_high = None
        self._sorted = None
        self._tail = []
        self._gone = set()
        if self._group_of is not None:
            for key in {**self.flushing, **self.pending}:
                self._index(key)

    def _ungrouped(self) -> Iterator[bytes]:
        group_of = self._group_of
        for key in {**self.flushing, **self.pending}:
            if group_of is None or group_of(key) is None:
                yield key

    def _may_hold_groups(self, start: bytes, end: bytes | None) -> bool:
        """Whether [start, end) can hold a grouped key: it overlaps [lowest group, just
        past the highest group's keys)."""
        low, high = self._group_low, self._group_high
        if low is None or high is None or (end is not None and end <= low):
            return False
        past_high = prefix_range(high)[1]
        return past_high is None or start < past_high

    def _grouped_in(self, start: bytes, end: bytes | None) -> list[bytes]:
        return [
            key
            for keys in self._groups.values()
            for key in keys
            if start <= key and (end is None or key < end)
        ]

    def _scan_keys(
        self, keys: Iterable[bytes], start: bytes, end: bytes
    ) -> Iterator[tuple[bytes, bytes]]:
        """A scan inside one group, whose buffered keys are ``keys`` (unsorted, few). The
        store's part is read at once: a group is one key's entries (a join's partners)."""
        stored = iter(self.store.range_items(start, end))
        hits = [key for key in keys if start <= key < end]
        if not hits:
            return stored
        hits.sort()
        return _merge(self._newest(hits), stored)

    def _newest(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, bytes | None]]:
        """Each buffered key with its newest value (None: deleted, or gone: see _gone)."""
        pending, flushing = self.pending, self.flushing
        for key in keys:
            value = pending.get(key, _MISSING)
            yield key, flushing.get(key) if value is _MISSING else value  # type: ignore[misc]

    # ------------------------------------------------------------ flushing

    @property
    def flush_interrupted(self) -> bool:
        """A previous flush did not finish: its writes may be in the changelog already."""
        return bool(self.flushing)

    def take_pending(self) -> Buffer:
        """Move pending writes to ``flushing`` and return everything being flushed (in no
        particular order)."""
        for hook in self._take_hooks:
            hook()
        if self.pending:
            if self.flushing:
                self.flushing.update(self.pending)
            else:
                self.flushing = self.pending
            self.pending = {}
        # from now on those keys are in ``flushing``: deleting one must be a write
        self._fresh = set()
        if self._stored_deletes:
            self._flushing_stored |= self._stored_deletes
            self._stored_deletes = set()
        return self.flushing

    def finish_flush(self, changelog_offset: int | None) -> None:
        """Apply the flushed writes to the store with the changelog offset they reached
        (nothing, if the partition was lost meanwhile: its store may be closed already)."""
        if self.abandoned:
            return
        if self.flushing:
            self.store.write(self.flushing, changelog_offset)
        self.flushing = {}
        self._flushing_stored = set()
        self._reindex()  # the index holds only what is still buffered

    def abandon(self) -> int:
        """Forget unflushed writes and unsent emitted records (the partition was lost);
        returns how many were dropped."""
        dropped = len(self.pending) + len(self.flushing) + len(self.outbox)
        self.abandoned = True
        self.outbox = []
        self.ttl = None
        self.pending = {}
        self.flushing = {}
        self._fresh = set()
        self._stored_deletes = set()
        self._flushing_stored = set()
        self._reindex()
        return dropped


def _merge(
    buffered: Iterator[tuple[bytes, bytes | None]], stored: Iterator[tuple[bytes, bytes]]
) -> Iterator[tuple[bytes, bytes]]:
    """Merge two key-sorted sources lazily; on equal keys the buffered one wins, and a None
    value (a buffered delete) hides the key."""
    following = next(stored, None)
    for key, value in buffered:
        while following is not None and following[0] < key:
            yield following
            following = next(stored, None)
        if following is not None and following[0] == key:
            following = next(stored, None)
        if value is not None:
            yield key, value
    if following is not None:
        yield following
        yield from stored
