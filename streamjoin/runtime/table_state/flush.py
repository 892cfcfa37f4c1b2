"""Flushing table partitions in the at-least-once order, for a commit (asyncio, no Kafka).

A commit makes state durable before it moves source offsets: changelog records first
(awaited until acknowledged), then each store together with the changelog offset its
writes reached; only then may the caller commit the offsets of the events that made
them. Output records go first of all (:meth:`TableFlusher.flush` flushes the sender
before the changelog), so a crash cannot leave state in the changelog whose outputs
were lost (a closed join window, say). That includes the records a partition queued for
its flush (:meth:`TablePartition.emit <streamjoin.state.table_partition.TablePartition.emit>`:
a windowed table's final results): they are sent right after the take and acknowledged
before any changelog record of the same flush is sent, so the write recording that they
were sent (a window's "closed through" marker) is never durable without them.

Exactly-once takes the same steps apart (take at the snapshot, send the emitted records
while the snapshot's transaction still takes sends, changelog inside it, apply once it
committed), so they are plain functions too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from streamjoin.context import Delivery, Sender
from streamjoin.errors import ProcessingError, RecordRejected, StoreCorrupted
from streamjoin.state.base import unordered_items
from streamjoin.state.table_partition import Buffer, Emitted, TablePartition
from streamjoin.tables import Table

log = logging.getLogger("streamjoin.flush")


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
        emitted = await send_emitted(taken, self.sender)
        await self._flush_sends()
        await acknowledged(emitted)  # (raises if one failed: its marker must not follow)
        sending = await send_writes(taken, self.tables, self.sender)
        apply_writes(sending, await asyncio.gather(*(f for _, f in sending if f is not None)))

    def take(self, states: Iterable[TablePartition]) -> list[TakenWrites]:
        """Take the buffered writes and emitted records of ``states`` (no await: a commit's
        snapshot). A table's ``before_flush`` runs first: a windowed table that closes
        windows, or a join's buffer with ``close_idle_after``, makes its partition state
        if no event made it yet (a partition idle since it was assigned, or restored after
        a crash, still closes its windows: the state's flush hook does it)."""
        states = list(states)
        for state in states:
            table = self.tables.get(state.table)
            if table is not None and table.before_flush is not None:
                table.before_flush(state)
        return take_writes(states)


@dataclass
class TakenWrites:
    """The buffered writes of one table partition, taken for a flush."""

    state: TablePartition
    #: the last flush completed (deletes of keys the store never had need no tombstone)
    clean: bool
    records: Buffer
    #: records queued by :meth:`TablePartition.emit`, sent before ``records``
    emitted: list[Emitted] = field(default_factory=list)


#: one partition's flush under way: its state and the future of its last changelog offset
#: (None: nothing needed sending)
Sending = tuple[TablePartition, Awaitable[int] | None]


def take_writes(states: Iterable[TablePartition]) -> list[TakenWrites]:
    """Take every buffered write and emitted record of ``states`` (no await: the snapshot
    of a commit; a partition's ``before_take`` hook, such as a windowed table's close and
    expiry passes, runs first)."""
    taken: list[TakenWrites] = []
    for state in states:
        # Deletes of keys the store never had (written and deleted again since the last
        # flush, as join buffers do when windows close during catch-up) need no tombstone:
        # the changelog holds nothing for them. Only safe when the last flush completed
        # (otherwise its writes may be in the changelog and not in the store).
        clean = not state.flush_interrupted
        writes = state.take_pending()
        emitted = state.take_emitted()
        if writes or emitted:
            taken.append(TakenWrites(state, clean, writes, emitted))
    return taken


async def send_emitted(taken: Iterable[TakenWrites], sender: Sender) -> list[Delivery]:
    """Send the emitted records of ``taken``, in order (lost partitions' are dropped: their
    next owner emits them again); returns their deliveries."""
    deliveries: list[Delivery] = []
    for item in taken:
        if not item.emitted or item.state.abandoned:
            continue
        for record in item.emitted:
            try:
                sent = sender.send_now(record)
                deliveries.append(sent if sent is not None else await sender.send(record))
            except RecordRejected as exc:
                # (sending it again would be refused again: a flush that raised here would
                # stop the worker on every restart)
                log.error("%s: an emitted record is dropped: %s", item.state, exc)
    return deliveries


async def acknowledged(deliveries: Iterable[Delivery]) -> None:
    """Wait for ``deliveries`` (each is done after the sender's flush); raises the first
    failure, so that the changelog writes of the same flush are not sent."""
    for delivery in deliveries:
        if delivery.done() and delivery.cancelled():
            raise ProcessingError(
                "a record emitted by a table partition's flush was dropped before it was "
                "sent (the producer was replaced); the flush stops before its changelog "
                "writes, so it is emitted again"
            )
        await delivery


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
