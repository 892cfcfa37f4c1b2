"""Kafka's key partitioner as a Spark UDF, so Spark groups records exactly like producers do.

Backfills must put each record in the join partition a worker would have seen it
in; anything else silently loses matches. The UDF calls the same
:func:`streamjoin.partitioner.partition_for_key` the producer path uses (murmur2,
``& 0x7fffffff``, mod partitions), so there is one implementation to trust.
"""

from __future__ import annotations

from typing import Any

from streamjoin.errors import ArgumentTypeError, ConfigurationError
from streamjoin.partitioner import partition_for_key
from streamjoin.spark._deps import require_pyspark

__all__ = ["kafka_partition", "kafka_partition_udf", "with_kafka_partition"]


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


def with_kafka_partition(
    df: Any, num_partitions: int, *, key: str = "key", out: str = "kpart"
) -> Any:
    """``df`` plus column ``out``: the Kafka partition of its binary ``key`` column."""
    from pyspark.sql.functions import col

    return df.withColumn(out, kafka_partition_udf(num_partitions)(col(key)))
