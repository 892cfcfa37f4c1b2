"""Set tables: a set of members per key (Faust's ``SetTable``), declared with ``app.set_table``.

Inside an agent, ``table[key]`` is a :class:`SetView`: a mutable set (``add``,
``discard``, ``remove``, ``update``, ``difference_update``, ...) whose changes are
buffered writes of the table like any other, flushed at commit with the usual changelog,
standbys, restore and exactly-once. A key with no members is absent: ``table[key]`` of a
missing key is an empty set, and emptying a set deletes its key (a changelog tombstone).

Each change writes the key's whole set (encoded by :mod:`streamjoin.state.sets`, which
says why values and not operations); a key changed many times in one batch is still one
changelog record at the flush, since buffered writes to a key replace each other.

Members are encoded with the table's value codec and compared by their encodings: two
members are the same when they encode to the same bytes (so a member need not be
hashable, and ``1`` and ``1.0`` are two members under JSON, unlike in a Python set).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, MutableSet
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, cast

from streamjoin.codecs import Codec
from streamjoin.errors import CodecError, ConfigurationError
from streamjoin.state.sets import SetCodec, decode_members, encode_sorted
from streamjoin.state.table_partition import TablePartition
from streamjoin.tables import Table

__all__ = ["SetTable", "SetView"]

#: a set's encoded members, ascending and without repeats (as stored)
Members = tuple[bytes, ...]
#: how many keys' decoded sets a set table keeps (see SetTable._decoded)
_DECODED_KEYS = 1024
_SetOperation = Callable[[frozenset[bytes], frozenset[bytes]], frozenset[bytes]]


@dataclass(eq=False)
class SetTable(Table):
    """A :class:`~streamjoin.tables.Table` whose values are sets of members."""

    kind: ClassVar[str] = "set table"
    #: key -> (stored value, its members) of the keys read or written last: a set is
    #: decoded again only when its stored value is another object (bytes are immutable and
    #: the entry holds the object, so an identical object means identical members)
    _decoded: dict[bytes, tuple[bytes | None, Members]] = field(
        init=False, repr=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        if not isinstance(self.value_codec, SetCodec):
            raise ConfigurationError(
                f"set table {self.name!r}: its value codec must be a SetCodec over the "
                f"members' codec, got {self.value_codec.name!r}"
            )
        if self.default is not None:
            raise ConfigurationError(
                f"set table {self.name!r} takes no default: a missing key is an empty set"
            )
        super().__post_init__()

    @classmethod
    def of(cls, table: Table) -> SetTable:
        """The set table declared like ``table`` (name, codecs, changelog, co-partitioning,
        store), whose values are sets of members encoded by ``table``'s value codec."""
        return cls(
            table.name,
            table.key_codec,
            SetCodec(table.value_codec),
            table.changelog,
            None,
            table.writers,
            link=table.link,
            store=table.store,
        )

    @property
    def member_codec(self) -> Codec:
        """The codec of one member (the ``value_serializer`` it was declared with)."""
        return self._set_codec.member_codec

    @property
    def _set_codec(self) -> SetCodec:
        return cast(SetCodec, self.value_codec)  # (checked in __post_init__)

    # ------------------------------------------------------------ dict API

    def __getitem__(self, key: Any) -> SetView:
        return SetView(self, key, self._encode_key(key))

    def get(self, key: Any, default: Any = None) -> Any:
        """The key's set (a :class:`SetView`), or ``default`` when it has no members."""
        key_bytes = self._encode_key(key)
        if self._state(key_bytes, writing=False).lookup(key_bytes) is None:
            return default
        return SetView(self, key, key_bytes)

    def __setitem__(self, key: Any, members: Iterable[Any]) -> None:
        """Replace the key's set with ``members`` (none: delete the key)."""
        key_bytes = self._encode_key(key)
        encoded = self._set_codec.dumps(members)
        self._state(key_bytes, writing=True).put(key_bytes, encoded)

    def local_items(self, partition: int | None = None) -> Iterator[tuple[Any, Any]]:
        """(key, :class:`SetView`) of the local active partitions (or one of them)."""
        for state in self._local_states(partition):
            for key_bytes, _ in list(state.scan(b"", None)):
                yield self.key_codec.loads(key_bytes), SetView(self, None, key_bytes)


class SetView(MutableSet[Any]):
    """One key's set in a :class:`SetTable`. It holds no members: every operation reads
    the table (buffered writes included) and every change writes the key's new set, so a
    view is never stale. Changes need an agent processing an event of the table's
    partition, as any table write does.

    Members are handled as their encodings in a sorted tuple (the stored order): lookups
    bisect it, and an ``add`` or ``discard`` splices it, so a change never sorts."""

    __slots__ = ("_key", "_key_bytes", "_members", "_raw", "_table")

    def __init__(self, table: SetTable, key: Any, key_bytes: bytes) -> None:
        self._table = table
        self._key = key
        self._key_bytes = key_bytes
        #: the last stored value read and its members (decoded again only when it changed)
        self._raw: bytes | None = None
        self._members: Members = ()

    def _read(self, *, writing: bool = False) -> tuple[TablePartition, Members]:
        state = self._table._state(self._key_bytes, writing=writing)
        raw = state.lookup(self._key_bytes)
        if raw is not self._raw:
            known = self._table._decoded.get(self._key_bytes)
            if known is not None and known[0] is raw:
                self._raw, self._members = known
            else:
                self._remember(raw, () if raw is None else tuple(decode_members(raw)))
        return state, self._members

    def _write(self, state: TablePartition, members: Members) -> None:
        encoded = encode_sorted(members)
        state.put(self._key_bytes, encoded)
        self._remember(encoded, members)

    def _remember(self, raw: bytes | None, members: Members) -> None:
        self._raw, self._members = raw, members
        decoded = self._table._decoded
        if len(decoded) >= _DECODED_KEYS and self._key_bytes not in decoded:
            del decoded[next(iter(decoded))]  # (the oldest entry)
        decoded[self._key_bytes] = (raw, members)

    def _encoded(self, members: Iterable[Any]) -> frozenset[bytes]:
        member = self._table._set_codec.member
        return frozenset(member(m) for m in members)

    # ------------------------------------------------------------ reading

    def __contains__(self, member: object) -> bool:
        try:
            encoded = self._table._set_codec.member(member)
        except CodecError:  # (what the codec cannot encode is in no set)
            return False
        return _place(self._read()[1], encoded)[1]

    def __iter__(self) -> Iterator[Any]:
        loads = self._table.member_codec.loads
        return iter([loads(m) for m in self._read()[1]])

    def __len__(self) -> int:
        return len(self._read()[1])

    def __repr__(self) -> str:
        key = self._key if self._key is not None else self._table.key_codec.loads(self._key_bytes)
        return f"SetView({self._table.name!r}, {key!r}, {list(self)!r})"

    # ------------------------------------------------------------ changing

    def add(self, member: Any) -> None:
        encoded = self._table._set_codec.member(member)
        state, members = self._read(writing=True)
        at, present = _place(members, encoded)
        if not present:
            self._write(state, (*members[:at], encoded, *members[at:]))

    def discard(self, member: Any) -> None:
        encoded = self._table._set_codec.member(member)
        state, members = self._read(writing=True)
        at, present = _place(members, encoded)
        if present:
            self._write(state, members[:at] + members[at + 1 :])

    def remove(self, member: Any) -> None:
        """Remove ``member``; KeyError if it is not in the set."""
        encoded = self._table._set_codec.member(member)
        state, members = self._read(writing=True)
        at, present = _place(members, encoded)
        if not present:
            raise KeyError(member)
        self._write(state, members[:at] + members[at + 1 :])

    def pop(self) -> Any:
        """Remove and return the member with the smallest encoding; KeyError if empty."""
        state, members = self._read(writing=True)
        if not members:
            raise KeyError("pop from an empty set")
        self._write(state, members[1:])
        return self._table.member_codec.loads(members[0])

    def clear(self) -> None:
        state, members = self._read(writing=True)
        if members:
            self._write(state, ())

    def update(self, *others: Iterable[Any]) -> None:
        self._change(lambda members, other: members | other, others)

    def difference_update(self, *others: Iterable[Any]) -> None:
        self._change(lambda members, other: members - other, others)

    def intersection_update(self, *others: Iterable[Any]) -> None:
        self._change(lambda members, other: members & other, others)

    def symmetric_difference_update(self, other: Iterable[Any]) -> None:
        self._change(lambda members, other: members ^ other, (other,))

    def _change(self, operation: _SetOperation, others: tuple[Iterable[Any], ...]) -> None:
        """Apply ``operation(members, other)`` for each of ``others``, writing once."""
        encoded_others = [self._encoded(other) for other in others]
        state, members = self._read(writing=True)
        before = frozenset(members)
        result = before
        for other in encoded_others:
            result = operation(result, other)
        if result != before:
            self._write(state, tuple(sorted(result)))

    # (in-place operators: one write each, rather than MutableSet's one per member; the
    # ignores are typeshed's own for MutableSet: |= and ^= may not widen the member type)
    def __ior__(self, other: AbstractSet[Any]) -> Self:  # type: ignore[misc]
        self.update(other)
        return self

    def __iand__(self, other: AbstractSet[Any]) -> Self:
        self.intersection_update(other)
        return self

    def __isub__(self, other: AbstractSet[Any]) -> Self:
        self.difference_update(other)
        return self

    def __ixor__(self, other: AbstractSet[Any]) -> Self:  # type: ignore[misc]
        self.symmetric_difference_update(other)
        return self


def _place(members: Members, encoded: bytes) -> tuple[int, bool]:
    """Where ``encoded`` is or would go in ``members``, and whether it is there."""
    at = bisect_left(members, encoded)
    return at, at < len(members) and members[at] == encoded
