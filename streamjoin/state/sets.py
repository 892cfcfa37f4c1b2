"""How a set table stores one key's set: its encoded members, sorted, in one value (pure).

A set table's changelog holds values, not operations: each record is the key's whole set
after the flush. A compacted changelog then keeps one record per key, so a restore or a
standby reads one record per live key whatever the history was, and the record a restore
applies is exactly what the store held (an operations log would be smaller per write but
could not be compacted: a restore would replay every add and discard ever made).

Layout: a format byte (:data:`FORMAT`), the member count as a 4-byte big-endian unsigned
int, each member's length the same way, then the members' bytes one after the other
(members encoded by the table's value codec, in ascending byte order, without repeats).
Sorting makes the encoding deterministic: the same set always encodes to the same bytes,
whatever order it was built in. Lengths first, so that encoding and decoding are a few
calls into C (``struct``, ``bytes.join``) rather than a Python loop over the members. An
empty set has no encoding: it is a delete (a changelog tombstone).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from typing import Any

from streamjoin.codecs import Codec
from streamjoin.errors import DecodeError, EncodeError

__all__ = [
    "FORMAT",
    "OPERATIONS",
    "SetCodec",
    "apply_operation",
    "decode_members",
    "decode_operation",
    "encode_members",
    "encode_operation",
    "encode_sorted",
]

#: the first byte of every encoded set (another byte means the value is not a set table's)
FORMAT = b"\x01"
_LENGTH_BYTES = 4
_MAX_MEMBER = 2**32 - 1


def encode_members(members: Iterable[bytes]) -> bytes | None:
    """The stored value of a set of encoded members; None (a delete) when it is empty."""
    return encode_sorted(sorted(set(members)))


def encode_sorted(members: Sequence[bytes]) -> bytes | None:
    """:func:`encode_members` of members already in ascending order without repeats (what
    :func:`decode_members` returns): no sort."""
    if not members:
        return None
    lengths = [len(member) for member in members]
    if max(lengths) > _MAX_MEMBER:
        raise EncodeError(f"a set member of {max(lengths)} bytes is over the 4 GiB limit")
    header = struct.pack(f">{len(lengths) + 1}I", len(lengths), *lengths)
    return FORMAT + header + b"".join(members)


def decode_members(data: bytes) -> list[bytes]:
    """The encoded members of a stored set, in ascending byte order."""
    if data[:1] != FORMAT:
        raise DecodeError(
            f"not a set table value: it starts with {data[:1]!r}, not {FORMAT!r} (was the "
            "table declared with app.table before? its changelog needs a reset)"
        )
    if len(data) < 1 + _LENGTH_BYTES:
        raise DecodeError(f"set value truncated: {len(data)} bytes, no member count")
    (count,) = struct.unpack_from(">I", data, 1)
    start = 1 + _LENGTH_BYTES * (count + 1)
    if len(data) < start:
        raise DecodeError(
            f"set value truncated: {count} members need {start} bytes of lengths, "
            f"it has {len(data)}"
        )
    lengths = struct.unpack_from(f">{count}I", data, 1 + _LENGTH_BYTES)
    ends = list(accumulate(lengths, initial=start))
    if ends[-1] != len(data):
        raise DecodeError(
            f"set value of {len(data)} bytes, but its {count} members' lengths add up to {ends[-1]}"
        )
    return [data[ends[i] : ends[i + 1]] for i in range(count)]


#: a set manager's operations (``table.manager``), by the byte that tags them in its topic;
#: each takes a collection of members (``clear`` an empty one)
OPERATIONS: dict[bytes, str] = {
    b"a": "update",  # add the members (``manager.add`` is an update with one)
    b"d": "difference_update",  # discard them (``manager.discard``: one)
    b"i": "intersection_update",  # keep only them (``manager.clear``: none)
    b"x": "symmetric_difference_update",  # toggle them
}
_TAGS = {name: tag for tag, name in OPERATIONS.items()}
_COMBINE: dict[str, Callable[[frozenset[bytes], frozenset[bytes]], frozenset[bytes]]] = {
    "update": frozenset.__or__,
    "difference_update": frozenset.__sub__,
    "intersection_update": frozenset.__and__,
    "symmetric_difference_update": frozenset.__xor__,
}


def encode_operation(operation: str, members: Iterable[bytes]) -> bytes:
    """A set manager's record value: the operation's tag byte, then its encoded members
    as a stored set (none: the tag alone)."""
    tag = _TAGS.get(operation)
    if tag is None:
        raise EncodeError(
            f"unknown set operation {operation!r}: one of {', '.join(map(repr, _TAGS))}"
        )
    return tag + (encode_members(members) or b"")


def decode_operation(data: bytes) -> tuple[str, list[bytes]]:
    """The operation and members of a set manager's record value."""
    operation = OPERATIONS.get(data[:1])
    if operation is None:
        raise DecodeError(
            f"not a set manager operation: it starts with {data[:1]!r}, not one of "
            f"{', '.join(map(repr, OPERATIONS))}"
        )
    return operation, decode_members(data[1:]) if len(data) > 1 else []


def apply_operation(
    members: Sequence[bytes], operation: str, operands: Iterable[bytes]
) -> tuple[bytes, ...]:
    """The members (ascending, no repeats, as :func:`decode_members` gives them) after
    ``operation`` with ``operands`` (equal to ``members`` when nothing changed)."""
    combine = _COMBINE.get(operation)
    if combine is None:
        raise EncodeError(
            f"unknown set operation {operation!r}: one of {', '.join(map(repr, _COMBINE))}"
        )
    before = frozenset(members)
    after = combine(before, frozenset(operands))
    if after == before:
        return tuple(members)
    return tuple(sorted(after))


class SetCodec:
    """A set table's value codec: a collection of members in, a stored set out, and back as
    a list of members (which is how the query endpoint and ``streamjoin table get`` show a
    set: a JSON list, in the order of the members' encodings)."""

    def __init__(self, member_codec: Codec) -> None:
        self.member_codec = member_codec
        self.name = f"set[{member_codec.name}]"

    def __repr__(self) -> str:
        return f"SetCodec({self.member_codec!r})"

    def dumps(self, obj: Any) -> bytes | None:
        if isinstance(obj, str | bytes) or not isinstance(obj, Iterable):
            raise EncodeError(
                f"{self.name} codec encodes a collection of members (a set, list, ...), "
                f"not a {type(obj).__qualname__}"
            )
        return encode_members(self.member(m) for m in obj)

    def loads(self, data: bytes) -> list[Any]:
        loads = self.member_codec.loads
        return [loads(m) for m in decode_members(data)]

    def member(self, member: Any) -> bytes:
        """The encoding of one member (members are compared by it)."""
        data = self.member_codec.dumps(member)
        if data is None:
            raise EncodeError(f"{self.name}: set members must not encode to None ({member!r})")
        return data
