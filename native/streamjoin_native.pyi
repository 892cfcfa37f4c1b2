"""Compiled hot paths of streamjoin; each has a pure-Python twin.

See streamjoin/partitioner.py and streamjoin/codecs.py.
"""

def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data``, as Java's signed 32-bit int."""

def partition(key: bytes, num_partitions: int) -> int:
    """``(murmur2(key) & 0x7fffffff) % num_partitions``: the Java producer's partition."""

def plain_json(obj: object) -> bool:
    """Whether ``obj`` is a dict (str keys) or list of scalars msgspec writes as ``json`` does."""
