"""Kafka v2 record batches built by hand for the changelog reader's tests."""

from __future__ import annotations

import struct

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

from streamjoin.runtime.changelog_records import Record

_ATTRIBUTES = 21  # v2 batch header: attributes int16, then lastOffsetDelta int32
_LAST_OFFSET_DELTA = 23
_CRC = 17
_CONTROL = 0x20


def batch(
    base: int,
    records: list[Record],
    *,
    producer_id: int = -1,
    transactional: bool = False,
    control: bool = False,
    last_offset: int | None = None,
) -> bytes:
    """A v2 record batch at ``base`` holding ``records`` (absolute offsets, gaps allowed).

    ``last_offset`` moves the batch's end past its last record, as compaction leaves it.
    """
    builder = DefaultRecordBatchBuilder(
        2,
        0,
        int(transactional),
        producer_id,
        0 if producer_id >= 0 else -1,
        0 if producer_id >= 0 else -1,
        1 << 20,
    )
    for offset, key, value in records:
        builder.append(offset - base, 1_700_000_000_000, key, value, [])
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base)
    if control or last_offset is not None:
        if control:
            (attributes,) = struct.unpack_from(">h", buf, _ATTRIBUTES)
            struct.pack_into(">h", buf, _ATTRIBUTES, attributes | _CONTROL)
        if last_offset is not None:
            struct.pack_into(">i", buf, _LAST_OFFSET_DELTA, last_offset - base)
        struct.pack_into(">I", buf, _CRC, calc_crc32c(bytes(buf[_ATTRIBUTES:])))
    return bytes(buf)


def marker(offset: int, producer_id: int, *, commit: bool) -> bytes:
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 0)
    return batch(
        offset, [(offset, key, value)], producer_id=producer_id, transactional=True, control=True
    )


def rec(offset: int) -> Record:
    return (offset, b"k%d" % offset, b"v%d" % offset)
