"""Kafka's Java-compatible key partitioner (pure: no I/O, no Kafka client).

Records with the same key must land on the same partition whichever client
produced them, or co-partitioned joins silently miss matches. So this is a
bit-for-bit port of ``org.apache.kafka.common.utils.Utils.murmur2`` and of the
keyed path of the Java producer's partitioner::

    partition = toPositive(murmur2(keyBytes)) % numPartitions

pinned by the golden vectors of Kafka's ``UtilsTest.testMurmur2``.

Null keys are *not* hashed: Kafka's default partitioner spreads them
(sticky/random) instead, so :func:`partition_for_key` rejects ``None`` and the
caller lets the producer choose.

Every keyed record sent and every table access goes through here, and a murmur2 in
Python costs about a microsecond: when the compiled ``streamjoin_native`` module is
installed (``native/``, built by ``scripts/bootstrap.sh`` where cargo is found),
``murmur2`` and ``partition_for_key`` of ``bytes`` use it (about 35 ns). The Python
functions below (:func:`pure_murmur2`, :func:`pure_partition_for_key`) are its twin,
kept as the fallback and compared with it by property tests;
``STREAMJOIN_PURE_PYTHON=1`` in the environment uses them even when it is installed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

from streamjoin.errors import ArgumentTypeError, ConfigurationError
from streamjoin.native import native_function

__all__ = [
    "NATIVE",
    "NATIVE_PARTITION_LIMIT",
    "murmur2",
    "native_partition",
    "partition_for_key",
    "partitions_for_keys",
    "pure_murmur2",
    "pure_partition_for_key",
    "to_positive",
]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF
_SIGN_BIT = 0x80000000
_UNPACK_BLOCKS = struct.Struct("<I").iter_unpack


#: to_positive(murmur2(key)) of keys seen lately: a stream's keys repeat (users, ads,
#: auctions), and a dict lookup costs a fraction of the hash in Python. Bounded: cleared
#: when full.
_POSITIVE_HASHES: dict[bytes, int] = {}
_CACHED_HASHES = 1 << 16


def pure_murmur2(data: bytes | bytearray | memoryview) -> int:
    """Kafka's murmur2 of ``data``, as Java's signed 32-bit ``int``.

    Java wraps on overflow, so every multiplication is masked back to 32 bits;
    Java's ``>>>`` is a plain ``>>`` on the (non-negative) masked value.
    """
    length = len(data)
    tail = length & 3
    body = length - tail
    m = _M
    mask = _MASK32
    h = (_SEED ^ length) & mask
    # 4-byte little-endian blocks, unpacked in C rather than byte by byte.
    for (k,) in _UNPACK_BLOCKS(data[:body]):
        k = (k * m) & mask
        # XOR commutes with masking, so one mask covers both products.
        h = ((h * m) ^ ((k ^ (k >> _R)) * m)) & mask
    if tail:
        # Java's fall-through switch XORs the 1-3 trailing bytes in little-endian order.
        h = ((h ^ int.from_bytes(data[body:], "little")) * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - 0x100000000 if h & _SIGN_BIT else h


def to_positive(n: int) -> int:
    """Java's ``Utils.toPositive``: clears the sign bit (it is *not* ``abs``)."""
    return n & 0x7FFFFFFF


def _check_partition_count(num_partitions: int) -> None:
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise ArgumentTypeError(
            f"num_partitions must be an int, got {type(num_partitions).__name__}"
        )
    if num_partitions < 1:
        raise ConfigurationError(f"num_partitions must be >= 1, got {num_partitions}")


def pure_partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's Java producer picks for the serialized ``key``.

    Raises :class:`~streamjoin.errors.ArgumentTypeError` for ``None``: the producer
    places null-keyed records itself, so hashing them here would disagree with Kafka.
    """
    if type(key) is bytes:
        positive = _POSITIVE_HASHES.get(key)
        if positive is not None and type(num_partitions) is int and num_partitions > 0:
            return positive % num_partitions
    _check_partition_count(num_partitions)
    if key is None:
        raise ArgumentTypeError(
            "cannot hash a None key: Kafka does not hash null keys; "
            "send with partition=None and let the producer place the record"
        )
    positive = to_positive(pure_murmur2(key))
    if type(key) is bytes:
        if len(_POSITIVE_HASHES) >= _CACHED_HASHES:
            _POSITIVE_HASHES.clear()
        _POSITIVE_HASHES[key] = positive
    return positive % num_partitions


def partitions_for_keys(keys: Iterable[bytes], num_partitions: int) -> list[int]:
    """:func:`partition_for_key` for each key, checking the partition count once."""
    _check_partition_count(num_partitions)
    out: list[int] = []
    for key in keys:
        if key is None:
            raise ArgumentTypeError(
                f"cannot hash a None key (item {len(out)}): Kafka does not hash null keys"
            )
        out.append(to_positive(murmur2(key)) % num_partitions)
    return out


def _native() -> tuple[Callable[[bytes], int], Callable[[bytes, int], int]] | None:
    """``streamjoin_native``'s murmur2 and partition, unless it is not installed or the
    environment asks for pure Python."""
    murmur2, partition = native_function("murmur2"), native_function("partition")
    return None if murmur2 is None or partition is None else (murmur2, partition)


_NATIVE = _native()
#: partition counts the compiled partition takes are below this (a signed 64-bit int)
NATIVE_PARTITION_LIMIT = 1 << 63
#: whether the compiled partitioner is in use
NATIVE = _NATIVE is not None
#: the compiled partition of a ``bytes`` key and an int count in (0,
#: :data:`NATIVE_PARTITION_LIMIT`), unchecked; None when it is not in use (for compiled
#: callers that check those themselves: ``quick_partition``)
native_partition: Callable[[bytes, int], int] | None = None if _NATIVE is None else _NATIVE[1]

if _NATIVE is None:
    murmur2 = pure_murmur2
    partition_for_key = pure_partition_for_key
else:
    _native_murmur2, _native_partition = _NATIVE

    def murmur2(data: bytes | bytearray | memoryview) -> int:
        """Kafka's murmur2 of ``data``, as Java's signed 32-bit ``int`` (compiled for
        ``bytes``; :func:`pure_murmur2` otherwise)."""
        if type(data) is bytes:
            return _native_murmur2(data)
        return pure_murmur2(data)

    def partition_for_key(key: bytes, num_partitions: int) -> int:
        """The partition Kafka's Java producer picks for the serialized ``key`` (compiled
        for ``bytes`` and a valid count; :func:`pure_partition_for_key`, which words the
        errors, otherwise)."""
        if (
            type(key) is bytes
            and type(num_partitions) is int
            and 0 < num_partitions < NATIVE_PARTITION_LIMIT
        ):
            return _native_partition(key, num_partitions)
        return pure_partition_for_key(key, num_partitions)
