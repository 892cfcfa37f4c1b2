"""Sortable binary keys for local state, and every reserved name of the on-disk layout (pure).

Stores order keys by unsigned byte comparison, so everything encoded here is
big-endian and fixed-width where order matters. The store's reserved names
(metadata column family and keys) live in this module; the namespaces and
metadata names *inside* a windowed store partition (windowed tables and join
buffers) live in :mod:`streamjoin.state.window_layout`, and nowhere else, so
that no two layers can pick colliding ones.
"""

from __future__ import annotations

from typing import Final

from streamjoin.errors import KeyEncodingError

__all__ = [
    "FORMAT_VERSION",
    "KEY_LENGTH_BYTES",
    "MAX_UINT64",
    "METADATA_COLUMN_FAMILY",
    "META_CHANGELOG_OFFSET",
    "META_FORMAT_VERSION",
    "META_PARTITION",
    "META_TABLE",
    "decode_uint64",
    "encode_uint64",
    "length_prefixed",
    "partition_column_family",
    "partition_metadata_key",
    "prefix_range",
    "split_window_key",
    "window_key",
    "window_key_prefix",
]

# ------------------------------------------------------------------ reserved names

#: on-disk layout version written into every RocksDB store partition; bump on incompatible
#: changes (2: a database per table, a column family per partition).
#: A store with another version is wiped at open and rebuilt from its changelog, so this
#: versions what a changelog replay rebuilds (the store and its metadata), not the keys
#: tables write: those come back from the changelog as they were written.
FORMAT_VERSION: Final = 2
#: RocksDB column family holding every partition's metadata, out of the user key space
#: entirely; a partition's keys there start with ``b"<partition>/"`` (see
#: :func:`partition_metadata_key`)
METADATA_COLUMN_FAMILY: Final = "streamjoin-metadata"
META_FORMAT_VERSION: Final = b"format-version"
META_TABLE: Final = b"table"
META_PARTITION: Final = b"partition"
META_CHANGELOG_OFFSET: Final = b"changelog-offset"


def partition_metadata_key(partition: int, name: bytes) -> bytes:
    """Where partition ``partition``'s metadata ``name`` lives in the metadata column family."""
    return b"%d/%s" % (partition, name)


def partition_column_family(partition: int) -> str:
    """The column family holding partition ``partition``'s keys."""
    return str(partition)


# ------------------------------------------------------------------ encodings

KEY_LENGTH_BYTES: Final = 4
_MAX_KEY_LENGTH: Final = (1 << (8 * KEY_LENGTH_BYTES)) - 1
_UINT64_BYTES: Final = 8
MAX_UINT64: Final = (1 << 64) - 1


def encode_uint64(value: object) -> bytes:
    """8-byte big-endian: byte order equals numeric order. (``object``: the check below
    must see what it was given; compiled, an ``int`` parameter would turn True into 1.)"""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UINT64:
        raise KeyEncodingError(f"expected an int in [0, 2**64), got {value!r}")
    return value.to_bytes(_UINT64_BYTES, "big")


def decode_uint64(data: bytes) -> int:
    if len(data) != _UINT64_BYTES:
        raise KeyEncodingError(f"expected {_UINT64_BYTES} bytes, got {len(data)}")
    return int.from_bytes(data, "big")


def length_prefixed(key: object) -> bytes:
    """``key`` behind its 4-byte big-endian length.

    The prefix keeps a key's entries contiguous whatever bytes follow it:
    without it, ``b"a" + start`` and ``b"ab" + start`` could interleave.
    """
    if not isinstance(key, bytes):
        raise KeyEncodingError(f"keys are bytes, got {type(key).__name__}")
    if len(key) > _MAX_KEY_LENGTH:
        raise KeyEncodingError(f"key of {len(key)} bytes exceeds the {_MAX_KEY_LENGTH} limit")
    return len(key).to_bytes(KEY_LENGTH_BYTES, "big") + key


def window_key_prefix(key: bytes) -> bytes:
    """The common prefix of every window of ``key`` (see :func:`window_key`)."""
    return length_prefixed(key)


def window_key(key: bytes, window_start_ms: int) -> bytes:
    """Length-prefixed key, then the 8-byte big-endian window start.

    All windows of one key are contiguous and in start order; keys sort by
    (length, bytes), which is all a range scan per key needs.
    """
    return length_prefixed(key) + encode_uint64(window_start_ms)


def split_window_key(encoded: bytes) -> tuple[bytes, int]:
    """Inverse of :func:`window_key`: ``(key, window_start_ms)``."""
    if len(encoded) < KEY_LENGTH_BYTES + _UINT64_BYTES:
        raise KeyEncodingError(f"window key too short ({len(encoded)} bytes)")
    length = int.from_bytes(encoded[:KEY_LENGTH_BYTES], "big")
    if len(encoded) != KEY_LENGTH_BYTES + length + _UINT64_BYTES:
        raise KeyEncodingError(
            f"window key of {len(encoded)} bytes does not match its key length {length}"
        )
    key_end = KEY_LENGTH_BYTES + length
    return encoded[KEY_LENGTH_BYTES:key_end], decode_uint64(encoded[key_end:])


def prefix_range(prefix: bytes) -> tuple[bytes, bytes | None]:
    """``(start, end)`` covering exactly the keys that begin with ``prefix``.

    ``end`` is the smallest key greater than every key with the prefix: drop
    trailing 0xff bytes and increment the last remaining one. None (unbounded)
    when the prefix is empty or all 0xff.
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return prefix, None
    return prefix, stripped[:-1] + bytes([stripped[-1] + 1])
