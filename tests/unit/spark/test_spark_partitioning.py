"""The Spark partitioner (JVM column, UDF) vs Kafka's murmur2 vectors and partition_for_key."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from streamjoin.partitioner import murmur2, partition_for_key, to_positive
from streamjoin.spark.partitioning import kafka_partition

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (apache/kafka, clients module)
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("key", "hashed"), KAFKA_VECTORS)
def test_kafka_partition_uses_kafkas_murmur2(key: bytes, hashed: int) -> None:
    assert murmur2(key) == hashed
    for n in (1, 7, 10, 12, 97):
        assert kafka_partition(bytearray(key), n) == to_positive(hashed) % n


def test_kafka_partition_null_key_has_no_partition() -> None:
    assert kafka_partition(None, 10) is None


def test_import_without_pyspark_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "import streamjoin, streamjoin.spark as s\n"
        "try:\n    s.require_pyspark()\nexcept streamjoin.errors.SparkNotInstalled as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install streamjoin[spark]" in out.stdout


@pytest.mark.spark
def test_jvm_column_and_udf_match_vectors_and_partition_for_key_on_random_keys() -> None:
    from pyspark.sql.functions import col

    from streamjoin.spark.partitioning import kafka_partition_udf, with_kafka_partition
    from streamjoin.spark.testing import shared_test_session

    spark = shared_test_session()
    rng = random.Random(42)
    keys: list[bytes | None] = [k for k, _ in KAFKA_VECTORS]
    keys += [rng.randbytes(rng.randrange(0, 40)) for _ in range(500)]
    keys.append(None)
    for n in (1, 10, 12):
        df = spark.createDataFrame([(i, k) for i, k in enumerate(keys)], "i int, key binary")
        placed = with_kafka_partition(df, n).withColumn("udf", kafka_partition_udf(n)(col("key")))
        rows = placed.collect()
        want = {i: None if k is None else partition_for_key(k, n) for i, k in enumerate(keys)}
        assert {r.i: r.kpart for r in rows} == want  # on the JVM
        assert {r.i: r.udf for r in rows} == want  # the Python UDF
