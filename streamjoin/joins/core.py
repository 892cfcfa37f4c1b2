"""The join core: events and a state view in, join results out (pure: nothing awaited, no I/O).

Workers feed it records from Kafka over a changelogged table partition; Spark
backfills feed it the same records over a :class:`MemoryKeyValueView`. Every
decision (buffering, matching, window close, emission order, late data) is
made here, so both produce the same results. ``docs/joins.md`` states the
semantics; this module implements them.

Stream-stream state, one join partition per view, is in the windowed layout of
:mod:`streamjoin.state.window_layout` (which windowed tables use too, and which
builds every key of it):

- ``META_KEY`` (``JOIN_STATE_KEY``) -> format version, stream time, buffered count,
  expiry hint and, per side, the seq from which no event can be buffered yet (format
  2; format 1, without them, is still read);
- a buffer key (``DATA``, sub-space ``side``, suffix ``seq``) -> the event's value:
  a key's buffered events on one side, in (timestamp, seq) order, so finding the
  matches of an event is one range scan;
- an index entry (``INDEX``, entry id ``side + seq + length_prefixed(key)``) ->
  matched flag: every buffered event in (timestamp, side, seq) order, so closing
  windows reads only what closed, already in emission order. The flag lives here,
  not beside the value, so marking an event matched rewrites one byte.

The per-event path builds these keys inline with the layout's precompiled packers
(its inputs are checked once, as :class:`JoinInput` checks them).

While the buffer is small enough (:data:`TRACKED_KEYS_MAX` events), the core also keeps
the buffer keys of each group in memory, so an event whose key has nothing on the other
side reads nothing. Over a view that announces its flushes (a table partition, of which
the core is the only writer between flushes), it trusts that knowledge further: partners
are read by key (no range read), and the index entries are kept in a heap in index
order too, so closing windows pops them instead of scanning the index (the stored index
is still written: it is what a restart reads).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from typing import Literal, NamedTuple

from streamjoin.errors import ConfigurationError, CorruptJoinState, JoinError, KeyEncodingError
from streamjoin.joins.state import FlushedKeyValueView, KeyValueView
from streamjoin.state.keys import KEY_LENGTH_BYTES, MAX_UINT64
from streamjoin.state.window_layout import (
    DATA,
    INDEX,
    JOIN_STATE_KEY,
    data_group,
    namespace_range,
    pack_join_index_head,
    pack_key_length,
    pack_time_seq,
    pack_u64,
    split_join_index_key,
    unpack_u64,
)

__all__ = [
    "BUFFER_GROUP_OF",
    "BUFFER_PREFIX",
    "EXPIRY_PREFIX",
    "MAX_TIMESTAMP_MS",
    "META_KEY",
    "How",
    "JoinInput",
    "JoinOutput",
    "JoinSpec",
    "JoinStats",
    "Side",
    "StreamStreamJoin",
    "TableJoinChange",
    "TableTableJoin",
]

How = Literal["inner", "left", "outer"]
Side = Literal["left", "right"]

#: Kafka timestamps are int64; keeping ours there leaves room for ``ts + window + grace``
MAX_TIMESTAMP_MS = (1 << 63) - 1
_MAX_DURATION_MS = 1 << 62

META_KEY = JOIN_STATE_KEY
EXPIRY_PREFIX = INDEX
BUFFER_PREFIX = DATA
_EXPIRY_END = namespace_range(INDEX)[1]  # the expiry index is all of [EXPIRY_PREFIX, _EXPIRY_END)
_BUFFER_END = namespace_range(DATA)[1]
#: a join core keeps the buffer keys of each key's buffered events in memory (see
#: StreamStreamJoin._buffered_keys) while at most this many events are buffered; past it,
#: every event reads its partners' range and closing windows scans the index
TRACKED_KEYS_MAX = 100_000
#: the buffer's events grouped by side and key (``BUFFER_PREFIX + side + length_prefixed(key)``):
#: finding an event's partners is a scan inside one group (see TablePartition.group_keys_by)
BUFFER_GROUP_OF = data_group(space_length=1)

_META_VERSION = 2
_META_VERSION_1 = 1
#: a side's "fresh from" seq when it is not known (state written in format 1): every
#: event's buffer key is looked up
_UNKNOWN_SEQ = MAX_UINT64
_NO_EXPIRY = MAX_UINT64
_SIDE_BYTE: dict[Side, bytes] = {"left": b"L", "right": b"R"}
#: per side: its byte, the other side's, and the heads of their groups (``BUFFER_PREFIX +
#: side``), for the per-event path
_SIDE_KEYS: dict[Side, tuple[bytes, bytes, bytes, bytes]] = {
    "left": (b"L", b"R", BUFFER_PREFIX + b"L", BUFFER_PREFIX + b"R"),
    "right": (b"R", b"L", BUFFER_PREFIX + b"R", BUFFER_PREFIX + b"L"),
}
_MATCHED = b"\x01"
_UNMATCHED = b"\x00"
#: expiry index entries handled per scan; bounds memory when much closes at once
_EXPIRY_BATCH = 1_000
_U64 = 8
_META_LAYOUT = struct.Struct(">BQQQQQ")
_META_LAYOUT_1 = struct.Struct(">BQQQ")
#: where a group (``BUFFER_PREFIX + side + lp(key)``) has its side and its key, and an
#: index entry its timestamp
_SIDE_AT = len(BUFFER_PREFIX)
_GROUP_KEY_AT = _SIDE_AT + 1 + KEY_LENGTH_BYTES
_INDEX_TIME_AT = len(EXPIRY_PREFIX)


def _check_int(
    name: str, value: int, low: int, high: int, error: type[ConfigurationError | JoinError]
) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{name} must be an int in [{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class JoinSpec:
    """A symmetric interval join: left and right events with the same key join when
    ``|ts_left - ts_right| <= window_ms``; buffered events wait ``grace_ms`` more for
    out-of-order partners before their window closes."""

    window_ms: int
    grace_ms: int
    how: How = "inner"

    def __post_init__(self) -> None:
        _check_int("window_ms", self.window_ms, 0, _MAX_DURATION_MS, ConfigurationError)
        _check_int("grace_ms", self.grace_ms, 0, _MAX_DURATION_MS, ConfigurationError)
        if self.how not in ("inner", "left", "outer"):
            raise ConfigurationError(f"how must be 'inner', 'left' or 'outer', got {self.how!r}")

    def emits_unmatched(self, side: Side) -> bool:
        """Whether an event of ``side`` that never matched is emitted when its window closes."""
        return self.how == "outer" or (self.how == "left" and side == "left")

    def closes_before(self, stream_time_ms: int) -> int:
        """Events with a timestamp below this have a closed window at ``stream_time_ms``.

        A window closes once ``stream_time > ts + window + grace``.
        """
        return stream_time_ms - self.window_ms - self.grace_ms

    @property
    def expiry_slack_ms(self) -> int:
        """How far past the oldest buffered event's close stream time may go before
        closed events are removed.

        Inner joins emit nothing when a window closes, and matching ignores closed
        events whether or not they are still stored, so their removal can wait and
        be done many at a time (one index scan per batch instead of one per event):
        an eighth of ``window + grace``, i.e. at most 12.5% more buffered state.
        Left and outer joins emit unmatched events as their windows close: no slack.
        """
        return (self.window_ms + self.grace_ms) // 8 if self.how == "inner" else 0


@dataclass(frozen=True)
class JoinInput:
    """One record of one side. ``seq`` is unique and increasing per side (the source
    offset, say): it orders events with equal timestamps and keeps buffer keys apart."""

    side: Side
    key: bytes
    value: bytes
    timestamp_ms: int
    seq: int

    def __post_init__(self) -> None:
        if self.side not in _SIDE_BYTE:
            raise JoinError(f"side must be 'left' or 'right', got {self.side!r}")
        if not isinstance(self.key, bytes) or not isinstance(self.value, bytes):
            raise JoinError(
                f"key and value are bytes, got {type(self.key).__name__}, "
                f"{type(self.value).__name__}"
            )
        _check_int("timestamp_ms", self.timestamp_ms, 0, MAX_TIMESTAMP_MS, JoinError)
        _check_int("seq", self.seq, 0, MAX_UINT64, JoinError)


class JoinOutput(NamedTuple):
    """A join result: a matched pair (both sides set, timestamp the later of the two)
    or, for left/outer joins, an unmatched event (other side None, its own timestamp).

    A named tuple: one is built per result, and a frozen dataclass costs several times more."""

    key: bytes
    left: bytes | None
    right: bytes | None
    timestamp_ms: int


@dataclass
class JoinStats:
    """Counters since this :class:`StreamStreamJoin` was built, except ``buffered``,
    which is read from the state and so survives restarts."""

    processed: int = 0  #: inputs given to process()
    matched: int = 0  #: pairs emitted
    unmatched_emitted: int = 0  #: unmatched events emitted at window close
    late: int = 0  #: inputs dropped because their window had closed
    beyond_grace: int = 0  #: inputs later than grace but accepted: their joins may be partial
    buffered: int = 0  #: events currently buffered
    expired: int = 0  #: buffered events removed at window close
    #: buffered events found below the expiry hint when the state was read (written after
    #: the metadata: a late flush of a worker that had lost the partition): removed unseen
    leftovers_dropped: int = 0


class _Meta(NamedTuple):
    """The join partition's metadata (a named tuple: one is made per event, and a frozen
    dataclass costs several times more to build)."""

    stream_time_ms: int | None
    buffered: int
    #: no buffered event has a timestamp below this (a lower bound, or _NO_EXPIRY)
    expiry_hint_ms: int
    #: per side, no buffered event has a seq at or above this (or _UNKNOWN_SEQ): an event
    #: past it cannot be a replay, so its buffer key needs no lookup
    fresh_left: int = 0
    fresh_right: int = 0

    def encode(self) -> bytes:
        stream_time = -1 if self.stream_time_ms is None else self.stream_time_ms
        return _META_LAYOUT.pack(
            _META_VERSION,
            stream_time + 1,
            self.buffered,
            self.expiry_hint_ms,
            self.fresh_left,
            self.fresh_right,
        )

    @classmethod
    def decode(cls, data: bytes | None) -> _Meta:
        if data is None:
            return cls(None, 0, _NO_EXPIRY)
        if len(data) == _META_LAYOUT.size and data[0] == _META_VERSION:
            _, stream_time, buffered, hint, fresh_left, fresh_right = _META_LAYOUT.unpack(data)
        elif len(data) == _META_LAYOUT_1.size and data[0] == _META_VERSION_1:
            _, stream_time, buffered, hint = _META_LAYOUT_1.unpack(data)
            # which seqs are buffered is not known, unless nothing is (no expiry hint)
            fresh_left = fresh_right = 0 if hint == _NO_EXPIRY else _UNKNOWN_SEQ
        else:
            raise CorruptJoinState(
                f"join metadata has format {data[:1]!r} and {len(data)} bytes; expected "
                f"format {_META_VERSION} and {_META_LAYOUT.size} bytes (or format "
                f"{_META_VERSION_1} and {_META_LAYOUT_1.size})"
            )
        return cls(
            None if stream_time == 0 else stream_time - 1, buffered, hint, fresh_left, fresh_right
        )


def _split_expiry_key(entry: bytes) -> tuple[int, bytes, int, bytes]:
    """``(timestamp, side byte, seq, length_prefixed(key))`` of an expiry index entry."""
    try:
        return split_join_index_key(entry)
    except KeyEncodingError:
        raise CorruptJoinState(f"malformed join expiry entry {entry!r}") from None


class StreamStreamJoin:
    """A windowed stream-stream join over one partition's state.

    All state lives in ``view`` (stream time included), so a new instance over
    the same view continues exactly where the last one stopped: after a
    restart, or on the worker a partition moved to. Stream time is the largest
    timestamp this partition has seen, on either side. (Over a view that
    announces its flushes, a table partition, the metadata reaches the view when
    a flush takes the writes: a new instance continues from the last flush, as a
    restarted worker does; see :class:`~streamjoin.joins.state.FlushedKeyValueView`.)
    """

    def __init__(self, spec: JoinSpec, view: KeyValueView) -> None:
        self.spec = spec
        self.view = view
        #: an event this much older than stream time has a closed window (it is late)
        self._open_ms = spec.window_ms + spec.grace_ms
        self._slack_ms = spec.expiry_slack_ms
        self._emits_unmatched = {
            b"L": spec.emits_unmatched("left"),
            b"R": spec.emits_unmatched("right"),
        }
        # The metadata, decoded, as plain attributes (see _Meta): read and written per event
        # without building a tuple. ``_meta_bytes`` is what the view held when they were
        # last read or saved: the view hands that very object back unless the state changed
        # under us (a flush read back from the store, a restore), which reloads them.
        self._meta_bytes: bytes | None = None
        self._now: int | None = None
        self._buffered = 0
        self._hint = _NO_EXPIRY
        self._fresh_left = 0
        self._fresh_right = 0
        #: the buffer keys of each group's buffered events (a group is a side and a key:
        #: ``BUFFER_PREFIX + side + lp(key)``; its keys in no particular order), or None (not
        #: known): an event whose key has none on the other side has no partner, and needs
        #: no read of the buffer (most events, in a join where most keys have one event per
        #: side). Known from an empty buffer on (or a scan of a small one), kept by this
        #: core's own inserts and expiries; dropped when the state changes under it.
        self._buffered_keys: dict[bytes, list[bytes]] | None = None
        #: over a view that announces its flushes, while ``_buffered_keys`` is known: every
        #: index entry as ``(index key, group, buffer key)``, a heap in index order (what
        #: closing windows would scan), else None
        self._expiry_heap: list[tuple[bytes, bytes, bytes]] | None = None
        self.stats = JoinStats()
        #: over a view that announces its flushes, the metadata is written once per flush
        #: (when it changed since the last one), not once per event; and the core, its only
        #: writer between flushes, trusts what it keeps in memory (see the module docstring)
        self._deferred = isinstance(view, FlushedKeyValueView)
        self._load_meta(view.get(META_KEY))
        self._dirty = False
        if isinstance(view, FlushedKeyValueView):
            view.before_take(self._write_meta)

    @property
    def stream_time_ms(self) -> int | None:
        """The largest timestamp seen (or advanced to); None before the first event."""
        return self._meta().stream_time_ms

    def process(self, event: JoinInput) -> list[JoinOutput]:
        """Join one event: closes the windows its timestamp closes, then emits its
        matches in (partner timestamp, partner seq) order and buffers it.

        An event whose own window has already closed (``ts + window + grace <
        stream time``) is late: it is dropped and counted, for every ``how``.
        """
        return self.process_record(
            event.side, event.key, event.value, event.timestamp_ms, event.seq
        )

    def process_record(
        self, side: Side, key: bytes, value: bytes, timestamp_ms: int, seq: int
    ) -> list[JoinOutput]:
        """:meth:`process` without building a :class:`JoinInput` (the worker's per-event
        path): the same checks, the same errors."""
        if not (
            type(key) is bytes
            and type(value) is bytes
            and type(timestamp_ms) is int
            and 0 <= timestamp_ms <= MAX_TIMESTAMP_MS
            and type(seq) is int
            and 0 <= seq <= MAX_UINT64
            and side in _SIDE_BYTE
        ):
            JoinInput(side, key, value, timestamp_ms, seq)  # raises JoinError if invalid
        view = self.view
        if not self._deferred:
            data = view.get(META_KEY)
            if data != self._meta_bytes:
                self._load_meta(data)
        stats = self.stats
        stats.processed += 1
        now = self._now
        if now is None or timestamp_ms > now:
            if timestamp_ms - self._open_ms <= self._hint + self._slack_ms:
                outputs = []  # nothing closes yet (the _advance shortcut, without the call)
                self._now = timestamp_ms
            else:
                outputs = self._advance(timestamp_ms)
            now = timestamp_ms
        else:
            lateness = now - timestamp_ms
            if lateness > self._open_ms:
                stats.late += 1
                return []
            if lateness > self.spec.grace_ms:
                stats.beyond_grace += 1
            outputs = []

        window_ms = self.spec.window_ms
        is_left = side == "left"
        side_byte, other_byte, group_head, partner_head = _SIDE_KEYS[side]
        prefixed = pack_key_length(len(key)) + key
        # partners closed at the current stream time never match, even while they are still
        # stored (see JoinSpec.expiry_slack_ms)
        lowest = timestamp_ms - window_ms
        closed = now - self._open_ms
        if closed > lowest:
            lowest = closed
        partner_group = partner_head + prefixed
        buffered_keys = self._buffered_keys
        partner_keys = None if buffered_keys is None else buffered_keys.get(partner_group)
        if partner_keys is None and buffered_keys is not None:
            partners: list[tuple[bytes, bytes]] = []  # nothing of this key on the other side
        else:
            start = partner_group + pack_time_seq(lowest if lowest > 0 else 0, 0)
            end = partner_group + pack_time_seq(timestamp_ms + window_ms + 1, 0)
            if partner_keys is not None and self._deferred:
                partners = self._read_partners(partner_group, partner_keys, start, end)
            else:
                partners = view.scan_group(partner_group, start, end)
        if partners:
            track_other = self._emits_unmatched[other_byte]
            for partner_key, partner_value in partners:
                partner_ms = unpack_u64(partner_key[-2 * _U64 : -_U64])[0]
                outputs.append(
                    JoinOutput(
                        key,
                        value if is_left else partner_value,
                        partner_value if is_left else value,
                        timestamp_ms if timestamp_ms > partner_ms else partner_ms,
                    )
                )
                if track_other:
                    partner_seq = unpack_u64(partner_key[-_U64:])[0]
                    partner_index = (
                        pack_join_index_head(EXPIRY_PREFIX, partner_ms, other_byte, partner_seq)
                        + prefixed
                    )
                    if view.get(partner_index) != _MATCHED:
                        view.put(partner_index, _MATCHED)
            stats.matched += len(partners)

        group = group_head + prefixed
        buffer_key = group + pack_time_seq(timestamp_ms, seq)
        index_key = pack_join_index_head(EXPIRY_PREFIX, timestamp_ms, side_byte, seq) + prefixed
        fresh = self._fresh_left if is_left else self._fresh_right
        if fresh != _UNKNOWN_SEQ and seq >= fresh:
            # no event of this side at or past ``fresh`` was buffered: not a replay
            self._insert(view, buffer_key, index_key, value, group, bool(partners))
            if is_left:
                self._fresh_left = seq + 1 if seq < _UNKNOWN_SEQ else _UNKNOWN_SEQ
            else:
                self._fresh_right = seq + 1 if seq < _UNKNOWN_SEQ else _UNKNOWN_SEQ
        elif view.get(buffer_key) is not None:
            # an at-least-once replay of an event already buffered: joined again
            # above (duplicates are allowed), stored and counted once
            matched = bool(partners) or view.get(index_key) == _MATCHED
            view.put(buffer_key, value)
            view.put(index_key, _MATCHED if matched else _UNMATCHED)
        else:
            self._insert(view, buffer_key, index_key, value, group, bool(partners))
        if timestamp_ms < self._hint:
            self._hint = timestamp_ms
        if self._deferred:
            self._dirty = True
            stats.buffered = self._buffered
        else:
            self._save_meta()
        return outputs

    def advance(self, stream_time_ms: int) -> list[JoinOutput]:
        """Move stream time forward (never back) and close every window that ends
        before it: unmatched events in (timestamp, side, seq) order, for left/outer."""
        _check_int("stream_time_ms", stream_time_ms, 0, MAX_TIMESTAMP_MS, JoinError)
        if not self._deferred:
            data = self.view.get(META_KEY)
            if data != self._meta_bytes:
                self._load_meta(data)
        if self._now is not None and stream_time_ms <= self._now:
            return []
        outputs = self._advance(stream_time_ms)
        if self._deferred:
            self._dirty = True
            self.stats.buffered = self._buffered
        else:
            self._save_meta()
        return outputs

    # ---------------------------------------------------------------- internals

    def _meta(self) -> _Meta:
        """The metadata as the view holds it now (or will at the next flush)."""
        if not self._deferred:
            data = self.view.get(META_KEY)
            if data != self._meta_bytes:
                self._load_meta(data)
        return _Meta(self._now, self._buffered, self._hint, self._fresh_left, self._fresh_right)

    def _load_meta(self, data: bytes | None) -> None:
        meta = _Meta.decode(data)
        self._meta_bytes = data
        self._now = meta.stream_time_ms
        self._buffered = meta.buffered
        self._hint = meta.expiry_hint_ms
        self._fresh_left = meta.fresh_left
        self._fresh_right = meta.fresh_right
        self.stats.buffered = meta.buffered
        self._buffered_keys = self._read_buffer_keys(meta)
        if self._buffered_keys is None:
            self._expiry_heap = None
            self._read_ranges()
        elif not self._deferred:
            self._expiry_heap = None
        else:
            self._expiry_heap = self._read_expiry_heap()

    def _read_buffer_keys(self, meta: _Meta) -> dict[bytes, list[bytes]] | None:
        """The buffer keys per group, read from the view (None: too many to keep).

        Also makes the fresh seqs true of the view: a flush cut short may have stored
        events its metadata does not count (their replays must find them buffered). Over
        a view that announces its flushes, events below the expiry hint are leftovers
        (see :meth:`_drop_leftover`)."""
        deferred = self._deferred
        if meta.expiry_hint_ms == _NO_EXPIRY and not deferred:
            return {}  # nothing is buffered
        if meta.buffered > TRACKED_KEYS_MAX:
            return None
        hint = meta.expiry_hint_ms
        buffered_keys: dict[bytes, list[bytes]] = {}
        seq_at = -_U64
        time_at = seq_at - _U64  # a buffer key is its group, u64(ts) and u64(seq)
        last_seq = {b"L": -1, b"R": -1}
        leftovers: list[tuple[bytes, bytes]] = []
        for count, (buffer_key, _) in enumerate(self.view.scan(BUFFER_PREFIX, _BUFFER_END)):
            if count == TRACKED_KEYS_MAX:
                return None
            group = buffer_key[:time_at]
            if deferred and unpack_u64(buffer_key[time_at:seq_at])[0] < hint:
                leftovers.append((buffer_key, group))
                continue
            side = group[_SIDE_AT : _SIDE_AT + 1]
            seq = unpack_u64(buffer_key[seq_at:])[0]
            if seq > last_seq[side]:
                last_seq[side] = seq
            keys = buffered_keys.get(group)
            if keys is None:
                buffered_keys[group] = [buffer_key]
            else:
                keys.append(buffer_key)
        for buffer_key, group in leftovers:
            self._drop_leftover(buffer_key, group)
        if self._fresh_left != _UNKNOWN_SEQ and last_seq[b"L"] >= self._fresh_left:
            self._fresh_left = min(last_seq[b"L"] + 1, _UNKNOWN_SEQ)
        if self._fresh_right != _UNKNOWN_SEQ and last_seq[b"R"] >= self._fresh_right:
            self._fresh_right = min(last_seq[b"R"] + 1, _UNKNOWN_SEQ)
        return buffered_keys

    def _read_expiry_heap(self) -> list[tuple[bytes, bytes, bytes]]:
        """The index entries of the view as :attr:`_expiry_heap` holds them (leftovers
        below the expiry hint dropped)."""
        heap: list[tuple[bytes, bytes, bytes]] = []
        hint = self._hint
        leftovers: list[bytes] = []
        for index_key, _ in self.view.scan(EXPIRY_PREFIX, _EXPIRY_END):
            timestamp_ms, side, seq, prefixed = _split_expiry_key(index_key)
            if timestamp_ms < hint:
                leftovers.append(index_key)  # (removed once the scan is left behind)
                continue
            group = BUFFER_PREFIX + side + prefixed
            heap.append((index_key, group, group + pack_time_seq(timestamp_ms, seq)))
        for index_key in leftovers:
            self._drop_leftover(index_key, None)
        heapify(heap)  # (a no-op: the scan is in index order)
        return heap

    def _drop_leftover(self, key: bytes, group: bytes | None) -> None:
        """Remove an entry (buffer or index) found below the expiry hint, unseen.

        Nothing this core buffers is below the hint its metadata holds, and both are
        flushed together; but under at-least-once a worker that lost the partition (frozen
        past its session timeout) can deliver the flush it had under way after the new
        owner's, so a restore holds events that owner had closed since, as they were
        before (an impression not yet matched). Their input is at or past the committed
        offsets that were replayed: dropping them loses nothing, closing them would emit
        them again (the range scans before in-memory keys never reached them)."""
        self.view.remove(key, group)
        if group is not None:
            self.stats.leftovers_dropped += 1

    def _forget_buffer_keys(self) -> None:
        """Stop keeping the buffer in memory (too big, or changed under the core): reads and
        expiry go to the view until the buffer is empty again."""
        self._buffered_keys = None
        self._expiry_heap = None
        self._read_ranges()

    def _read_ranges(self) -> None:
        """Over a table partition: have it index its buffered writes for the range reads of
        partners (until then, the core read them by key and it saved that work)."""
        if isinstance(self.view, FlushedKeyValueView):
            self.view.group_keys_by(BUFFER_GROUP_OF)

    def _read_partners(
        self, group: bytes, keys: list[bytes], start: bytes, end: bytes
    ) -> list[tuple[bytes, bytes]]:
        """``view.scan_group(group, start, end)``, read by key: ``keys`` are the group's."""
        hits = [key for key in keys if start <= key < end]
        if len(hits) > 1:
            hits.sort()
        get = self.view.get
        partners = []
        for key in hits:
            value = get(key)
            if value is None:  # not what the core buffered: read the range after all
                self._forget_buffer_keys()
                return self.view.scan_group(group, start, end)
            partners.append((key, value))
        return partners

    def _write_meta(self) -> None:
        """Before a flush takes the writes: the metadata, if it changed since the last."""
        if self._dirty:
            self._dirty = False
            self._save_meta()

    def _insert(
        self,
        view: KeyValueView,
        buffer_key: bytes,
        index_key: bytes,
        value: bytes,
        group: bytes,
        matched: bool,
    ) -> None:
        """Buffer a new event (not a replay) and its expiry entry, and keep its keys."""
        view.insert(buffer_key, value, group)
        view.insert(index_key, _MATCHED if matched else _UNMATCHED, None)
        self._buffered += 1
        buffered_keys = self._buffered_keys
        if buffered_keys is not None:
            if self._buffered > TRACKED_KEYS_MAX:
                self._forget_buffer_keys()  # too many to keep: read the buffer instead
                return
            keys = buffered_keys.get(group)
            if keys is None:
                buffered_keys[group] = [buffer_key]
            else:
                keys.append(buffer_key)
            heap = self._expiry_heap
            if heap is not None:
                heappush(heap, (index_key, group, buffer_key))

    def _save_meta(self) -> None:
        """Write the attributes back (``_Meta.encode``'s bytes)."""
        now = self._now
        data = _META_LAYOUT.pack(
            _META_VERSION,
            0 if now is None else now + 1,
            self._buffered,
            self._hint,
            self._fresh_left,
            self._fresh_right,
        )
        self.view.put(META_KEY, data)
        self._meta_bytes = data
        self.stats.buffered = self._buffered

    def _advance(self, stream_time_ms: int) -> list[JoinOutput]:
        """Stream time to ``stream_time_ms`` (past the current one), closed windows
        expired; the attributes are updated, the caller saves them."""
        cutoff = stream_time_ms - self._open_ms
        hint = self._hint
        if cutoff <= hint + self._slack_ms:
            # nothing buffered is old enough to close (or not enough of it): skip the scan
            self._now = stream_time_ms
            return []
        outputs: list[JoinOutput] = []
        index_end = EXPIRY_PREFIX + pack_u64(cutoff)
        heap = self._expiry_heap
        if heap is not None:
            closed: list[tuple[bytes, bytes, bytes]] = []
            while heap and heap[0][0] < index_end:
                closed.append(heappop(heap))
            following = heap[0][0] if heap else None
            # (every entry popped has its keys kept: the two change together)
            self._remove_closed(closed, None, outputs)
            removed = len(closed)
        else:
            following, removed = self._close_scanned(hint, index_end, outputs)
        self.stats.expired += removed
        self.stats.unmatched_emitted += len(outputs)
        self._now = stream_time_ms
        self._buffered = max(0, self._buffered - removed)
        if following is None:
            # an empty index (the scan saw its end) is an empty buffer: any seq is fresh,
            # and no key has anything buffered
            self._hint = _NO_EXPIRY
            self._fresh_left = self._fresh_right = 0
            self._buffered_keys = {}
            self._expiry_heap = [] if self._deferred else None
        else:
            self._hint = _split_expiry_key(following)[0]
        return outputs

    def _close_scanned(
        self, hint: int, index_end: bytes, outputs: list[JoinOutput]
    ) -> tuple[bytes | None, int]:
        """Remove the events whose index entries are below ``index_end``, found by scanning
        the index; ``(the first entry left, or None, how many were removed)``."""
        view = self.view
        removed = 0
        # nothing is buffered below the hint: start there, not at the index's first key (the
        # range before it may hold many deletes not yet compacted away)
        index_start = EXPIRY_PREFIX + pack_u64(hint)
        # One scan finds both what closed and the first entry still open (the next hint).
        following: bytes | None = None
        while following is None:
            scanned: list[tuple[bytes, bytes]] = []
            for index_key, flag in view.scan(index_start, _EXPIRY_END):
                if index_key >= index_end:
                    following = index_key
                    break
                scanned.append((index_key, flag))
                if len(scanned) == _EXPIRY_BATCH:
                    break
            # the scan is left behind before anything is written
            closed: list[tuple[bytes, bytes, bytes]] = []
            for index_key, _ in scanned:
                try:  # (not _split_expiry_key: one call less per closed event)
                    timestamp_ms, side, seq, prefixed = split_join_index_key(index_key)
                except KeyEncodingError:
                    raise CorruptJoinState(f"malformed join expiry entry {index_key!r}") from None
                group = BUFFER_PREFIX + side + prefixed
                closed.append((index_key, group, group + pack_time_seq(timestamp_ms, seq)))
            self._remove_closed(closed, [flag for _, flag in scanned], outputs)
            removed += len(closed)
            if len(closed) < _EXPIRY_BATCH:
                break  # the index ends here (or ``following`` was found)
            index_start = closed[-1][0] + b"\x00"  # the next batch starts past this one
        return following, removed

    def _remove_closed(
        self,
        closed: list[tuple[bytes, bytes, bytes]],
        flags: list[bytes] | None,
        outputs: list[JoinOutput],
    ) -> None:
        """Remove closed events, ``(index key, group, buffer key)`` in index order, and
        append the unmatched ones that are emitted to ``outputs``. ``flags`` are their
        matched flags (None: read those that are needed)."""
        view = self.view
        emits_unmatched = self._emits_unmatched
        any_unmatched = emits_unmatched[b"L"] or emits_unmatched[b"R"]
        buffered_keys = self._buffered_keys
        for at, (index_key, group, buffer_key) in enumerate(closed):
            if buffered_keys is not None:
                keys = buffered_keys.get(group)
                if keys is not None and buffer_key in keys:
                    if len(keys) == 1:
                        del buffered_keys[group]
                    else:
                        keys.remove(buffer_key)
                else:  # an event this core did not keep: stop trusting what it keeps
                    self._forget_buffer_keys()
                    buffered_keys = None
            # (an inner join emits nothing here: it skips the side and the flag)
            if any_unmatched and emits_unmatched[group[_SIDE_AT : _SIDE_AT + 1]]:
                flag = view.get(index_key) if flags is None else flags[at]
                if flag != _MATCHED:
                    value = view.get(buffer_key)
                    if value is None:
                        raise CorruptJoinState(f"join expiry entry {index_key!r} has no event")
                    is_left = group[_SIDE_AT : _SIDE_AT + 1] == b"L"
                    left, right = (value, None) if is_left else (None, value)
                    timestamp_ms = unpack_u64(index_key[_INDEX_TIME_AT : _INDEX_TIME_AT + _U64])[0]
                    outputs.append(JoinOutput(group[_GROUP_KEY_AT:], left, right, timestamp_ms))
            # both are present: the index entry was found, and it has its event
            view.remove(buffer_key, group)
            view.remove(index_key, None)


# ------------------------------------------------------------------ table-table


@dataclass(frozen=True)
class TableJoinChange:
    """The joined row of ``key`` changed: ``deleted`` means it disappeared (emit a
    tombstone); otherwise ``left``/``right`` are the row's current sides."""

    key: bytes
    left: bytes | None
    right: bytes | None
    deleted: bool = False


@dataclass(frozen=True)
class TableTableJoin:
    """A table maintained as the join of two tables, decided one update at a time.

    The caller owns both tables (it already stores them); this only decides
    whether a row exists (inner: both sides; left: left side; outer: either)
    and whether an update changed it.
    """

    how: How = "inner"

    def __post_init__(self) -> None:
        if self.how not in ("inner", "left", "outer"):
            raise ConfigurationError(f"how must be 'inner', 'left' or 'outer', got {self.how!r}")

    def has_row(self, left: bytes | None, right: bytes | None) -> bool:
        if self.how == "inner":
            return left is not None and right is not None
        if self.how == "left":
            return left is not None
        return left is not None or right is not None

    def update(
        self,
        key: bytes,
        side: Side,
        value: bytes | None,
        *,
        left: bytes | None,
        right: bytes | None,
    ) -> TableJoinChange | None:
        """Apply ``side``'s new ``value`` (None: deleted) given both sides' values before
        it; None when the joined row did not change (so nothing is emitted)."""
        if side not in _SIDE_BYTE:
            raise JoinError(f"side must be 'left' or 'right', got {side!r}")
        new_left, new_right = (value, right) if side == "left" else (left, value)
        before, after = self.has_row(left, right), self.has_row(new_left, new_right)
        if after:
            if before and (left, right) == (new_left, new_right):
                return None
            return TableJoinChange(key, new_left, new_right)
        if before:
            return TableJoinChange(key, new_left, new_right, deleted=True)
        return None
