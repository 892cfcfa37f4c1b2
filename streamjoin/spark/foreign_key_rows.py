"""The foreign-key join's final rows, row by row: the pure part of its backfill (no Spark).

A worker's result table ends as a function of the two tables' final rows: each left row
joined with the right row its foreign key names (inner: only when there is one; left:
with None otherwise, and when the foreign key is None), kept when the join function
returns non-None. The responses that got it there, and their timing, change only the
history of the result, never its end, so the final rows can be computed offline; the
history cannot (it is not backfilled). The Spark job (:mod:`streamjoin.spark.foreign_key_job`)
only places these calls: latest record per key, then a join of the sides by foreign key.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamjoin.codecs import Codec
from streamjoin.errors import JoinError
from streamjoin.partitioner import partition_for_key
from streamjoin.spark.runners import OutputRecord, _output_codecs

if TYPE_CHECKING:
    from streamjoin.config import AppConfig
    from streamjoin.joins.foreign_key_api import ForeignKeyJoinDecl

__all__ = ["ForeignKeyRows", "LeftRow", "RightRow", "TableRecord", "latest_rows"]

#: a table topic's record: ``(key, value or None, order)``; ``order`` sorts one key's records
#: as the table applied them (partition and offset, or timestamp and ordinal for files)
TableRecord = tuple[bytes, bytes | None, tuple[int, ...], int]

#: a live left row: ``(foreign key as the right table stores it or None, (left key, value,
#: timestamp))``
LeftRow = tuple[bytes | None, tuple[bytes, bytes, int]]
#: a live right row: ``(key, (value, timestamp))``
RightRow = tuple[bytes, tuple[bytes, int]]


def latest_rows(records: Iterable[TableRecord]) -> dict[bytes, tuple[bytes | None, int]]:
    """Each key's last ``(value, timestamp)`` by ``order`` (the value None: a tombstone)."""
    last: dict[bytes, tuple[tuple[int, ...], bytes | None, int]] = {}
    for key, value, order, timestamp_ms in records:
        seen = last.get(key)
        if seen is None or order > seen[0]:
            last[key] = (order, value, timestamp_ms)
    return {key: (value, ts) for key, (_, value, ts) in last.items()}


@dataclass(frozen=True)
class ForeignKeyRows:
    """One foreign-key join's per-row rules, with its codecs and functions (pickled to the
    Spark tasks)."""

    name: str
    how: str
    foreign_key: Callable[[Any], Any]
    fun: Callable[[Any, Any, Any], Any]
    left_key_codec: Codec
    left_value_codec: Codec
    right_key_codec: Codec
    right_value_codec: Codec
    out_key_codec: Codec
    out_value_codec: Codec
    out_partitions: int

    @classmethod
    def for_join(
        cls, config: AppConfig, decl: ForeignKeyJoinDecl, out_partitions: int
    ) -> ForeignKeyRows:
        out_key, out_value = _output_codecs(config, decl.output, decl.left.key_codec)
        return cls(
            decl.name,
            decl.how,
            decl.foreign_key,
            decl.fun,
            decl.left.key_codec,
            decl.left.value_codec,
            decl.right.key_codec,
            decl.right.value_codec,
            out_key,
            out_value,
            out_partitions,
        )

    def left_row(self, key: bytes, value: bytes | None, timestamp_ms: int) -> LeftRow | None:
        """A left key's final record as the row to join (None: the row is deleted; a value
        decoding to None deletes, as in a topic table)."""
        decoded = None if value is None else self.left_value_codec.loads(value)
        if decoded is None or value is None:
            return None
        left_key = self.left_key_codec.dumps(self.left_key_codec.loads(key)) or b""
        try:
            chosen = self.foreign_key(decoded)
        except Exception as exc:
            raise JoinError(
                f"join {self.name!r}: foreign_key failed on the value of left key {key!r}: {exc!r}"
            ) from exc
        fk = None if chosen is None else self.right_key_codec.dumps(chosen)
        return fk, (left_key, value, timestamp_ms)

    def right_row(self, key: bytes, value: bytes | None, timestamp_ms: int) -> RightRow | None:
        """A right key's final record keyed as the worker looks it up (None: deleted)."""
        if value is None or self.right_value_codec.loads(value) is None:
            return None
        return self.right_key_codec.dumps(self.right_key_codec.loads(key)) or b"", (
            value,
            timestamp_ms,
        )

    def result(
        self, left: tuple[bytes, bytes, int], right: tuple[bytes, int] | None
    ) -> OutputRecord | None:
        """The result row of one left row and the right row its foreign key found (None:
        none found, or no foreign key), encoded for the output; None when there is no row.
        Its timestamp is the later of the two rows' (a worker stamps the wall clock)."""
        left_key, left_value, timestamp_ms = left
        if right is None and self.how == "inner":
            return None
        key = self.left_key_codec.loads(left_key)
        right_value = None
        if right is not None:
            right_value = self.right_value_codec.loads(right[0])
            timestamp_ms = max(timestamp_ms, right[1])
        joined = self.fun(key, self.left_value_codec.loads(left_value), right_value)
        if inspect.isawaitable(joined):
            joined = asyncio.run(_await(joined))
        if joined is None:
            return None
        out_key = self.out_key_codec.dumps(key)
        partition = -1 if out_key is None else partition_for_key(out_key, self.out_partitions)
        return OutputRecord(partition, out_key, self.out_value_codec.dumps(joined), timestamp_ms)

    def final_join(
        self, left: Iterable[TableRecord], right: Iterable[TableRecord]
    ) -> Iterator[OutputRecord]:
        """The whole join on one machine (what the Spark job distributes)."""
        rights: dict[bytes, tuple[bytes, int]] = {}
        for key, (value, ts) in latest_rows(right).items():
            live = self.right_row(key, value, ts)
            if live is not None:
                rights[live[0]] = live[1]
        for key, (value, ts) in latest_rows(left).items():
            found = self.left_row(key, value, ts)
            if found is None:
                continue
            fk, left_row = found
            out = self.result(left_row, None if fk is None else rights.get(fk))
            if out is not None:
                yield out


async def _await(awaitable: Any) -> Any:
    return await awaitable
