"""Flushing table partitions in the at-least-once order, for a commit (asyncio, no Kafka).

A commit makes state durable before it moves source offsets: changelog records first
(awaited until acknowledged), then each store together with the changelog offset its
writes reached; only then may the caller commit the offsets of the events that made
them. Output records go first of all (:meth:`TableFlusher.flush` flushes the sender
before the changelog), so a crash cannot leave state in the changelog whose outputs
were lost (a closed join window, say).

Exactly-once takes the same three steps apart (take at the snapshot, send inside the
transaction, apply once it committed), so they are plain functions too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from streamjoin.context import Sender
from streamjoin.errors import StoreCorrupted
from streamjoin.state.base import unordered_items
from streamjoin.state.table_partition import Buffer, TablePartition
from streamjoin.tables import Table


class TableFlusher:
    """Owns a worker's sender and its tables' changelogs: flushes sends, and table
    partitions changelog first, store second."""

    def __init__(
        self,
        sender: Sender,
        tables: Mapping[str, Table],
        *,
        flush_sends: Callable[[], Awaitable[object]],
    ) -> None:
        self.sender = sender
        self.tables = tables
        self._flush_sends = flush_sends

    async def flush_sends(self) -> None:
        """Until every record sent so far is acknowledged."""
        await self._flush_sends()

    async def flush(self, states: Iterable[TablePartition]) -> None:
        """Flush ``states``: outputs, then changelog (acknowledged), then each store with
        its changelog offset. Nothing to do for an app without tables."""
        if not self.tables:
            return
        taken = self.take(states)
        await self._flush_sends()
        sending = await send_writes(taken, self.tables, self.sender)
        apply_writes(sending, await asyncio.gather(*(f for _, f in sending if f is not None)))

    def take(self, states: Iterable[TablePartition]) -> list[TakenWrites]:
        """Take the buffered writes of ``states`` (no await: a commit's snapshot)."""
        return take_writes(states)


@dataclass
class TakenWrites:
    """The buffered writes of one table partition, taken for a flush."""

    state: TablePartition
    #: the last flush completed (deletes of keys the store never had need no tombstone)
    clean: bool
    records: Buffer


#: one partition's flush under way: its state and the future of its last changelog offset
#: (None: nothing needed sending)
Sending = tuple[TablePartition, Awaitable[int] | None]


def take_writes(states: Iterable[TablePartition]) -> list[TakenWrites]:
    """Take every buffered write of ``states`` (no await: the snapshot of a commit; a
    partition's ``before_take`` hook, such as a windowed table's expiry, runs first)."""
    taken: list[TakenWrites] = []
    for state in states:
        # Deletes of keys the store never had (written and deleted again since the last
        # flush, as join buffers do when windows close during catch-up) need no tombstone:
        # the changelog holds nothing for them. Only safe when the last flush completed
        # (otherwise its writes may be in the changelog and not in the store).
        clean = not state.flush_interrupted
        writes = state.take_pending()
        if writes:
            taken.append(TakenWrites(state, clean, writes))
    return taken


async def send_writes(
    taken: Iterable[TakenWrites], tables: Mapping[str, Table], sender: Sender
) -> list[Sending]:
    """Send taken writes to their changelogs; the futures resolve once acknowledged."""
    sending: list[Sending] = []
    for item in taken:
        state = item.state
        if state.abandoned:
            # Lost while the producer flushed: its writes go nowhere (its next owner
            # replays the events that made them), and its store may be closed already.
            continue
        pairs = unordered_items(item.records)  # the changelog needs no key order
        store = state.store
        records = list(pairs)
        if item.clean:
            stored = state.stored_deletes()  # known to be in the store: no lookup
            try:
                records = [
                    (k, v) for k, v in records if v is not None or k in stored or store.contains(k)
                ]
            except StoreCorrupted as exc:
                # Every tombstone is sent (harmless for absent keys); the commit goes on and
                # reports the store for a rebuild, like corruption found by an agent's read.
                state.corrupted = exc
        if not records:
            sending.append((state, None))
            continue
        changelog = tables[state.table].changelog.name
        sending.append((state, await sender.send_many(changelog, state.partition, records)))
    return sending


def apply_writes(sending: Iterable[Sending], offsets: Iterable[int]) -> None:
    """Write flushed writes into their stores with the changelog offsets they reached
    (``offsets``: the results of the futures of ``sending``, in order)."""
    last_offsets = iter(offsets)
    for state, sent_to in sending:
        state.finish_flush(next(last_offsets) if sent_to is not None else None)
