"""The Confluent wire format: magic byte, big-endian schema id, payload."""

from __future__ import annotations

import pytest

from streamjoin.errors import DecodeError
from streamjoin.schema_registry.wire import HEADER_SIZE, MAGIC, frame, unframe


def test_a_framed_payload_unframes_to_its_id_and_payload() -> None:
    data = frame(0x01020304, b"payload")
    assert data == b"\x00\x01\x02\x03\x04payload"
    schema_id, payload = unframe(data)
    assert (schema_id, bytes(payload)) == (0x01020304, b"payload")
    assert unframe(bytearray(frame(7, b""))) == (7, memoryview(b""))
    assert (MAGIC, HEADER_SIZE) == (0, 5)


def test_short_or_unframed_data_is_a_decode_error_saying_why() -> None:
    with pytest.raises(DecodeError, match=r"not in the Confluent wire format.*at least 5 bytes"):
        unframe(b"\x00\x01")
    with pytest.raises(DecodeError, match="first byte is 0x7b, not the magic byte 0x00"):
        unframe(b'{"id": 1}')
