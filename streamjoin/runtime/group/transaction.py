"""Exactly-once: one Kafka transaction per commit on the worker's one producer (EOS v2).

Every record a worker produces (agent outputs, ``group_by`` repartitioning, dead
letters, table changelogs) goes through :class:`TransactionalSender`, so one
transaction holds all of them; the commit adds the consumed offsets (through the
group: :meth:`GroupOffsets.commit_in_transaction`) and ends the transaction. The
transactional id is stable per worker instance: a restarted worker with the same
``group_instance_id`` initialises it again, which aborts its previous incarnation's
open transaction at once and fences that incarnation's producer.

aiokafka runs the transaction (begin, AddPartitionsToTxn, produce, EndTxn) but its
offsets request carries no group generation (TxnOffsetCommit v0): the offsets are
added here, with our own AddOffsetsToTxn and the group's TxnOffsetCommit v3 (KIP-447).
Two private parts of aiokafka's producer are used for that, both read-mostly: the
producer id and epoch the transaction runs under, and telling its transaction manager
that a group was added (otherwise a transaction holding only offsets would never be
ended). Both are checked before the producer starts (:func:`check_transaction_manager`):
an aiokafka without them stops the worker at start, saying what is missing.

The send path is :class:`KafkaSender`'s; this sender adds what a transaction needs:
records sent while a commit ends a transaction are held for the next one
(:meth:`TransactionalSender._send_closed`), what an abort leaves unsent is dropped, and
every record batch's outcome is watched.

aiokafka does not fail a transaction when one of its record batches fails; every
batch's outcome is watched here (one callback per record batch, not per record), and a
transaction with a failed send never commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiokafka
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
)

from streamjoin.context import Delivery, OutgoingRecord
from streamjoin.errors import StartupError, TransactionError, TransactionFailed
from streamjoin.runtime.group.txn_protocol import (
    PRODUCER_FENCED_CODES,
    ErrorCode,
    add_offsets_to_txn,
    check_protocol,
    error_name,
    find_transaction_coordinator,
)
from streamjoin.runtime.table_state.flush import Sending, TakenWrites, send_writes
from streamjoin.runtime.transport.liveness import BACKOFF_MAX, BACKOFF_START
from streamjoin.runtime.transport.out_batches import OutBatch, Outbox, Sent
from streamjoin.runtime.transport.producer import (
    KafkaSender,
    dropped_delivery,
    flush_now,
    started_producer,
)
from streamjoin.runtime.transport.record_limits import RecordLimits, is_rejection
from streamjoin.tables import Table

__all__ = [
    "CommitOffsets",
    "TransactionIds",
    "TransactionalSender",
    "WorkerTransaction",
    "transactional_id_for",
]

log = logging.getLogger("streamjoin.transaction")

#: how long a commit retries adding the group to its transaction (well within the
#: transaction timeout)
ADD_OFFSETS_TIMEOUT = 5.0
#: answers to AddOffsetsToTxn that a retry fixes (-1: no answer, the connection failed)
_ADD_OFFSETS_RETRIABLE = {
    -1,
    ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
}

TP = tuple[str, int]


@dataclass(frozen=True)
class TransactionIds:
    """Who a transaction belongs to, as the group coordinator needs it for TxnOffsetCommit."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


#: commits offsets inside the transaction ``ids`` (the group's TxnOffsetCommit); raises
#: :class:`TransactionFailed` when the group refuses them
CommitOffsets = Callable[[TransactionIds, Mapping[TP, int]], Awaitable[None]]


def transactional_id_for(app_id: str, instance_id: str | None) -> str:
    """Stable for a static member (a restart fences and aborts its previous incarnation);
    unique per process otherwise (what the dead process left open times out)."""
    suffix = instance_id if instance_id is not None else f"process-{uuid.uuid4().hex[:12]}"
    return f"{app_id}-{suffix}"


#: records held for the next transaction while a commit ends one; beyond this, sends wait
MAX_HELD_SENDS = 100_000


def _chain(source: Sent, target: asyncio.Future[Any]) -> None:
    """Resolve ``target`` as ``source`` resolves."""

    def copy(done: Sent) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif (exc := done.exception()) is not None:
            target.set_exception(exc)
            target.exception()  # seen: the transaction's commit reports it
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)


#: what a commit uses of aiokafka's private transaction manager (see the module docstring)
_TXN_MANAGER_PARTS = ("producer_id", "producer_epoch", "consumer_group_added")


def check_transaction_manager(producer: AIOKafkaProducer) -> None:
    """Raise :class:`StartupError` unless ``producer`` (transactional, not started yet)
    has the private transaction manager a commit reads and tells (``_txn_manager``, as in
    aiokafka 0.14): a different aiokafka fails when the worker starts, naming what is
    missing, instead of at its first commit."""
    manager = getattr(producer, "_txn_manager", None)
    if manager is None:
        missing = ["_txn_manager"]
    else:
        missing = [
            f"_txn_manager.{part}" for part in _TXN_MANAGER_PARTS if not hasattr(manager, part)
        ]
    if missing:
        raise StartupError(
            f"aiokafka {aiokafka.__version__}: its producer has no {', '.join(missing)}; "
            "exactly-once commits offsets with the transaction's producer id and epoch and "
            "tells aiokafka's transaction manager that the group joined the transaction "
            "(written against aiokafka 0.14): install a tested aiokafka (see pyproject.toml), "
            "or run with processing_guarantee='at_least_once'"
        )


class TransactionalSender(KafkaSender):
    """The worker's producer under exactly-once: a transaction is always open between
    commits; records sent while a commit ends one are held for the next."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_options: Mapping[str, Any],
        producer_options: Mapping[str, Any],
        client_id: str,
        transactional_id: str,
        transaction_timeout_ms: int,
        group_id: str,
        limits: RecordLimits | None = None,
    ) -> None:
        super().__init__(
            bootstrap_servers,
            client_options=client_options,
            producer_options={
                # The first records of a transaction often find the previous one still
                # writing its markers (the broker answers CONCURRENT_TRANSACTIONS, or
                # NOT_ENOUGH_REPLICAS to aiokafka's produce version): retry soon, as the
                # Java producer does, not after the default 100 ms.
                **({} if "retry_backoff_ms" in client_options else {"retry_backoff_ms": 20}),
                **producer_options,
                "transactional_id": transactional_id,
                "transaction_timeout_ms": transaction_timeout_ms,
            },
            client_id=client_id,
            limits=limits,
        )
        self.transactional_id = transactional_id
        self.group_id = group_id
        #: how long an abort waits for the producer before replacing it
        self._abort_timeout = transaction_timeout_ms / 1000
        #: set while sends may join the open transaction (:attr:`_closed` cleared)
        self._opened = asyncio.Event()
        self._closed = True
        #: the first send of the open transaction that failed (it must not commit)
        self._failure: BaseException | None = None
        self._sent = False
        #: the transaction coordinator's node id, once looked up
        self._coordinator: int | None = None
        #: records sent while a commit ended the transaction, for the next one, with the
        #: futures their senders were given
        self._held: list[tuple[OutgoingRecord, asyncio.Future[Any]]] = []
        #: what this transaction sent (record batches, changelog flushes): its commit waits
        #: until each one settled, so a failure is known before it commits
        self._outcomes: list[asyncio.Future[Any]] = []
        #: counts transactions: an outcome of an earlier one is not this one's failure
        self._generation = 0
        #: what :meth:`commit` waits for, by part (records, offsets): see :meth:`waiting_on`
        self._waits: dict[str, str] = {}
        self.commits = 0
        self.aborts = 0

    async def on_start(self) -> None:
        await super().on_start()  # InitProducerId: fences and aborts our previous incarnation
        await self.begin()

    def _check_seams(self, producer: AIOKafkaProducer) -> None:
        super()._check_seams(producer)
        check_transaction_manager(producer)
        check_protocol()

    async def on_stop(self) -> None:
        self.close_sends()
        self.drops += 1
        self._drop_held()
        await self._drop_unsent()  # (the transaction holding them is aborted below)
        producer = self._producer
        if producer is not None and self._sent:
            # Never leave records of ours in an open transaction: read_committed readers
            # would wait for the broker's transaction timeout.
            with contextlib.suppress(KafkaError, AssertionError):
                await producer.abort_transaction()
        await super().on_stop()

    # ------------------------------------------------------------------ sends

    async def _send_closed(self, record: OutgoingRecord) -> Delivery | None:
        """A commit is ending the transaction: the record joins the next one. Held here
        (the agent goes on at once: its event counts as processed, and the next
        transaction commits this record or none of its events' effects); past
        :data:`MAX_HELD_SENDS`, the send waits for the next transaction."""
        if len(self._held) < MAX_HELD_SENDS:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._held.append((record, future))
            return future
        drops = self.drops
        await self._opened.wait()
        if self.drops != drops:
            return dropped_delivery()  # that transaction was aborted: its event is lost
        # (an abort while the append waits drops the record too: its event's task was lost,
        # and the record must not join the next transaction)
        return None

    async def _send_held(self) -> None:
        """Send what was held while the last transaction ended, in order, into this one."""
        while self._held:
            batch, self._held = self._held, []
            for record, future in batch:
                try:
                    sent = await self._append(record)
                except Exception as exc:
                    if self._failure is None:
                        self._failure = exc
                    future.cancel()
                    continue
                if sent is None:
                    future.cancel()
                    continue
                _chain(sent, future)

    def _drop_held(self) -> None:
        """The held records' events are processed again (an abort, a stop): forget them."""
        held, self._held = self._held, []
        for _, future in held:
            future.cancel()

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> Awaitable[int]:
        """The changelog records of a commit (sent while the commit holds the gate)."""
        done = await super().send_many(topic, partition, records)
        future = asyncio.ensure_future(done)
        self._watch(future)
        return future

    def _first_record(self, outbox: Outbox, batch: OutBatch) -> None:
        super()._first_record(outbox, batch)
        self._watch(batch.future)

    def _watch(self, future: asyncio.Future[Any]) -> None:
        self._sent = True
        self._outcomes.append(future)
        future.add_done_callback(functools.partial(self._sent_done, self._generation))

    def _sent_done(self, generation: int, future: asyncio.Future[Any]) -> None:
        if generation != self._generation:
            return  # a batch of an aborted transaction, dropped
        if future.cancelled():
            exc: BaseException | None = asyncio.CancelledError()
        else:
            exc = future.exception()
        if exc is not None and self._failure is None:
            self._failure = exc

    async def _flush_transaction(self) -> None:
        """Every record of the transaction handed over and acknowledged (or failed), and
        every outcome known."""
        self._waits["records"] = "handing its record batches to the producer"
        await self._submit_all()
        self._waits["records"] = "the brokers' answers to its record batches"
        await flush_now(self._require())
        pending = [future for future in self._outcomes if not future.done()]
        if pending:
            await asyncio.wait(pending)
        self._waits.pop("records", None)
        await asyncio.sleep(0)  # (their done-callbacks, which record a failure, run now)

    # ------------------------------------------------------------------ transactions

    def close_sends(self) -> None:
        """From now on sends go into the next transaction (the commit's snapshot)."""
        self._closed = True
        self._opened.clear()

    def _open_sends(self) -> None:
        self._closed = False
        self._opened.set()

    @property
    def has_data(self) -> bool:
        return self._sent

    async def reopen(self) -> None:
        """Let sends in again without ending the transaction."""
        self._open_sends()

    async def begin(self) -> None:
        """Begin the next transaction and let sends in."""
        producer = self._require()
        await producer.begin_transaction()
        self._generation += 1
        self._failure = None
        self._sent = False
        self._outcomes = []
        await self._send_held()
        self._open_sends()

    async def commit(self, offsets: Mapping[TP, int], commit_offsets: CommitOffsets) -> None:
        """Add ``offsets`` (through the group) and commit the open transaction; raises
        :class:`TransactionFailed` (the caller aborts) if any part of it failed."""
        producer = self._require()
        try:
            if offsets:
                ids = self.ids()
                await gather_or_cancel(
                    self._flush_transaction(), self._add_offsets(ids, offsets, commit_offsets)
                )
            else:
                await self._flush_transaction()
            if self._failure is not None:
                raise TransactionFailed(
                    f"a record of this transaction was not written: {self._failure!r}",
                    fenced=_is_fenced(self._failure),
                )
            self._waits["end"] = "the transaction coordinator ending it (EndTxn)"
            await producer.commit_transaction()
        except TransactionFailed:
            raise
        except (KafkaError, AssertionError) as exc:
            raise TransactionFailed(
                f"the transaction did not commit: {exc!r}", fenced=_is_fenced(exc)
            ) from exc
        finally:
            self._waits.clear()
        self.commits += 1

    def waiting_on(self) -> str:
        """What a commit under way waits for, and the producer's state (for the warning
        of a commit that outlives the transaction timeout)."""
        waits = " and ".join(self._waits.values()) or "nothing of the producer"
        producer = self._producer
        if producer is None:
            return f"{waits}; no producer (being replaced)"
        unanswered = sum(1 for future in self._outcomes if not future.done())
        manager = producer._txn_manager
        sender = producer._sender.sender_task
        if sender is None or not sender.done():
            running = "running"
        elif sender.cancelled():
            running = "cancelled"
        else:
            running = f"stopped by {sender.exception()!r}"
        return (
            f"{waits}; {unanswered} of its {len(self._outcomes)} sends unanswered; "
            f"aiokafka's transaction state {manager.state.name}, partitions to add "
            f"{sorted(map(tuple, manager.partitions_to_add()))}, its sender task {running}; "
            f"batches not yet handed over: {self.describe_unhanded()}"
        )

    async def _add_offsets(
        self, ids: TransactionIds, offsets: Mapping[TP, int], commit_offsets: CommitOffsets
    ) -> None:
        self._waits["offsets"] = "the transaction coordinator adding the group (AddOffsetsToTxn)"
        await self._add_group(ids)
        self._waits["offsets"] = "the group coordinator taking its offsets (TxnOffsetCommit)"
        # aiokafka must know: a transaction holding only offsets is ended too.
        self._require()._txn_manager.consumer_group_added(self.group_id)
        await commit_offsets(ids, offsets)
        self._waits.pop("offsets", None)

    async def _add_group(self, ids: TransactionIds) -> None:
        """AddOffsetsToTxn, retried while the coordinator is busy (the previous transaction
        still writing its markers answers CONCURRENT_TRANSACTIONS) or moving."""
        client = self._require().client
        deadline = time.monotonic() + ADD_OFFSETS_TIMEOUT
        backoff = 0.01
        while True:
            try:
                node = self._coordinator
                if node is None:
                    node = await find_transaction_coordinator(client, self.transactional_id)
                    self._coordinator = node
                code = await add_offsets_to_txn(
                    client,
                    node,
                    transactional_id=ids.transactional_id,
                    producer_id=ids.producer_id,
                    producer_epoch=ids.producer_epoch,
                    group_id=self.group_id,
                )
            except (TransactionError, KafkaError) as exc:
                problem = repr(exc)
                code = -1
            else:
                problem = error_name(code)
            if code == ErrorCode.NONE:
                return
            if code in (-1, ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE):
                self._coordinator = None  # look it up again
            if code in PRODUCER_FENCED_CODES:
                raise TransactionFailed(
                    f"the transaction coordinator fenced this worker's producer ({problem})",
                    fenced=True,
                )
            if code not in _ADD_OFFSETS_RETRIABLE or time.monotonic() >= deadline:
                raise TransactionFailed(
                    f"the transaction coordinator would not add group {self.group_id!r}: {problem}"
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.2)

    async def abort(self) -> None:
        """Abort the open transaction (a producer that cannot abort, because it was fenced
        or failed, is replaced: initialising the transactional id again aborts it), then
        begin the next one."""
        self.close_sends()
        self.drops += 1  # (first: a send waiting for room is woken by the drop below)
        self._drop_held()
        await self._drop_unsent()
        self.aborts += 1
        producer = self._require()
        if is_rejection(self._failure) or isinstance(self._failure, OutOfOrderSequenceNumber):
            # A refused batch broke the idempotent producer's sequence numbers: a new
            # producer (InitProducerId again) aborts the transaction and starts them afresh.
            await self._replace_producer()
        else:
            try:
                # (bounded: a producer whose commit was given up may never answer)
                await asyncio.wait_for(producer.abort_transaction(), self._abort_timeout)
            except (KafkaError, AssertionError, TimeoutError) as exc:
                problem = "no answer" if isinstance(exc, TimeoutError) else repr(exc)
                log.warning(
                    "could not abort the transaction (%s); starting a new producer", problem
                )
                await self._replace_producer()
        await self.begin()

    async def _replace_producer(self) -> None:
        old, self._producer = self._producer, None
        if old is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.stop(), timeout=5.0)
        # The old producer often failed because the broker went away (aiokafka's sender
        # gives up on a lost connection): the new one waits for it, as the other clients
        # do, instead of stopping the worker (the outage itself is logged by liveness).
        backoff = BACKOFF_START
        while True:
            try:
                producer = await started_producer(self._options)
            except KafkaConnectionError as exc:
                log.debug("new producer: %r; retrying in %.1f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            self._producer = producer
            return

    def _refused(self, producer: AIOKafkaProducer) -> None:
        """The transaction holding the refused record fails at its commit; :meth:`abort`
        replaces the producer (never in the middle of a transaction)."""

    def ids(self) -> TransactionIds:
        manager = self._require()._txn_manager
        return TransactionIds(self.transactional_id, manager.producer_id, manager.producer_epoch)


async def gather_or_cancel(*coroutines: Coroutine[Any, Any, Any]) -> list[Any]:
    """Run ``coroutines`` together; if one fails, cancel and await the others before
    raising. (``asyncio.gather`` leaves them running: a transaction's offset requests
    would go on into the next transaction.)"""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _is_fenced(exc: BaseException) -> bool:
    return isinstance(exc, ProducerFenced | InvalidProducerEpoch) or (
        isinstance(exc, TransactionFailed) and exc.fenced
    )


class WorkerTransaction:
    """What :class:`~streamjoin.runtime.tasks.processing.TaskProcessing` needs of a transaction:
    the sender's, with the app's tables and the group's offset commit bound in."""

    def __init__(
        self,
        sender: TransactionalSender,
        tables: Mapping[str, Table],
        commit_offsets: CommitOffsets,
    ) -> None:
        self.sender = sender
        self.tables = tables
        self._commit_offsets = commit_offsets

    def close_sends(self) -> None:
        self.sender.close_sends()

    @property
    def has_data(self) -> bool:
        return self.sender.has_data

    async def reopen(self) -> None:
        await self.sender.reopen()

    async def send_writes(self, taken: list[TakenWrites]) -> list[Sending]:
        return await send_writes(taken, self.tables, self.sender)

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        await self.sender.commit(offsets, self._commit_offsets)

    def waiting_on(self) -> str:
        return self.sender.waiting_on()

    async def begin(self) -> None:
        await self.sender.begin()

    async def abort(self) -> None:
        await self.sender.abort()
