"""The join core: events and a state view in, join results out (pure: nothing awaited, no I/O).

Workers feed it records from Kafka over a changelogged table partition; Spark
backfills feed it the same records over a :class:`MemoryKeyValueView`. Every
decision (buffering, matching, window close, emission order, late data) is
made here, so both produce the same results. ``docs/joins.md`` states the
semantics; this module implements them.

Stream-stream state layout, one join partition per view: the windowed layout
of :mod:`streamjoin.state.window_layout`, which windowed tables use too (all
integers 8-byte big-endian, so byte order is numeric order; ``side`` is ``b"L"``
or ``b"R"``):

- ``META_KEY`` (``JOIN_STATE_KEY``: ``META + b"join-state"``) -> format version,
  stream time, buffered count, expiry hint;
- ``BUFFER_PREFIX + side + window_key(key, ts) + seq`` (``DATA``, sub-space
  ``side``, suffix ``seq``) -> the event's value: a key's buffered events on one
  side, in (timestamp, seq) order, so finding the matches of an event is one
  range scan;
- ``EXPIRY_PREFIX + ts + side + seq + length_prefixed(key)`` (``INDEX``, entry id
  ``side + seq + length_prefixed(key)``) -> matched flag: every buffered event in
  (timestamp, side, seq) order, so closing windows reads only what closed,
  already in emission order. The flag lives here, not beside the value, so
  marking an event matched rewrites one byte.

The per-event paths build these keys from the layout's constants with their own
``struct`` packing (the layout's functions check every argument; the core checks
its inputs once, in :class:`JoinInput`); ``tests/unit/state/test_window_layout.py``
checks that both build the same bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal, NamedTuple

from streamjoin.errors import CorruptJoinState, InvalidJoinInput, InvalidJoinSpec, JoinError
from streamjoin.joins.state import KeyValueView
from streamjoin.state.keys import KEY_LENGTH_BYTES, MAX_UINT64, length_prefixed
from streamjoin.state.window_layout import DATA, INDEX, JOIN_STATE_KEY, namespace_range

__all__ = [
    "BUFFER_PREFIX",
    "EXPIRY_PREFIX",
    "MAX_TIMESTAMP_MS",
    "META_KEY",
    "CorruptJoinState",
    "How",
    "InvalidJoinInput",
    "InvalidJoinSpec",
    "JoinError",
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

_META_VERSION = 1
_NO_EXPIRY = MAX_UINT64
_SIDE_BYTE: dict[Side, bytes] = {"left": b"L", "right": b"R"}
_SIDE_OF_BYTE: dict[int, Side] = {ord("L"): "left", ord("R"): "right"}
_MATCHED = b"\x01"
_UNMATCHED = b"\x00"
#: expiry index entries handled per scan; bounds memory when much closes at once
_EXPIRY_BATCH = 1_000
_U64 = 8
#: ``encode_uint64``/``decode_uint64`` without their checks, for the per-event path: inputs are
#: validated once, in JoinInput, and the bytes are the same (the tests pin the layout)
_PACK_U64 = struct.Struct(">Q").pack
_UNPACK_U64 = struct.Struct(">Q").unpack
_META_LAYOUT = struct.Struct(">BQQQ")


def _check_int(name: str, value: int, low: int, high: int, error: type[JoinError]) -> None:
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
        _check_int("window_ms", self.window_ms, 0, _MAX_DURATION_MS, InvalidJoinSpec)
        _check_int("grace_ms", self.grace_ms, 0, _MAX_DURATION_MS, InvalidJoinSpec)
        if self.how not in ("inner", "left", "outer"):
            raise InvalidJoinSpec(f"how must be 'inner', 'left' or 'outer', got {self.how!r}")

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
            raise InvalidJoinInput(f"side must be 'left' or 'right', got {self.side!r}")
        if not isinstance(self.key, bytes) or not isinstance(self.value, bytes):
            raise InvalidJoinInput(
                f"key and value are bytes, got {type(self.key).__name__}, "
                f"{type(self.value).__name__}"
            )
        _check_int("timestamp_ms", self.timestamp_ms, 0, MAX_TIMESTAMP_MS, InvalidJoinInput)
        _check_int("seq", self.seq, 0, MAX_UINT64, InvalidJoinInput)


@dataclass(frozen=True)
class JoinOutput:
    """A join result: a matched pair (both sides set, timestamp the later of the two)
    or, for left/outer joins, an unmatched event (other side None, its own timestamp)."""

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


class _Meta(NamedTuple):
    """The join partition's metadata (a named tuple: one is made per event, and a frozen
    dataclass costs several times more to build)."""

    stream_time_ms: int | None
    buffered: int
    #: no buffered event has a timestamp below this (a lower bound, or _NO_EXPIRY)
    expiry_hint_ms: int

    def encode(self) -> bytes:
        stream_time = -1 if self.stream_time_ms is None else self.stream_time_ms
        return _META_LAYOUT.pack(_META_VERSION, stream_time + 1, self.buffered, self.expiry_hint_ms)

    @classmethod
    def decode(cls, data: bytes | None) -> _Meta:
        if data is None:
            return cls(None, 0, _NO_EXPIRY)
        if len(data) != _META_LAYOUT.size or data[0] != _META_VERSION:
            raise CorruptJoinState(
                f"join metadata has format {data[:1]!r} and {len(data)} bytes; "
                f"expected format {_META_VERSION} and {_META_LAYOUT.size} bytes"
            )
        _, stream_time, buffered, hint = _META_LAYOUT.unpack(data)
        return cls(None if stream_time == 0 else stream_time - 1, buffered, hint)


def _buffer_key(side: Side, prefixed_key: bytes, timestamp_ms: int, seq: int) -> bytes:
    """``BUFFER_PREFIX + side + window_key(key, ts) + seq``; takes ``length_prefixed(key)``."""
    return (
        BUFFER_PREFIX + _SIDE_BYTE[side] + prefixed_key + _PACK_U64(timestamp_ms) + _PACK_U64(seq)
    )


def _expiry_key(side: Side, prefixed_key: bytes, timestamp_ms: int, seq: int) -> bytes:
    """``EXPIRY_PREFIX + ts + side + seq + length_prefixed(key)``."""
    return (
        EXPIRY_PREFIX + _PACK_U64(timestamp_ms) + _SIDE_BYTE[side] + _PACK_U64(seq) + prefixed_key
    )


def _split_expiry_key(entry: bytes) -> tuple[int, Side, int, bytes]:
    """``(timestamp, side, seq, length_prefixed(key))`` of an expiry index key."""
    head = len(EXPIRY_PREFIX)
    fixed = head + _U64 + 1 + _U64
    side = _SIDE_OF_BYTE.get(entry[head + _U64]) if len(entry) > head + _U64 else None
    if side is None or len(entry) < fixed + KEY_LENGTH_BYTES:
        raise CorruptJoinState(f"malformed join expiry entry {entry!r}")
    key_length = int.from_bytes(entry[fixed : fixed + KEY_LENGTH_BYTES], "big")
    if len(entry) != fixed + KEY_LENGTH_BYTES + key_length:
        raise CorruptJoinState(f"malformed join expiry entry {entry!r}")
    return (
        _UNPACK_U64(entry[head : head + _U64])[0],
        side,
        _UNPACK_U64(entry[head + _U64 + 1 : fixed])[0],
        entry[fixed:],
    )


class StreamStreamJoin:
    """A windowed stream-stream join over one partition's state.

    All state lives in ``view`` (stream time included), so a new instance over
    the same view continues exactly where the last one stopped: after a
    restart, or on the worker a partition moved to. Stream time is the largest
    timestamp this partition has seen, on either side.
    """

    def __init__(self, spec: JoinSpec, view: KeyValueView) -> None:
        self.spec = spec
        self.view = view
        self._saved_meta: tuple[bytes | None, _Meta] = (None, _Meta.decode(None))
        self.stats = JoinStats(buffered=self._meta().buffered)

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
        spec = self.spec
        self.stats.processed += 1
        meta = self._meta()
        if meta.stream_time_ms is not None:
            lateness = meta.stream_time_ms - event.timestamp_ms
            if lateness > spec.window_ms + spec.grace_ms:
                self.stats.late += 1
                return []
            if lateness > spec.grace_ms:
                self.stats.beyond_grace += 1
        outputs, meta = self._advance(meta, event.timestamp_ms)

        other: Side = "right" if event.side == "left" else "left"
        prefixed = length_prefixed(event.key)
        # partners closed at the current stream time never match, even while they are still
        # stored (see JoinSpec.expiry_slack_ms)
        now = meta.stream_time_ms  # set by _advance
        closed_below = 0 if now is None else spec.closes_before(now)
        lowest = max(0, event.timestamp_ms - spec.window_ms, closed_below)
        partners = list(
            self.view.scan(
                _buffer_key(other, prefixed, lowest, 0),
                _buffer_key(other, prefixed, event.timestamp_ms + spec.window_ms + 1, 0),
            )
        )
        track_other = spec.emits_unmatched(other)
        for partner_key, value in partners:
            partner_ms = _UNPACK_U64(partner_key[-2 * _U64 : -_U64])[0]
            left, right = (event.value, value) if event.side == "left" else (value, event.value)
            outputs.append(JoinOutput(event.key, left, right, max(event.timestamp_ms, partner_ms)))
            if track_other:
                partner_seq = _UNPACK_U64(partner_key[-_U64:])[0]
                partner_index = _expiry_key(other, prefixed, partner_ms, partner_seq)
                if self.view.get(partner_index) != _MATCHED:
                    self.view.put(partner_index, _MATCHED)
        self.stats.matched += len(partners)

        buffer_key = _buffer_key(event.side, prefixed, event.timestamp_ms, event.seq)
        index_key = _expiry_key(event.side, prefixed, event.timestamp_ms, event.seq)
        buffered = meta.buffered
        replay = self.view.get(buffer_key) is not None
        if replay:
            # an at-least-once replay of an event already buffered: joined again
            # above (duplicates are allowed), stored and counted once
            matched = bool(partners) or self.view.get(index_key) == _MATCHED
        else:
            matched = bool(partners)
            buffered += 1
        self.view.put(buffer_key, event.value)
        self.view.put(index_key, _MATCHED if matched else _UNMATCHED)
        meta = _Meta(
            meta.stream_time_ms,
            buffered,
            min(meta.expiry_hint_ms, event.timestamp_ms),
        )
        self._save(meta)
        return outputs

    def advance(self, stream_time_ms: int) -> list[JoinOutput]:
        """Move stream time forward (never back) and close every window that ends
        before it: unmatched events in (timestamp, side, seq) order, for left/outer."""
        _check_int("stream_time_ms", stream_time_ms, 0, MAX_TIMESTAMP_MS, InvalidJoinInput)
        meta = self._meta()
        outputs, new_meta = self._advance(meta, stream_time_ms)
        if new_meta != meta:
            self._save(new_meta)
        return outputs

    # ---------------------------------------------------------------- internals

    def _meta(self) -> _Meta:
        data = self.view.get(META_KEY)
        # the view hands back what _save put, unless the state changed under us (a restore)
        if data is None or data != self._saved_meta[0]:
            self._saved_meta = (data, _Meta.decode(data))
        return self._saved_meta[1]

    def _save(self, meta: _Meta) -> None:
        data = meta.encode()
        self.view.put(META_KEY, data)
        self._saved_meta = (data, meta)
        self.stats.buffered = meta.buffered

    def _advance(self, meta: _Meta, stream_time_ms: int) -> tuple[list[JoinOutput], _Meta]:
        """Stream time to ``max(current, stream_time_ms)``, closed windows expired; the
        caller saves the returned metadata."""
        current = meta.stream_time_ms
        if current is not None and stream_time_ms <= current:
            return [], meta
        cutoff = self.spec.closes_before(stream_time_ms)
        if cutoff <= meta.expiry_hint_ms + self.spec.expiry_slack_ms:
            # nothing buffered is old enough to close (or not enough of it): skip the scan
            return [], _Meta(stream_time_ms, meta.buffered, meta.expiry_hint_ms)
        outputs: list[JoinOutput] = []
        removed = 0
        index_end = EXPIRY_PREFIX + _PACK_U64(cutoff)
        # nothing is buffered below the hint: start there, not at the index's first key (the
        # range before it may hold many deletes not yet compacted away)
        index_start = EXPIRY_PREFIX + _PACK_U64(meta.expiry_hint_ms)
        # One scan finds both what closed and the first entry still open (the next hint).
        following: bytes | None = None
        while following is None:
            closed: list[tuple[bytes, bytes]] = []
            for index_key, flag in self.view.scan(index_start, _EXPIRY_END):
                if index_key >= index_end:
                    following = index_key
                    break
                closed.append((index_key, flag))
                if len(closed) == _EXPIRY_BATCH:
                    break
            # the scan is left behind before anything is written
            for index_key, flag in closed:
                timestamp_ms, side, seq, prefixed = _split_expiry_key(index_key)
                buffer_key = _buffer_key(side, prefixed, timestamp_ms, seq)
                if flag != _MATCHED and self.spec.emits_unmatched(side):
                    value = self.view.get(buffer_key)
                    if value is None:
                        raise CorruptJoinState(f"join expiry entry {index_key!r} has no event")
                    left, right = (value, None) if side == "left" else (None, value)
                    outputs.append(
                        JoinOutput(prefixed[KEY_LENGTH_BYTES:], left, right, timestamp_ms)
                    )
                self.view.delete(buffer_key)
                self.view.delete(index_key)
            removed += len(closed)
            if len(closed) < _EXPIRY_BATCH:
                break  # the index ends here (or ``following`` was found)
            index_start = closed[-1][0] + b"\x00"  # the next batch starts past this one
        hint = _NO_EXPIRY if following is None else _split_expiry_key(following)[0]
        self.stats.expired += removed
        self.stats.unmatched_emitted += len(outputs)
        return outputs, _Meta(stream_time_ms, max(0, meta.buffered - removed), hint)


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
            raise InvalidJoinSpec(f"how must be 'inner', 'left' or 'outer', got {self.how!r}")

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
            raise InvalidJoinInput(f"side must be 'left' or 'right', got {side!r}")
        new_left, new_right = (value, right) if side == "left" else (left, value)
        before, after = self.has_row(left, right), self.has_row(new_left, new_right)
        if after:
            if before and (left, right) == (new_left, new_right):
                return None
            return TableJoinChange(key, new_left, new_right)
        if before:
            return TableJoinChange(key, new_left, new_right, deleted=True)
        return None
