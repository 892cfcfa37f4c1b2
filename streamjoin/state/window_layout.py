"""The one key layout of windowed state, shared by windowed tables and join buffers (pure).

A store partition holding windowed state is split into three namespaces by the
first byte of every key, so they never interleave (all integers are ``u64``:
8-byte big-endian, so byte order is numeric order):

- :data:`META` (``0x00``) ``+ name`` -> per-partition metadata (stream time...).
  Names are reserved here; integers are stored as ``u64``, never as text.
- :data:`INDEX` (``0x01``) ``+ u64(time) + entry id`` -> what expiry scans: one
  entry per data entry, in time order, so expiring reads only what expired.
  The entry id is whatever finds the data entry again (and keeps equal times apart).
- :data:`DATA` (``0x02``) ``+ [space] + window_key(key, time) + [suffix]`` -> the
  windows or events themselves. ``space`` is an optional fixed-width sub-space
  and ``suffix`` an optional fixed-width tail: every entry of one key in one
  space is contiguous and in time order, so a key's windows are one range scan.

Its two users (``lp`` is :func:`~streamjoin.state.keys.length_prefixed`, ``side``
is ``b"L"`` or ``b"R"``):

- windowed tables (:mod:`streamjoin.windowed`): :data:`STREAM_TIME_KEY` -> u64
  stream time (and, with ``emit="close"``, :data:`CLOSED_THROUGH_KEY` -> u64);
  ``INDEX + u64(start) + lp(key)`` -> ``b""``;
  ``DATA + window_key(key, start)`` -> value;
- join buffers (:mod:`streamjoin.joins.core`): :data:`JOIN_STATE_KEY` -> join
  metadata; ``INDEX + u64(ts) + side + u64(seq) + lp(key)`` -> matched flag;
  ``DATA + side + window_key(key, ts) + u64(seq)`` -> event value.

This module is the only place that defines these namespace bytes, metadata
names and key shapes; :mod:`streamjoin.state.keys` holds the store's other
reserved names and the encodings used here. Both users build their keys here:
with the checked functions, or (per event) with the precompiled packers and the
fast key builders below, which check nothing the caller has not checked already
and build the same bytes (``tests/unit/state/test_window_layout.py`` pins them).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, NamedTuple

from streamjoin.errors import IncompatibleWindowState, KeyEncodingError
from streamjoin.state.keys import (
    KEY_LENGTH_BYTES,
    MAX_UINT64,
    decode_uint64,
    encode_uint64,
    length_prefixed,
    prefix_range,
    split_window_key,
)

__all__ = [
    "CLOSED_THROUGH_KEY",
    "DATA",
    "INDEX",
    "JOIN_STATE_KEY",
    "LATEST_SESSION_PREFIX",
    "LEGACY_TABLE_STREAM_TIME_KEY",
    "META",
    "NAMESPACES",
    "SESSION_SPAN_KEY",
    "STREAM_TIME_KEY",
    "DataEntry",
    "data_group",
    "data_key",
    "data_key_prefix",
    "data_range",
    "decode_meta_int",
    "encode_meta_int",
    "index_key",
    "index_range",
    "join_buffer_key",
    "join_index_key",
    "meta_key",
    "namespace_range",
    "pack_join_index_head",
    "pack_key_length",
    "pack_time_seq",
    "pack_u64",
    "split_data_key",
    "split_index_key",
    "split_join_index_key",
    "strip_length_prefix",
    "table_data_key",
    "table_keys",
    "unpack_u64",
]

# ------------------------------------------------------------------ reserved names

#: per-partition metadata: ``META + name``
META: Final = b"\x00"
#: the time-ordered index expiry scans: ``INDEX + u64(time) + entry id``
INDEX: Final = b"\x01"
#: windows and events: ``DATA + [space] + window_key(key, time) + [suffix]``
DATA: Final = b"\x02"
NAMESPACES: Final = (META, INDEX, DATA)

_U64: Final = 8

# ------------------------------------------------------------------ precompiled packers
# The bytes of encode_uint64 and length_prefixed, without their checks: C calls for the
# per-event paths, whose callers check their inputs once (the join core in JoinInput's
# terms, windowed tables in table_keys).

#: ``u64(value)``
pack_u64: Final = struct.Struct(">Q").pack
#: ``(value,)`` of a u64
unpack_u64: Final = struct.Struct(">Q").unpack
#: the length in front of a key (:func:`~streamjoin.state.keys.length_prefixed`)
pack_key_length: Final = struct.Struct(">I").pack


def meta_key(name: bytes) -> bytes:
    """``META + name``: one per-partition metadata entry."""
    if not isinstance(name, bytes) or not name:
        raise KeyEncodingError(f"metadata names are non-empty bytes, got {name!r}")
    return META + name


#: windowed tables: the partition's stream time (largest event timestamp seen), a u64
STREAM_TIME_KEY: Final = meta_key(b"stream-time")
#: windowed tables that emit on close: the stream time through which windows are closed
#: (every window whose close time is at or before it sent its final result), a u64
CLOSED_THROUGH_KEY: Final = meta_key(b"closed-through")
#: session aggregations: the longest session (end - start, ms) the partition ever stored,
#: a u64: a session a record can reach starts at most that long before the record's reach,
#: so lookups and flush passes scan a bounded range instead of the key's whole history
SESSION_SPAN_KEY: Final = meta_key(b"session-span")
#: session aggregations: ``LATEST_SESSION_PREFIX + key`` -> the start of the key's latest
#: session, a u64: a record at or after it can reach that session only (a key's sessions
#: are more than a gap apart), read with one point lookup instead of a range scan
LATEST_SESSION_PREFIX: Final = meta_key(b"latest-session/")
#: join buffers: format version, stream time, buffered count, expiry hint
#: (encoded by :mod:`streamjoin.joins.core`)
JOIN_STATE_KEY: Final = meta_key(b"join-state")
#: where windowed tables kept their stream time (as ASCII digits) before this layout.
#: No key of this layout has that shape (as a DATA key it would claim a key of ~1.9 GB),
#: so finding it means the partition was written by an earlier version.
LEGACY_TABLE_STREAM_TIME_KEY: Final = DATA + b"stream-time"


def namespace_range(namespace: bytes) -> tuple[bytes, bytes]:
    """``(start, end)`` covering exactly the keys of one namespace."""
    if namespace not in NAMESPACES:
        raise KeyEncodingError(f"unknown namespace {namespace!r}")
    return namespace, bytes([namespace[0] + 1])


# ------------------------------------------------------------------ META


def encode_meta_int(value: int) -> bytes:
    """A metadata integer: u64."""
    return encode_uint64(value)


def decode_meta_int(key: bytes, raw: bytes) -> int:
    """Inverse of :func:`encode_meta_int`; ``key`` names the entry in the error.

    Anything but 8 bytes (the ASCII digits earlier versions wrote, say) is
    :class:`IncompatibleWindowState`, never a wrong number.
    """
    if len(raw) != _U64:
        raise IncompatibleWindowState(
            f"metadata {key!r} holds {raw!r}, not an 8-byte big-endian integer: this state "
            "was written in another layout (windowed tables written by streamjoin versions "
            "before the shared window layout must be reset: delete the state directory "
            "and the table's changelog topic)"
        )
    return int.from_bytes(raw, "big")


# ------------------------------------------------------------------ INDEX


def index_key(time_ms: int, entry_id: bytes) -> bytes:
    """``INDEX + u64(time) + entry_id``."""
    return INDEX + encode_uint64(time_ms) + entry_id


def split_index_key(entry: bytes) -> tuple[int, bytes]:
    """Inverse of :func:`index_key`: ``(time, entry_id)``."""
    if len(entry) < len(INDEX) + _U64 or not entry.startswith(INDEX):
        raise KeyEncodingError(f"malformed index entry {entry!r}")
    head = len(INDEX)
    return decode_uint64(entry[head : head + _U64]), entry[head + _U64 :]


def index_range(before_ms: int, from_ms: int = 0) -> tuple[bytes, bytes]:
    """``(start, end)`` covering the index entries with ``from_ms <= time < before_ms``.

    Empty (``start == end``) when ``before_ms <= from_ms``; ``before_ms`` may be
    ``2**64`` (everything from ``from_ms`` on).
    """
    start = INDEX + encode_uint64(from_ms)
    if before_ms <= from_ms:
        return start, start
    if before_ms > MAX_UINT64:
        return start, namespace_range(INDEX)[1]
    return start, INDEX + encode_uint64(before_ms)


# ------------------------------------------------------------------ DATA


class DataEntry(NamedTuple):
    """The parts of a data key (see :func:`data_key`)."""

    space: bytes
    key: bytes
    time_ms: int
    suffix: bytes


def data_key_prefix(key: bytes, space: bytes = b"") -> bytes:
    """``DATA + space + length_prefixed(key)``: common to every entry of ``key`` in ``space``."""
    return DATA + space + length_prefixed(key)


def data_key(key: bytes, time_ms: int, space: bytes = b"", suffix: bytes = b"") -> bytes:
    """``DATA + space + window_key(key, time) + suffix``.

    ``space`` and ``suffix`` must have the same width for every entry of a
    store (the split needs it; order needs it too).
    """
    return data_key_prefix(key, space) + encode_uint64(time_ms) + suffix


def split_data_key(entry: bytes, space_length: int = 0, suffix_length: int = 0) -> DataEntry:
    """Inverse of :func:`data_key`, given the widths of ``space`` and ``suffix``."""
    head = len(DATA) + space_length
    if not entry.startswith(DATA) or len(entry) < head + suffix_length:
        raise KeyEncodingError(f"malformed data entry {entry!r}")
    body_end = len(entry) - suffix_length
    try:
        key, time_ms = split_window_key(entry[head:body_end])
    except KeyEncodingError as exc:
        raise KeyEncodingError(f"malformed data entry {entry!r}: {exc}") from None
    return DataEntry(entry[len(DATA) : head], key, time_ms, entry[body_end:])


def data_range(key: bytes, from_ms: int, to_ms: int, space: bytes = b"") -> tuple[bytes, bytes]:
    """``(start, end)`` covering the entries of ``key`` in ``space`` whose time is in
    ``[from_ms, to_ms]`` (both inclusive, whatever their suffix), in time order.

    Empty (``start == end``) when ``to_ms < from_ms``.
    """
    prefix = data_key_prefix(key, space)
    start = prefix + encode_uint64(from_ms)
    if to_ms < from_ms:
        return start, start
    if to_ms >= MAX_UINT64:
        # just past every entry of ``key`` in ``space`` (never None: DATA is not 0xff)
        end = prefix_range(prefix)[1]
        assert end is not None
        return start, end
    return start, prefix + encode_uint64(to_ms + 1)


def strip_length_prefix(encoded: bytes) -> bytes:
    """Inverse of :func:`~streamjoin.state.keys.length_prefixed` (an index entry id's key)."""
    if len(encoded) < KEY_LENGTH_BYTES:
        raise KeyEncodingError(f"malformed length-prefixed key {encoded!r}")
    length = int.from_bytes(encoded[:KEY_LENGTH_BYTES], "big")
    if len(encoded) != KEY_LENGTH_BYTES + length:
        raise KeyEncodingError(f"length-prefixed key {encoded!r} does not match its length")
    return encoded[KEY_LENGTH_BYTES:]


def data_group(space_length: int = 0) -> Callable[[bytes], bytes | None]:
    """The grouping of data entries by key: ``DATA + space + length_prefixed(key)`` of an
    entry (None for anything else), for :meth:`TablePartition.group_keys_by
    <streamjoin.state.table_partition.TablePartition.group_keys_by>`.

    Every key that begins with a group gets that group back (the length prefix decides
    where the group ends), which is what lets a table partition answer a range scan inside
    one group from that group's buffered writes alone.
    """
    head = len(DATA) + space_length
    length_end = head + KEY_LENGTH_BYTES
    data_byte = DATA[0]

    def group_of(entry: bytes) -> bytes | None:
        if len(entry) < length_end or entry[0] != data_byte:
            return None
        end = length_end + int.from_bytes(entry[head:length_end], "big")
        return entry[:end] if len(entry) >= end else None

    return group_of


# ------------------------------------------------------------------ windowed tables

#: keys and window starts the table key builders pack directly (any other goes through the
#: checked functions, which pack the same bytes or raise)
_FAST_KEY_BYTES: Final = 1 << 16
_FAST_START_END: Final = 1 << 63


def table_keys(key: bytes, start_ms: int) -> tuple[bytes, bytes]:
    """A windowed table's ``(DATA + window_key(key, start), INDEX + u64(start) +
    length_prefixed(key))``: the window's value and its expiry index entry.

    Packed directly for ordinary keys (once per table access); through
    :func:`data_key` and :func:`index_key`, with their checks and errors, otherwise."""
    if type(key) is bytes and len(key) < _FAST_KEY_BYTES and 0 <= start_ms < _FAST_START_END:
        prefixed = pack_key_length(len(key)) + key
        at = pack_u64(start_ms)
        return DATA + prefixed + at, INDEX + at + prefixed
    return data_key(key, start_ms), index_key(start_ms, length_prefixed(key))


def table_data_key(key: bytes, start_ms: int) -> bytes:
    """The first of :func:`table_keys` alone (a read needs no index entry)."""
    if type(key) is bytes and len(key) < _FAST_KEY_BYTES and 0 <= start_ms < _FAST_START_END:
        return DATA + pack_key_length(len(key)) + key + pack_u64(start_ms)
    return data_key(key, start_ms)


# ------------------------------------------------------------------ join buffers
# Sides are b"L" and b"R"; keys arrive length-prefixed (a join core prefixes an event's
# key once and builds all its keys from it). The join core checks its inputs (JoinInput)
# and, per event, uses the packers below inline; these functions build the same bytes.

#: ``u64(ts) + u64(seq)``: the tail of a buffer key
pack_time_seq: Final = struct.Struct(">QQ").pack
_JOIN_INDEX_HEAD: Final = struct.Struct(">cQcQ")
#: ``(INDEX, ts, side, seq)`` -> ``INDEX + u64(ts) + side + u64(seq)``: an index entry
#: before its length-prefixed key
pack_join_index_head: Final = _JOIN_INDEX_HEAD.pack
#: the same and the key's length: every byte of an index entry but the key itself
_JOIN_INDEX_FIXED: Final = struct.Struct(">cQcQI")
_unpack_join_index_fixed: Final = _JOIN_INDEX_FIXED.unpack_from


def join_buffer_key(side: bytes, prefixed_key: bytes, time_ms: int, seq: int) -> bytes:
    """``DATA + side + window_key(key, ts) + u64(seq)``: a buffered event (its value)."""
    return DATA + side + prefixed_key + pack_time_seq(time_ms, seq)


def join_index_key(side: bytes, prefixed_key: bytes, time_ms: int, seq: int) -> bytes:
    """``INDEX + u64(ts) + side + u64(seq) + length_prefixed(key)``: a buffered event's
    expiry entry (its matched flag)."""
    return pack_join_index_head(INDEX, time_ms, side, seq) + prefixed_key


def split_join_index_key(entry: bytes) -> tuple[int, bytes, int, bytes]:
    """Inverse of :func:`join_index_key`: ``(ts, side, seq, length_prefixed(key))``."""
    if len(entry) >= _JOIN_INDEX_FIXED.size:
        namespace, time_ms, side, seq, key_length = _unpack_join_index_fixed(entry)
        if (
            namespace == INDEX
            and len(entry) == _JOIN_INDEX_FIXED.size + key_length
            and (side == b"L" or side == b"R")
        ):
            return time_ms, side, seq, entry[_JOIN_INDEX_HEAD.size :]
    raise KeyEncodingError(f"malformed join index entry {entry!r}")
