"""Kafka's key partitioner in Spark, so Spark groups records exactly like producers do.

Backfills must put each record in the join partition a worker would have seen it
in; anything else silently loses matches. Two forms, pinned to the same answers
(Kafka's murmur2 vectors and :func:`streamjoin.partitioner.partition_for_key` on
random keys, in the tests):

* :func:`kafka_partition_column`: murmur2 written as Spark SQL expressions, evaluated
  on the JVM. The jobs use it: a Python UDF sends every key to a Python worker and
  back, which cost more than the whole join (about 50 µs per record on local[2]).
* :func:`kafka_partition_udf`: a Python UDF calling ``partition_for_key`` itself.
"""

from __future__ import annotations

from typing import Any

from streamjoin.errors import ArgumentTypeError, ConfigurationError
from streamjoin.partitioner import partition_for_key
from streamjoin.spark._deps import require_pyspark

__all__ = [
    "kafka_partition",
    "kafka_partition_column",
    "kafka_partition_udf",
    "with_kafka_partition",
]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def kafka_partition(key: bytes | bytearray | None, num_partitions: int) -> int | None:
    """The partition of a serialized key; None for a null key (Kafka does not hash those)."""
    if key is None:
        return None
    return partition_for_key(bytes(key), num_partitions)


def kafka_partition_udf(num_partitions: int) -> Any:
    """A Spark UDF ``binary key -> int partition`` (null for null keys).

    A plain Python UDF rather than a pandas one: pandas/pyarrow are not
    dependencies, and the hashing dominates the cost either way.
    """
    require_pyspark()
    from pyspark.sql.functions import udf
    from pyspark.sql.types import IntegerType

    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise ArgumentTypeError(f"num_partitions must be an int, got {num_partitions!r}")
    if num_partitions < 1:
        raise ConfigurationError(f"num_partitions must be an int >= 1, got {num_partitions!r}")
    count = num_partitions

    def partition(key: bytearray | None) -> int | None:
        return kafka_partition(key, count)

    return udf(partition, IntegerType(), useArrow=False)


def _check_count(num_partitions: int) -> None:
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise ArgumentTypeError(f"num_partitions must be an int, got {num_partitions!r}")
    if num_partitions < 1:
        raise ConfigurationError(f"num_partitions must be an int >= 1, got {num_partitions!r}")


def _mul(value: str) -> str:
    """``value * m`` mod 2^32 for ``0 <= value < 2^32``: below 2^63, so no long overflows
    (Spark's ANSI mode would raise on one)."""
    return f"((({value}) * {_M}) & {_MASK32})"


def _byte(hex_key: str, index: str) -> str:
    """The unsigned byte at 0-based ``index`` of the key, read from its hex string."""
    return f"cast(conv(substr({hex_key}, 2 * ({index}) + 1, 2), 16, 10) as bigint)"


def kafka_partition_column(key: str, num_partitions: int) -> Any:
    """A Column: the Kafka partition of binary column ``key`` (null for a null key), computed
    on the JVM by Kafka's murmur2 (``Utils.murmur2``) in Spark SQL.

    Every 32-bit value is kept as a non-negative bigint below 2^32; multiplications by the
    constant stay below 2^63 and are masked back, shifts are unsigned."""
    require_pyspark()
    from pyspark.sql.functions import expr

    _check_count(num_partitions)
    h = f"hex(`{key}`)"
    n = f"octet_length(`{key}`)"
    blocks = f"filter(sequence(0, {n} div 4), i -> i < {n} div 4)"
    # a 4-byte block, little-endian: bytes 4i+3 .. 4i as hex, most significant first
    word = (
        f"cast(conv(concat(substr({h}, 8 * i + 7, 2), substr({h}, 8 * i + 5, 2), "
        f"substr({h}, 8 * i + 3, 2), substr({h}, 8 * i + 1, 2)), 16, 10) as bigint)"
    )
    k1 = _mul(word)
    # k ^= k >>> 24 after the first multiply; then multiply again
    k = _mul(f"aggregate(array({k1}), 0L, (z, a) -> a ^ shiftrightunsigned(a, 24))")
    body = f"aggregate({blocks}, ({_SEED} ^ {n}) & {_MASK32}, (acc, i) -> {_mul('acc')} ^ {k})"
    tail = f"{n} - {n} % 4"
    tail_bytes = (
        f"(case when {n} % 4 >= 3 then shiftleft({_byte(h, f'{tail} + 2')}, 16) else 0 end) ^ "
        f"(case when {n} % 4 >= 2 then shiftleft({_byte(h, f'{tail} + 1')}, 8) else 0 end) ^ "
        f"{_byte(h, tail)}"
    )
    with_tail = (
        f"(case when {n} % 4 = 0 then ({body}) else {_mul(f'({body}) ^ ({tail_bytes})')} end)"
    )
    mixed = f"aggregate(array({with_tail}), 0L, (z, a) -> a ^ shiftrightunsigned(a, 13))"
    mixed = _mul(mixed)
    final = f"aggregate(array({mixed}), 0L, (z, a) -> a ^ shiftrightunsigned(a, 15))"
    return expr(
        f"case when `{key}` is null then null "
        f"else cast((({final}) & 2147483647) % {num_partitions} as int) end"
    )


def with_kafka_partition(
    df: Any, num_partitions: int, *, key: str = "key", out: str = "kpart"
) -> Any:
    """``df`` plus column ``out``: the Kafka partition of its binary ``key`` column (on the
    JVM: :func:`kafka_partition_column`)."""
    return df.withColumn(out, kafka_partition_column(key, num_partitions))
