"""The Confluent wire format (pure): a magic byte, a 4-byte big-endian schema id, the
payload. Every Confluent-compatible serializer (Java, Go, Python, Quix Streams) frames
records so, which is what lets a reader find the writer's schema in the registry."""

from __future__ import annotations

import struct

from streamjoin.codec_errors import preview
from streamjoin.errors import DecodeError

__all__ = ["HEADER_SIZE", "MAGIC", "frame", "header_of", "unframe"]

#: the first byte of every framed record (format version 0)
MAGIC = 0

_HEADER = struct.Struct(">bI")
#: bytes before the payload: the magic byte and the schema id
HEADER_SIZE = _HEADER.size


#: ``(magic byte, schema id)`` of a record's first bytes (``struct.error`` if too short): the
#: decode fast path, which leaves the checks and their messages to :func:`unframe`
header_of = _HEADER.unpack_from


def frame(schema_id: int, payload: bytes) -> bytes:
    """``payload`` behind the magic byte and ``schema_id``."""
    return _HEADER.pack(MAGIC, schema_id) + payload


def unframe(data: bytes | bytearray | memoryview) -> tuple[int, memoryview]:
    """The schema id and a view of the payload of a framed record.

    Raises :class:`DecodeError` for data too short to hold the header or starting with
    another byte than the magic byte (a record some other producer wrote: plain JSON,
    Avro without a registry...).
    """
    if len(data) < HEADER_SIZE:
        raise DecodeError(
            f"{len(data)} bytes are not in the Confluent wire format: a framed record has at "
            f"least {HEADER_SIZE} bytes (magic byte, 4-byte schema id); {preview(data)}"
        )
    magic, schema_id = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise DecodeError(
            f"record is not in the Confluent wire format: the first byte is {data[0]:#04x}, "
            f"not the magic byte {MAGIC:#04x}; {preview(data)}"
        )
    return schema_id, memoryview(data)[HEADER_SIZE:]
