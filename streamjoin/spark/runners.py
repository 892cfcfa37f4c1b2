"""Join runners: the pure per-partition part of a backfill (no Spark, no Kafka).

A Spark task hands a runner one join partition's records, already in the order a
worker would have processed them, and gets the encoded outputs back. Keeping this
free of PySpark lets the same code be tested against a brute-force oracle and
against the workers without a Spark session.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamjoin.codecs import Codec
from streamjoin.joins.core import (
    MAX_TIMESTAMP_MS,
    JoinInput,
    JoinOutput,
    JoinSpec,
    StreamStreamJoin,
)
from streamjoin.joins.state import MemoryKeyValueView
from streamjoin.partitioner import partition_for_key

if TYPE_CHECKING:
    from streamjoin.config import AppConfig
    from streamjoin.joins.api import StreamStreamJoinDecl

__all__ = ["JoinRunner", "OutputRecord"]


@dataclass(frozen=True)
class OutputRecord:
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


@dataclass
class JoinRunner:
    """Everything a Spark task needs to run one join partition (picklable, no App inside)."""

    spec: JoinSpec
    fun: Callable[[Any, Any, Any], Any]
    key_codec: Codec
    left_codec: Codec
    right_codec: Codec
    out_key_codec: Codec
    out_value_codec: Codec
    out_partitions: int
    close_windows_at_end: bool = False
    stats: dict[str, int] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_join(
        cls,
        config: AppConfig,
        decl: StreamStreamJoinDecl,
        out_partitions: int,
        close: bool = False,
    ) -> JoinRunner:
        out_key = decl.output.key_codec if decl.output is not None else decl.left.key_codec
        out_value = decl.output.value_codec if decl.output is not None else config.value_codec
        return cls(
            decl.spec,
            decl.fun,
            decl.left.key_codec,
            decl.left.value_codec,
            decl.right.value_codec,
            out_key,
            out_value,
            out_partitions,
            close,
        )

    def run(
        self,
        records: Iterable[tuple[str, bytes, bytes, int]],
        *,
        stream_time_at_end_ms: int | None = None,
    ) -> Iterator[OutputRecord]:
        """Join one partition's ``(side, key, value, timestamp_ms)`` records, given in processing
        order; yields encoded outputs. ``stats`` counts records, outputs and late records.

        ``stream_time_at_end_ms``: advance stream time there once the records are done. A
        backfill that splits a join partition by key gives each part only some of the
        partition's records, so without it a part would close fewer windows than the
        whole partition does (its own largest timestamp is smaller)."""
        core = StreamStreamJoin(self.spec, MemoryKeyValueView())
        seqs = {"left": 0, "right": 0}
        self.stats = {"records": 0, "outputs": 0, "late": 0}
        self._close_loop()
        try:
            for side, key, value, timestamp_ms in records:
                self.stats["records"] += 1
                seq = seqs[side]
                seqs[side] = seq + 1
                event = JoinInput(side, key, value, timestamp_ms, seq)  # type: ignore[arg-type]
                for out in core.process(event):
                    yield from self._emit(out)
            end = MAX_TIMESTAMP_MS if self.close_windows_at_end else stream_time_at_end_ms
            if end is not None:
                for out in core.advance(end):
                    yield from self._emit(out)
        finally:
            self.stats["late"] = core.stats.late
            self._close_loop()

    def _close_loop(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def _emit(self, out: JoinOutput) -> Iterator[OutputRecord]:
        key = self.key_codec.loads(out.key)
        left = self.left_codec.loads(out.left) if out.left is not None else None
        right = self.right_codec.loads(out.right) if out.right is not None else None
        result = self.fun(key, left, right)
        if inspect.isawaitable(result):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(_await(result))
        if result is not None:
            key_bytes = self.out_key_codec.dumps(key)
            partition = (
                partition_for_key(key_bytes, self.out_partitions) if key_bytes is not None else -1
            )
            self.stats["outputs"] += 1
            yield OutputRecord(
                partition, key_bytes, self.out_value_codec.dumps(result), out.timestamp_ms
            )


async def _await(awaitable: Any) -> Any:
    return await awaitable
