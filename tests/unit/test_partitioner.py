"""Key partitioner: pinned to Kafka's Java golden vectors and cross-checked against aiokafka."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin import partitioner
from streamjoin.errors import ArgumentTypeError, ConfigurationError
from streamjoin.partitioner import murmur2, partition_for_key, partitions_for_keys, to_positive

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (apache/kafka, clients module).
KAFKA_UTILS_TEST_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(("data", "expected"), KAFKA_UTILS_TEST_VECTORS)
def test_murmur2_matches_kafka_utils_test_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_murmur2_empty_key_is_hashed() -> None:
    """An empty key is a key (not null): Kafka hashes it like any other."""
    assert murmur2(b"") == 275646681
    assert murmur2(b"") & 0xFFFFFFFF == aiokafka_murmur2(b"")


@pytest.mark.parametrize("data", [b"1234", b"234", b"34", b"4", b"12345", b"123456", b"1234567"])
def test_murmur2_every_tail_length_agrees_with_aiokafka(data: bytes) -> None:
    """Lengths 4k+0..3 exercise the block loop and each branch of Java's fall-through switch."""
    assert murmur2(data) & 0xFFFFFFFF == aiokafka_murmur2(data)


def test_murmur2_tail_bytes_are_little_endian() -> None:
    """Swapping tail bytes must change the hash (a big-endian tail would be a silent bug)."""
    assert murmur2(b"\x01\x02") != murmur2(b"\x02\x01")
    assert murmur2(b"abcd\x01\x02\x03") != murmur2(b"abcd\x03\x02\x01")


def test_murmur2_high_bytes_are_treated_as_unsigned() -> None:
    """Java sign-extends bytes unless masked with 0xff; Kafka masks, so must we."""
    for data in (b"\xff", b"\x80\xff", b"\xff\xfe\xfd", b"\xff\xff\xff\xff", b"\x80" * 9):
        assert murmur2(data) & 0xFFFFFFFF == aiokafka_murmur2(data)


def test_murmur2_accepts_other_buffers() -> None:
    assert murmur2(bytearray(b"foobar")) == -790332482
    assert murmur2(memoryview(b"foobar")) == -790332482


@settings(print_blob=True)
@given(st.binary(max_size=200))
def test_murmur2_agrees_with_aiokafka(data: bytes) -> None:
    """aiokafka returns the unsigned 32-bit value; ours is Java's signed int of the same bits."""
    ours = murmur2(data)
    assert INT32_MIN <= ours <= INT32_MAX
    assert ours & 0xFFFFFFFF == aiokafka_murmur2(data)


@settings(print_blob=True)
@given(st.binary(max_size=100), st.integers(min_value=1, max_value=10_000))
def test_partition_for_key_agrees_with_aiokafka_default_partitioner(
    key: bytes, num_partitions: int
) -> None:
    partitions = list(range(num_partitions))
    expected = DefaultPartitioner()(key, partitions, partitions)
    assert partition_for_key(key, num_partitions) == expected


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, 0),
        (1, 1),
        (-1, INT32_MAX),
        (INT32_MIN, 0),
        (INT32_MAX, INT32_MAX),
        (-973932308, 1173551340),
    ],
)
def test_to_positive_clears_the_sign_bit_not_abs(n: int, expected: int) -> None:
    assert to_positive(n) == expected


def test_partition_for_key_known_answers() -> None:
    # murmur2(b"21") = -973932308; toPositive -> 1173551340 = 12 * 97795945.
    assert partition_for_key(b"21", 12) == 0
    assert partition_for_key(b"21", 7) == 1173551340 % 7
    assert partition_for_key(b"abc", 1) == 0
    assert partition_for_key(b"abc", 7) == 479470107 % 7


def test_partition_for_key_rejects_none_key() -> None:
    with pytest.raises(ArgumentTypeError, match="does not hash null keys"):
        partition_for_key(None, 3)  # type: ignore[arg-type]
    # Callers catching TypeError keep working.
    assert issubclass(ArgumentTypeError, TypeError)


@pytest.mark.parametrize("bad", [0, -1])
def test_partition_for_key_rejects_non_positive_partition_counts(bad: int) -> None:
    with pytest.raises(ValueError, match=rf"num_partitions must be >= 1, got {bad}"):
        partition_for_key(b"k", bad)


@pytest.mark.parametrize("bad", [True, 3.0, "3", None])
def test_partition_for_key_rejects_non_int_partition_counts(bad: object) -> None:
    with pytest.raises(TypeError, match="num_partitions must be an int"):
        partition_for_key(b"k", bad)  # type: ignore[arg-type]


def test_partition_count_is_checked_before_the_key() -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        partition_for_key(None, 0)  # type: ignore[arg-type]


def test_partitions_for_keys_matches_one_at_a_time() -> None:
    keys = [b"", b"a", b"21", b"foobar", b"abc", b"\xff" * 13]
    assert partitions_for_keys(keys, 12) == [partition_for_key(k, 12) for k in keys]
    assert partitions_for_keys(iter(keys), 12) == [partition_for_key(k, 12) for k in keys]
    assert partitions_for_keys([], 5) == []


def test_partitions_for_keys_errors() -> None:
    with pytest.raises(ValueError, match="num_partitions must be >= 1"):
        partitions_for_keys([b"a"], 0)
    with pytest.raises(ValueError, match="num_partitions must be >= 1"):
        partitions_for_keys([], 0)
    with pytest.raises(ArgumentTypeError, match=r"item 1"):
        partitions_for_keys([b"a", None], 3)  # type: ignore[list-item]


def test_cached_hashes_give_the_same_partitions_and_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pure partitioner's cache (the compiled one needs none)."""
    partition_for_key = partitioner.pure_partition_for_key
    monkeypatch.setattr(partitioner, "_POSITIVE_HASHES", {})
    monkeypatch.setattr(partitioner, "_CACHED_HASHES", 7)  # overflows, and is cleared
    keys = [f"key-{i}".encode() for i in range(50)]
    expected = [to_positive(murmur2(k)) % 12 for k in keys]
    for _ in range(3):
        assert [partition_for_key(k, 12) for k in keys] == expected
        assert [partition_for_key(bytearray(k), 12) for k in keys] == expected
    assert len(partitioner._POSITIVE_HASHES) <= 7
    cached = keys[-1]
    assert cached in partitioner._POSITIVE_HASHES
    for bad in (0, -1, True, 2.0):
        with pytest.raises((ConfigurationError, ArgumentTypeError)):
            partition_for_key(cached, bad)  # type: ignore[arg-type]


# -- the compiled twin (native/, streamjoin_native) ----------------------------------------


def test_the_compiled_partitioner_is_in_use_where_bootstrap_can_build_it() -> None:
    """scripts/bootstrap.sh builds native/ wherever cargo is found: a machine with cargo
    whose partitioner is the pure one lost the compiled path without a word."""
    import os
    import shutil

    if os.environ.get("STREAMJOIN_PURE_PYTHON") == "1" or shutil.which("cargo") is None:
        assert partitioner.murmur2 is partitioner.pure_murmur2  # (the fallback, then)
        return
    assert partitioner.NATIVE, "cargo is on PATH but streamjoin_native is not installed"
    assert partitioner.murmur2 is not partitioner.pure_murmur2


@pytest.mark.parametrize(("data", "expected"), KAFKA_UTILS_TEST_VECTORS)
def test_the_pure_twin_matches_kafka_utils_test_vectors(data: bytes, expected: int) -> None:
    assert partitioner.pure_murmur2(data) == expected


@settings(print_blob=True, max_examples=500)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=2**31 - 1))
def test_compiled_and_pure_twins_give_identical_results(data: bytes, partitions: int) -> None:
    assert murmur2(data) == partitioner.pure_murmur2(data)
    assert partition_for_key(data, partitions) == partitioner.pure_partition_for_key(
        data, partitions
    )
    # (other buffers, huge counts and bad input take the pure path: same answers, same errors)
    assert murmur2(bytearray(data)) == partitioner.pure_murmur2(data)
    assert partition_for_key(data, 2**70 + partitions) == partitioner.pure_partition_for_key(
        data, 2**70 + partitions
    )
