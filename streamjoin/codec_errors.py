"""How codecs word their errors (pure): one wording for every codec.

A decode error names the codec, the payload's size and start, the target type and
the cause (for a typed record, the field), so a dead letter's error header says
what is wrong with the record without the record at hand.
"""

from __future__ import annotations

from streamjoin.errors import ArgumentTypeError, DecodeError, EncodeError

#: what a codec's ``loads`` accepts
Bytes = bytes | bytearray | memoryview

#: How much of an undecodable payload error messages show.
PREVIEW_BYTES = 32


def preview(data: Bytes) -> str:
    """The start of ``data``, for an error message."""
    head = bytes(data[:PREVIEW_BYTES])
    return f"payload starts {head!r}{'...' if len(data) > PREVIEW_BYTES else ''}"


def decode_error(codec: str, data: Bytes, cause: str, target: str | None = None) -> DecodeError:
    """``<codec> codec could not decode N bytes into <target>: <cause>; payload starts ...``"""
    into = f" into {target}" if target else ""
    return DecodeError(
        f"{codec} codec could not decode {len(data)} bytes{into}: {cause}; {preview(data)}"
    )


def encode_error(codec: str, obj: object, cause: str) -> EncodeError:
    """``<codec> codec could not encode <type>: <cause>``"""
    return EncodeError(f"{codec} codec could not encode {type(obj).__qualname__}: {cause}")


def check_bytes(codec: str, data: object) -> Bytes:
    """``data`` if it is bytes-like; a str handed to ``loads`` is a programming error (a
    TypeError), not a bad record."""
    if not isinstance(data, Bytes):
        raise ArgumentTypeError(
            f"{codec} codec loads() expects bytes, got {type(data).__qualname__}"
        )
    return data
