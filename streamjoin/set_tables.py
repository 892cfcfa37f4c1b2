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

A set table declared with ``manager=True`` also has a :class:`SetManager`
(``table.manager``, Faust's ``SetTable.manager``): any agent, timer or task can change
the set of a key owned by another partition, or another worker, by sending the operation
to the table's manager topic, partitioned like the table; the internal agent
``<table>.setmanager`` of the partition's owner applies it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, MutableSet
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Self, cast

from streamjoin.codecs import Codec
from streamjoin.context import Delivery
from streamjoin.errors import CodecError, ConfigurationError, DecodeError, EncodeError
from streamjoin.state.sets import (
    SetCodec,
    apply_operation,
    decode_members,
    decode_operation,
    encode_operation,
    encode_sorted,
)
from streamjoin.state.table_partition import TablePartition
from streamjoin.stream import INTERNAL_AGENT_BATCH, Stream
from streamjoin.tables import Table
from streamjoin.topics import Topic

__all__ = ["MemberSet", "SetManager", "SetTable", "SetView", "check_set_values"]

#: a set's encoded members, ascending and without repeats (as stored)
Members = tuple[bytes, ...]
#: how many keys' decoded sets a set table keeps (see SetTable._decoded)
_DECODED_KEYS = 1024
_SetOperation = Callable[[frozenset[bytes], frozenset[bytes]], frozenset[bytes]]


@dataclass(eq=False)
class SetTable(Table):
    """A :class:`~streamjoin.tables.Table` whose values are sets of members."""

    kind = "set table"
    #: key -> (stored value, its members) of the keys read or written last: a set is
    #: decoded again only when its stored value is another object (bytes are immutable and
    #: the entry holds the object, so an identical object means identical members)
    _decoded: dict[bytes, tuple[bytes | None, Members]] = field(
        init=False, repr=False, default_factory=dict
    )
    #: the topic a :class:`SetManager` sends operations to (``manager=True``), else None
    manager_topic: Topic | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_set_values(f"set table {self.name!r}", self.value_codec, self.default)
        super().__post_init__()

    @classmethod
    def of(cls, table: Table, manager_topic: Topic | None = None) -> SetTable:
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
            manager_topic=manager_topic,
        )

    @property
    def manager(self) -> SetManager:
        """Changes to any key's set, from anywhere, applied by the key's owner (Faust's
        ``SetTable.manager``); needs ``app.set_table(..., manager=True)``."""
        if self.manager_topic is None:
            raise ConfigurationError(
                f"set table {self.name!r} has no manager: declare it with "
                "app.set_table(..., manager=True)"
            )
        return SetManager(self, self.manager_topic)

    @property
    def manager_agent(self) -> str:
        """The name of the internal agent applying the manager's operations."""
        return f"{self.name}.setmanager"

    async def apply_operations(self, stream: Stream) -> None:
        """The manager agent: apply each operation of the manager topic to its key's set
        (of this partition: the topic is partitioned like the table)."""
        async for batch in stream.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
            for event in batch:
                if event.key is None or event.value is None:
                    raise DecodeError(
                        f"set manager record {event.position} has no "
                        f"{'key' if event.key is None else 'value'}: not a set operation"
                    )
                operation, members = decode_operation(event.value)
                SetView(self, None, event.key).apply_encoded(operation, members)

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

    def apply_encoded(self, operation: str, members: Iterable[bytes]) -> None:
        """Apply a set manager's ``operation`` (a name in
        :data:`~streamjoin.state.sets.OPERATIONS`) with encoded ``members``."""
        state, before = self._read(writing=True)
        after = apply_operation(before, operation, members)
        if after != before:
            self._write(state, after)

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


class MemberSet(AbstractSet[Any]):
    """A read-only set of members from one stored set value (a set global table's row):
    members are compared by their encodings, as in a :class:`SetView`."""

    __slots__ = ("_codec", "_members")

    def __init__(self, codec: SetCodec, raw: bytes | None) -> None:
        self._codec = codec
        self._members: Members = () if raw is None else tuple(decode_members(raw))

    def __contains__(self, member: object) -> bool:
        try:
            encoded = self._codec.member(member)
        except CodecError:  # (what the codec cannot encode is in no set)
            return False
        return _place(self._members, encoded)[1]

    def __iter__(self) -> Iterator[Any]:
        loads = self._codec.member_codec.loads
        return iter([loads(m) for m in self._members])

    def __len__(self) -> int:
        return len(self._members)

    def __repr__(self) -> str:
        return f"MemberSet({list(self)!r})"


class SetManager:
    """Faust's ``SetTable.manager``: changes to the set of any key, sent as operations to
    the table's manager topic (``<app id>-<table>-setmanager``, partitioned like the table)
    and applied by the worker owning the key's partition, in the order the topic holds
    them. Each method returns once the operation is sent; it is applied later, by the
    owner, and seen by reads there after that (never by the sender's own reads).

    ``add``, ``discard``, ``update``, ``difference_update``, ``intersection_update`` and
    ``clear`` set members' presence, so applying one twice (a retry, or a replay after a
    crash under at-least-once) leaves the same set; ``symmetric_difference_update``
    toggles members, so it is exact only under exactly-once."""

    __slots__ = ("_table", "_topic")

    def __init__(self, table: SetTable, topic: Topic) -> None:
        self._table = table
        self._topic = topic

    async def add(self, key: Any, member: Any) -> Delivery:
        return await self._send(key, "update", (member,))

    async def discard(self, key: Any, member: Any) -> Delivery:
        return await self._send(key, "difference_update", (member,))

    async def clear(self, key: Any) -> Delivery:
        return await self._send(key, "intersection_update", ())

    async def update(self, key: Any, members: Iterable[Any]) -> Delivery:
        return await self._send(key, "update", members)

    async def difference_update(self, key: Any, members: Iterable[Any]) -> Delivery:
        return await self._send(key, "difference_update", members)

    async def intersection_update(self, key: Any, members: Iterable[Any]) -> Delivery:
        return await self._send(key, "intersection_update", members)

    async def symmetric_difference_update(self, key: Any, members: Iterable[Any]) -> Delivery:
        return await self._send(key, "symmetric_difference_update", members)

    async def _send(self, key: Any, operation: str, members: Iterable[Any]) -> Delivery:
        table = self._table
        if isinstance(members, str | bytes):
            raise EncodeError(
                f"set table {table.name!r}: {operation} takes a collection of members, "
                f"not a {type(members).__qualname__}"
            )
        member = table._set_codec.member
        value = encode_operation(operation, [member(m) for m in members])
        return await self._topic.send(key=table._encode_key(key), value=value)


def check_set_values(what: str, value_codec: Codec, default: object) -> None:
    """Refuse what a table of sets cannot take: values not encoded as sets, a default (a
    missing key is an empty set)."""
    if not isinstance(value_codec, SetCodec):
        raise ConfigurationError(
            f"{what}: its value codec must be a SetCodec over the members' codec, got "
            f"{value_codec.name!r}"
        )
    if default is not None:
        raise ConfigurationError(f"{what} takes no default: a missing key is an empty set")


def _place(members: Members, encoded: bytes) -> tuple[int, bool]:
    """Where ``encoded`` is or would go in ``members``, and whether it is there."""
    at = bisect_left(members, encoded)
    return at, at < len(members) and members[at] == encoded
