"""Global tables (``app.global_table``): every worker holds every partition of a topic.

Faust's ``GlobalTable`` and Kafka Streams' ``GlobalKTable``: a table of reference data
(user -> country, product -> category) read by key from any agent, whatever partition
the agent's event came from, so a stream can be enriched by a key that is not its
partition key without repartitioning. The source topic is the changelog: no changelog
topic of ours, and no agent writes it (writes go to the topic; a write through the table
is a :class:`~streamjoin.errors.TableAccessError`).

A :class:`GlobalTable` is a declaration: it holds no state. The worker's global-table
service restores a local copy of the whole topic before the agents start, keeps it
current in the background and attaches it here (:meth:`GlobalTable.attach`); the test
driver attaches an in-memory copy it writes in send order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from streamjoin.codecs import Codec
from streamjoin.errors import TableAccessError
from streamjoin.set_tables import MemberSet, check_set_values
from streamjoin.state.sets import SetCodec
from streamjoin.tables import StoreKind
from streamjoin.topics import Topic

__all__ = ["GlobalRows", "GlobalTable", "SetGlobalTable"]


class GlobalRows(Protocol):
    """A worker's local copy of a global table: encoded keys to encoded values."""

    def get(self, key: bytes) -> bytes | None: ...

    def rows(self) -> Iterator[tuple[bytes, bytes]]: ...


@dataclass(eq=False)
class GlobalTable:
    """The whole of ``source``, latest value per key, on every worker; read-only."""

    name: str
    source: Topic
    key_codec: Codec
    value_codec: Codec
    default: Callable[[], Any] | None = None
    #: ``"rocksdb"`` (kept across restarts, resumed from its stored offsets) or ``"memory"``
    #: (read from the beginning of the topic at every start)
    store: StoreKind = "rocksdb"
    _rows: GlobalRows | None = field(default=None, repr=False)

    def attach(self, rows: GlobalRows | None) -> None:
        """Connect the running worker's (or test driver's) copy; None disconnects it."""
        self._rows = rows

    def _require(self) -> GlobalRows:
        rows = self._rows
        if rows is None:
            raise TableAccessError(
                f"global table {self.name!r} is read while no worker runs (or before its "
                "restore finished)"
            )
        return rows

    def _encode_key(self, key: Any) -> bytes:
        data = self.key_codec.dumps(key)
        if data is None:
            raise TableAccessError(f"global table {self.name!r}: keys must not encode to None")
        return data

    # ------------------------------------------------------------------ reads

    def get(self, key: Any, default: Any = None) -> Any:
        rows = self._rows or self._require()
        key_bytes = self.key_codec.dumps(key)
        raw = None if key_bytes is None else rows.get(key_bytes)
        return default if raw is None else self.value_codec.loads(raw)

    def __getitem__(self, key: Any) -> Any:
        raw = self._require().get(self._encode_key(key))
        if raw is None:
            if self.default is not None:
                return self.default()
            raise KeyError(key)
        return self.value_codec.loads(raw)

    def __contains__(self, key: Any) -> bool:
        return self._require().get(self._encode_key(key)) is not None

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every row of the local copy (the whole table: all partitions)."""
        for key, value in self._require().rows():
            yield self.key_codec.loads(key), self.value_codec.loads(value)

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.items())

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def stored_value(self, key_bytes: bytes) -> bytes | None:
        """The encoded value of an encoded key in the local copy (the query endpoint)."""
        return self._require().get(key_bytes)

    # ------------------------------------------------------------------ writes

    def _read_only(self) -> TableAccessError:
        return TableAccessError(
            f"global table {self.name!r} is read-only: it is written through its topic "
            f"{self.source.name!r} (send there; every worker applies it)"
        )

    def __setitem__(self, key: Any, value: Any) -> None:
        raise self._read_only()

    def __delitem__(self, key: Any) -> None:
        raise self._read_only()


@dataclass(eq=False)
class SetGlobalTable(GlobalTable):
    """Faust's ``SetGlobalTable``: a set table (``app.set_table``) read whole by every
    worker, from its changelog. A read gives a :class:`~streamjoin.set_tables.MemberSet`
    (read-only; empty for a missing key); changes go through the set table, on the key's
    owner or from anywhere with its manager."""

    def __post_init__(self) -> None:
        check_set_values(f"set global table {self.name!r}", self.value_codec, self.default)

    @property
    def _set_codec(self) -> SetCodec:
        return cast(SetCodec, self.value_codec)  # (checked in __post_init__)

    def get(self, key: Any, default: Any = None) -> Any:
        """The key's members, or ``default`` when it has none."""
        rows = self._rows or self._require()
        key_bytes = self.key_codec.dumps(key)
        raw = None if key_bytes is None else rows.get(key_bytes)
        return default if raw is None else MemberSet(self._set_codec, raw)

    def __getitem__(self, key: Any) -> MemberSet:
        return MemberSet(self._set_codec, self._require().get(self._encode_key(key)))

    def _read_only(self) -> TableAccessError:
        return TableAccessError(
            f"set global table {self.name!r} is read-only: change the sets through the set "
            f"table whose changelog it reads ({self.source.name!r}), on the key's owner or "
            "with the set table's manager"
        )

    def items(self) -> Iterator[tuple[Any, Any]]:
        """(key, members) of every key with members in the local copy (all partitions)."""
        codec = self._set_codec
        for key, value in self._require().rows():
            yield self.key_codec.loads(key), MemberSet(codec, value)
