"""The key partitioner's common case for compiled callers.

:func:`streamjoin.partitioner.partition_for_key` is an interpreted wrapper that checks its
arguments and calls the compiled murmur2 (``streamjoin_native``) or its Python twin: a
Python frame per keyed send and table access. :func:`partition_of` is the same rule as a
compiled function that calls ``streamjoin_native`` directly for a ``bytes`` key and a
valid count, and hands everything else (errors included) to ``partition_for_key``.
"""

from __future__ import annotations

from typing import Any

from streamjoin.partitioner import NATIVE_PARTITION_LIMIT, native_partition, partition_for_key

__all__ = ["partition_of"]


def partition_of(key: Any, count: Any) -> int:
    """``partition_for_key(key, count)``: Kafka's partition of the serialized ``key``."""
    native = native_partition
    if (
        native is not None
        and type(key) is bytes
        and type(count) is int
        and 0 < count < NATIVE_PARTITION_LIMIT
    ):
        return native(key, count)
    return partition_for_key(key, count)
