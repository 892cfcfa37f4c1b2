"""The Kafka producer as a mode service implementing :class:`streamjoin.topics.Sender`.

Records are appended straight into one open record batch per partition (see
:mod:`~streamjoin.runtime.transport.out_batches`): a send costs no future, task or callback of its
own. A partition's batches are handed to aiokafka (``send_batch``) by a short-lived task
at the end of the event-loop turn that filled them, or as soon as one is full; aiokafka
sends each after ``linger_ms``. While it holds a partition's previous batch, records keep
filling the next one.

A record arrives as one :data:`~streamjoin.context.OutgoingRecord` tuple, built by the
topic, and the batch keeps that same tuple (no copy per record). The transactional sender
extends this send path through hooks (:attr:`KafkaSender._closed` with
:meth:`KafkaSender._send_closed`, :meth:`KafkaSender._first_record`); what it uses of
aiokafka beyond the documented API is checked before the producer starts
(:meth:`KafkaSender._check_seams`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiokafka
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
    UnknownProducerId,
)
from aiokafka.structs import TopicPartition
from mode import Service

from streamjoin.context import Delivery, Headers, OutgoingRecord
from streamjoin.errors import (
    ConfigurationError,
    InternalError,
    LifecycleError,
    RecordRejected,
    RecordTooLargeError,
    StartupError,
)
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.transport.out_batches import OutBatch, Outbox, Sent, check_batch_builder
from streamjoin.runtime.transport.quick_append import NO_HEADERS, QuickAppend
from streamjoin.runtime.transport.record_limits import (
    RecordLimits,
    describe_rejection,
    is_rejection,
    single_record_batch_size,
)

log = logging.getLogger("streamjoin.producer")

#: the producer's batch size unless the app sets ``max_batch_size`` (bigger record batches:
#: fewer produce round trips for changelog flushes)
DEFAULT_MAX_BATCH_SIZE = 256 * 1024
#: full batches of one partition waiting for their turn before senders wait (backpressure:
#: with the one aiokafka holds and the one on the wire, at most this + 3 batches in memory)
MAX_WAITING_BATCHES = 2
#: how long a record batch waits for its partition to have a leader before it fails
#: (aiokafka's own limit is its request timeout, 40 s: less than a cluster takes to
#: come back after a full outage)
LEADER_WAIT = 300.0


def wait_for_leaders(producer: AIOKafkaProducer, seconds: float = LEADER_WAIT) -> None:
    """Let ``producer``'s record batches wait ``seconds`` for a partition without a leader
    (every replica's broker down, an election) before they fail.

    aiokafka fails such a batch with LeaderNotAvailableError once it is older than its
    accumulator's ``_batch_ttl`` (private; its request timeout), however idempotent the
    producer: an at-least-once worker then stopped after a 40 s outage of the whole
    cluster, although nothing was lost yet. An aiokafka without that attribute keeps its
    own limit, with a warning."""
    accumulator: Any = getattr(producer, "_message_accumulator", None)
    ttl = getattr(accumulator, "_batch_ttl", None)
    if not isinstance(ttl, int | float):
        log.warning(
            "this aiokafka's producer has no _message_accumulator._batch_ttl: a record batch "
            "fails after request_timeout_ms without a partition leader (not after %.0f s)",
            seconds,
        )
        return
    accumulator._batch_ttl = max(float(ttl), seconds)


async def started_producer(
    options: Mapping[str, Any], check: Callable[[AIOKafkaProducer], None] | None = None
) -> AIOKafkaProducer:
    """A started producer (``check`` looks at it first) whose batches wait for a partition
    leader for :data:`LEADER_WAIT`; one whose check or start fails (or is cancelled) is
    stopped before the error goes on, so no half-started client is left for the garbage
    collector."""
    producer = AIOKafkaProducer(**options)
    try:
        wait_for_leaders(producer)
        if check is not None:
            check(producer)
        await producer.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await producer.stop()
        raise
    return producer


class KafkaSender(Service):
    """Idempotent, ``acks=all`` producer: a send's :class:`Sent` resolves once the record
    is durable."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_options: Mapping[str, Any],
        producer_options: Mapping[str, Any],
        client_id: str,
        counters: WorkerCounters | None = None,
        limits: RecordLimits | None = None,
    ) -> None:
        super().__init__()
        self._options: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers,
            "client_id": client_id,
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": 5,
            "max_batch_size": DEFAULT_MAX_BATCH_SIZE,
            **client_options,
            **producer_options,
        }
        #: what the written topics accept (checked before each send; see record_limits)
        self.limits = limits or RecordLimits(
            {}, compressed=self._options.get("compression_type") is not None
        )
        self.limits.compressed = self._options.get("compression_type") is not None
        smallest = self.limits.smallest_limit()
        if smallest is not None and smallest < self._options["max_batch_size"]:
            # The broker refuses a whole batch larger than the topic's max.message.bytes,
            # however small its records: batches must fit the smallest written topic.
            log.info(
                "producer batches limited to %d bytes: the smallest max.message.bytes of the "
                "topics this app writes",
                smallest,
            )
            self._options["max_batch_size"] = smallest
        self._producer: AIOKafkaProducer | None = None
        #: counts the times records not yet sent were dropped (an aborted transaction): a
        #: send that was waiting meanwhile is dropped too, not appended to what comes next
        self.drops = 0
        #: producers replaced after a refusal: what they fail afterwards is sent again
        self._retired: weakref.WeakSet[AIOKafkaProducer] = weakref.WeakSet()
        self._resends: set[asyncio.Future[None]] = set()
        #: each partition's batches not yet handed to the producer
        self._outboxes: dict[tuple[str, int], Outbox] = {}
        #: where each topic's records without key or partition go for now
        self._sticky: dict[str, Outbox] = {}
        self._partition_counts: dict[str, int] = {}
        self._max_request_size = int(self._options.get("max_request_size", 1048576))
        #: a batch may be larger than a request: then every record is checked, not only
        #: a batch's first one (the only one a batch takes whatever its size)
        check_each_size = int(self._options["max_batch_size"]) > self._max_request_size
        #: the per-record send path (compiled), sharing the outboxes and partition counts;
        #: it holds the counters, the flag of closed sends and the producer's replacement
        self._quick = QuickAppend(
            self._outboxes,
            self._sticky,
            self._partition_counts,
            self.limits,
            counters if counters is not None else WorkerCounters(),
            check_each_size,
            self._start_batch_now,
        )
        #: :meth:`send` without awaiting when the record joins an open batch at once (None:
        #: the caller awaits :meth:`send`, which takes the long way); declined while sends
        #: are closed. The compiled :meth:`QuickAppend.send_now` itself, a call less per
        #: record; ``check=False``: the record passed :meth:`RecordLimits.check` already
        self.send_now: Callable[..., Sent | None] = self._quick.send_now

    @property
    def counters(self) -> WorkerCounters:
        """Records out per topic, changelog flush sizes."""
        return self._quick.counters

    @counters.setter
    def counters(self, counters: WorkerCounters) -> None:
        self._quick.counters = counters

    @property
    def _closed(self) -> bool:
        """True while records may not join a batch (a transactional sender ending its
        transaction): :meth:`send` asks :meth:`_send_closed` what becomes of them, and
        ``send_now`` declines them. This sender never closes its sends."""
        return self._quick.closed

    @_closed.setter
    def _closed(self, closed: bool) -> None:
        self._quick.closed = closed

    @property
    def _replacing(self) -> asyncio.Future[None] | None:
        """A new producer being started after a refusal (sends wait for it)."""
        return self._quick.replacing

    @_replacing.setter
    def _replacing(self, replacement: asyncio.Future[None] | None) -> None:
        self._quick.replacing = replacement

    async def on_start(self) -> None:
        self._producer = await started_producer(self._options, self._check_seams)

    def _check_seams(self, producer: AIOKafkaProducer) -> None:
        """What this sender uses of aiokafka beyond its documented API, checked before the
        first producer starts: a different aiokafka fails at start, naming what it lacks."""
        check_batch_builder(producer.create_batch())
        check_flush_now(producer)

    async def on_stop(self) -> None:
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._submit_all()
            await self._drop_unsent()  # (anything appended since: nothing hands it over)
            await self._producer.stop()  # flushes what is buffered
            self._producer = None

    def kafka_client(self) -> Any:
        """The current producer's aiokafka client (None when not started): the membership
        closes its connections to a broker gone silent
        (:func:`~streamjoin.runtime.transport.connections.drop_connections`)."""
        return getattr(self._producer, "client", None)

    def _require(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise LifecycleError("the producer is not started")
        return self._producer

    async def send(self, record: OutgoingRecord) -> Delivery:
        """Append the record to its partition's open batch (waits only while the producer
        is replaced, for the topic's metadata, or while too many full batches wait); the
        :class:`Sent` fails with :class:`RecordRejected` (naming topic, size and limit) if
        the broker refuses it.

        The one send path of every sender: one that closes its sends for a while (a
        transaction ending) sets :attr:`_closed` and says in :meth:`_send_closed` what
        becomes of a record sent meanwhile."""
        topic, key, value, _, headers, _ = record
        # A record the broker would refuse never enters a batch (or a transaction): the
        # agent's on_error policy applies to it here.
        self.limits.check(topic, key, value, headers)
        sent = await self._send_closed(record) if self._closed else None
        if sent is None:
            sent = self._quick.append_now(record, False)  # (counted there)
            if sent is not None:
                return sent
            sent = await self._append(record)
            if sent is None:
                return dropped_delivery()
        out = self.counters.records_out
        out[topic] = out.get(topic, 0) + 1
        return sent

    async def _send_closed(self, record: OutgoingRecord) -> Delivery | None:
        """What :meth:`send` does with a record while :attr:`_closed` is set: its delivery
        (held for later, or dropped), or None when it may be appended now after all. This
        sender never closes its sends."""
        return None

    def _start_batch_now(
        self, outbox: Outbox, record: OutgoingRecord, listed: list[tuple[str, bytes]]
    ) -> Sent | None:
        """For :class:`QuickAppend`: a record (with key or partition, and its timestamp)
        that starts ``outbox``'s next batch, or None when there is no producer now or too
        many full batches wait (the long way, :meth:`_append`, waits for them)."""
        producer = self._producer
        if producer is None:
            return None
        return self._append_to(producer, outbox, record, listed)

    async def _append(self, record: OutgoingRecord) -> Sent | None:
        """Append a record that passed :meth:`RecordLimits.check` (the long way); None when
        what was not yet sent was dropped while this waited (:attr:`drops`): the record
        is dropped too."""
        topic, key, _, partition, headers, timestamp_ms = record
        if timestamp_ms is None:
            record = (*record[:5], int(time.time() * 1000))
        listed = list(headers) if headers else NO_HEADERS
        drops = self.drops
        while True:
            if self._replacing is not None:
                await self._replacing
                continue
            producer = self._require()
            if partition is None:
                outbox = await self._unpartitioned(producer, topic, key)
            else:
                outbox = await self._outbox(producer, topic, partition)
            if self._replacing is not None:  # (began while waiting for metadata)
                continue  # type: ignore[unreachable]
            if self.drops != drops:
                return None
            sent = self._append_to(producer, outbox, record, listed)
            if sent is not None:
                return sent
            await self._room(outbox)  # (then the checks above again, drops included)

    def _append_to(
        self,
        producer: AIOKafkaProducer,
        outbox: Outbox,
        record: OutgoingRecord,
        listed: list[tuple[str, bytes]],
    ) -> Sent | None:
        """Append ``record`` (its timestamp known) to ``outbox``'s open batch, opening one
        if needed (a full batch waits for its turn, the record starts the next one); None
        when too many full batches wait already (the caller waits for room)."""
        topic, key, value, _, headers, timestamp_ms = record
        if timestamp_ms is None:
            raise InternalError(f"a record for {topic!r} reached its batch without a timestamp")
        while True:
            if len(outbox.full) >= MAX_WAITING_BATCHES:
                return None
            batch = outbox.open
            if batch is None or not batch.records:
                self._check_size(topic, key, value, headers)
            if batch is None:
                batch = self._open_batch(producer, outbox)
            records = batch.records
            if batch.append_record(len(records), timestamp_ms, key, value, listed) is None:
                if not records:
                    raise InternalError(f"an empty record batch refused a record for {topic!r}")
                batch.full()
                outbox.full.append(batch)
                outbox.open = None
                continue
            if not records:
                self._first_record(outbox, batch)
            records.append(record)
            return Sent(topic, batch, len(records) - 1)

    def _check_size(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None:
        """The producer's own limit (``max_request_size``); a batch's first record may be
        larger than a batch."""
        size = single_record_batch_size(key, value, headers)
        if size > self._max_request_size:
            raise RecordTooLargeError(
                f"a record of {size} bytes for topic {topic!r} is larger than the producer's "
                f"max_request_size ({self._max_request_size})",
                topic=topic,
                size=size,
                limit=self._max_request_size,
            )

    async def _partitions(self, producer: AIOKafkaProducer, topic: str) -> int:
        """How many partitions ``topic`` has (from the producer's metadata, fetched once)."""
        count = self._partition_counts.get(topic)
        if count is None:
            count = len(await producer.partitions_for(topic))
            self._partition_counts[topic] = count
        return count

    async def _unpartitioned(
        self, producer: AIOKafkaProducer, topic: str, key: bytes | None
    ) -> Outbox:
        """Where a record without a partition goes: by its key like every client, or (no
        key) to one partition until its batch is sent, then another (sticky, like Kafka's
        Java producer: full batches rather than one record per partition)."""
        count = await self._partitions(producer, topic)
        if key is not None:
            return await self._outbox(producer, topic, partition_for_key(key, count))
        sticky = self._sticky.get(topic)
        if sticky is None or sticky.open is None or not sticky.open.records:
            sticky = await self._outbox(producer, topic, random.randrange(count))
            self._sticky[topic] = sticky
        return sticky

    async def _outbox(self, producer: AIOKafkaProducer, topic: str, partition: int) -> Outbox:
        outbox = self._outboxes.get((topic, partition))
        if outbox is None:
            count = await self._partitions(producer, topic)
            if not 0 <= partition < count:
                count = len(await producer.partitions_for(topic))  # maybe added since
                self._partition_counts[topic] = count
                if not 0 <= partition < count:
                    raise ConfigurationError(
                        f"{topic!r} has {count} partitions; partition {partition} is invalid"
                    )
            outbox = self._outboxes.setdefault((topic, partition), Outbox(topic, partition))
        return outbox

    async def _room(self, outbox: Outbox) -> None:
        """Until the partition's pump took a full batch."""
        if outbox.room is None:
            outbox.room = asyncio.get_running_loop().create_future()
        await asyncio.shield(outbox.room)

    def _open_batch(self, producer: AIOKafkaProducer, outbox: Outbox) -> OutBatch:
        loop = asyncio.get_running_loop()
        batch = OutBatch(outbox.partition, producer.create_batch(), loop.create_future())
        outbox.open = batch
        return batch

    def _first_record(self, outbox: Outbox, batch: OutBatch) -> None:
        """A batch got its first record: it goes out at the end of this event-loop turn
        (or once the batches before it went)."""
        self._start_pump(outbox)

    def _start_pump(self, outbox: Outbox) -> None:
        """Start the partition's pump unless one is running. A pump clears itself when it
        ends; one cancelled before its first step never ran that cleanup (an abort in the
        same event-loop turn as the batch's first record), and is replaced here: left in
        place, no batch of the partition would be handed over again."""
        pump = outbox.pump
        if pump is None or pump.done():
            outbox.pump = asyncio.get_running_loop().create_task(self._pump(outbox))

    async def _pump(self, outbox: Outbox) -> None:
        """Hand the partition's batches to the producer, in order, while there are any."""
        try:
            while True:
                if outbox.full:
                    batch = outbox.full.popleft()
                    _wake(outbox)
                elif outbox.open is not None and outbox.open.records:
                    batch, outbox.open = outbox.open, None
                else:
                    return
                outbox.submitting = batch
                try:
                    await self._submit(outbox.topic, batch)
                finally:
                    outbox.submitting = None
                    batch.was_handed()
        finally:
            outbox.pump = None

    async def _submit(self, topic: str, batch: OutBatch) -> None:
        if batch.future.done():
            return  # dropped (its transaction aborted)
        try:
            while True:
                while self._replacing is not None:
                    await self._replacing
                producer = self._require()
                try:
                    # (left open: aiokafka lingers on it for linger_ms, like its own batches)
                    batch.handing_over()
                    delivered = await producer.send_batch(
                        batch.builder, topic, partition=batch.partition
                    )
                    break
                except KafkaTimeoutError:
                    # No room within request_timeout_ms: the partition's batch before this
                    # one is still unanswered (the broker away, a silent connection given
                    # up only now). This one was not taken: it waits on, in order.
                    if batch.future.done():
                        return  # dropped meanwhile (its transaction aborted)
                    log.debug("%s[%d]: waiting on for room in the producer", topic, batch.partition)
        except asyncio.CancelledError:
            batch.future.cancel()
            raise
        except Exception as exc:
            _settle(batch.future, exc)
            return
        batch.producer = producer
        delivered.add_done_callback(functools.partial(self._delivered, topic, batch))

    def _delivered(self, topic: str, batch: OutBatch, delivered: asyncio.Future[Any]) -> None:
        """The broker answered for a batch: settle its future (one per batch), refusals
        mapped to each record's :class:`RecordRejected`."""
        outcome = batch.future
        if outcome.done():
            return
        if delivered.cancelled():
            outcome.cancel()
            return
        exc = delivered.exception()
        if exc is None:
            outcome.set_result(delivered.result())
            return
        if is_rejection(exc):
            refusals: list[BaseException] = []
            for _, key, value, _, _, _ in batch.records:
                self.limits.remember(topic, key, value, exc)
                rejected = RecordRejected(
                    "the broker refused the record: "
                    + describe_rejection(topic, key, value, exc, self.limits),
                    topic=topic,
                )
                rejected.__cause__ = exc
                refusals.append(rejected)
            batch.refusals = refusals
            _settle(outcome, refusals[0])
            self._refused(batch.producer)
            return
        if isinstance(exc, SEQUENCE_BROKEN) and batch.producer in self._retired:
            # sent behind the refused batch by the producer it broke: send it again
            resend = asyncio.ensure_future(self._resend(topic, batch))
            self._resends.add(resend)
            resend.add_done_callback(self._resends.discard)
            return
        _settle(outcome, exc)

    async def _resend(self, topic: str, batch: OutBatch) -> None:
        """The batch's records appended again, in order, for the new producer; the batch
        settles once they all did (each :class:`Sent` reads its record's new place)."""
        moved: list[Sent] = []
        try:
            for record in batch.records:
                # (to the same partition: a record without one is not placed again)
                sent = await self._append((*record[:3], batch.partition, *record[4:]))
                if sent is None:
                    batch.future.cancel()
                    return
                moved.append(sent)
        except Exception as exc:
            _settle(batch.future, exc)
            return
        batch.moved = moved
        await asyncio.wait({sent.acknowledged for sent in moved})
        for sent in moved:
            if sent.cancelled():
                batch.future.cancel()
                return
            failure = sent.exception()
            if failure is not None:
                _settle(batch.future, failure)
                return
        batch.future.set_result(None)

    async def _submit_all(self) -> None:
        """Until every batch appended so far was handed to the producer (a flush, a
        commit, a stop)."""
        waiting: list[asyncio.Future[None]] = []
        loop = asyncio.get_running_loop()
        for outbox in list(self._outboxes.values()):
            last = outbox.last()
            if last is None:
                continue
            self._start_pump(outbox)
            if last.handed is None:
                last.handed = loop.create_future()
            waiting.append(last.handed)
        if waiting:
            await asyncio.wait(waiting)

    def describe_unhanded(self) -> str:
        """The partitions whose batches are not all handed to the producer yet, and what
        each waits for (for the warning of a commit or flush that takes too long)."""
        producer = self._producer
        parts: list[str] = []
        for outbox in self._outboxes.values():
            last = outbox.last()
            if last is None or (last.handed is not None and last.handed.done()):
                continue
            tp = TopicPartition(outbox.topic, outbox.partition)
            pump = outbox.pump
            if pump is None:
                pumping = "no pump"
            elif pump.done():
                pumping = "pump ended"
            else:
                pumping = f"pump waiting in {_awaiting(pump)}"
            where = f"{len(outbox.full)} full and {0 if outbox.open is None else 1} open batches"
            if outbox.submitting is not None:
                where += ", one being handed over"
            if self._replacing is not None:
                where += ", the producer being replaced"
            if producer is not None:
                try:  # (aiokafka's internals: a description, never a failure of its own)
                    accumulated = producer._message_accumulator._batches.get(tp)
                    sender = producer._sender
                    leader = producer.client.cluster.leader_for_partition(tp)
                    busy = leader in sender._in_flight
                    in_flight = " (a request in flight to it)" if busy else ""
                    muted = ", muted" if tp in sender._muted_partitions else ""
                    where += (
                        f"; aiokafka holds {len(accumulated or ())} batches for it, leader "
                        f"{leader}{in_flight}{muted}"
                    )
                except AttributeError:
                    pass
            parts.append(f"{outbox.topic}[{outbox.partition}]: {where}, {pumping}")
        return "; ".join(parts) or "none"

    async def _drop_unsent(self) -> None:
        """Forget the batches not yet handed over (their transaction aborted: their events
        are processed again; or the producer stops)."""
        pumps = [o.pump for o in self._outboxes.values() if o.pump is not None]
        for pump in pumps:
            pump.cancel()
        if pumps:
            await asyncio.wait(pumps)
        for outbox in self._outboxes.values():
            dropped = [*outbox.full, *([outbox.open] if outbox.open is not None else [])]
            outbox.full.clear()
            outbox.open = None
            _wake(outbox)
            for batch in dropped:
                batch.future.cancel()
                batch.was_handed()

    def _refused(self, producer: AIOKafkaProducer) -> None:
        """The broker refused a batch of ``producer``: an idempotent producer cannot go on
        (every later batch to that partition fails with OutOfOrderSequenceNumber), so it is
        replaced; what it still had in flight is sent again by the new one."""
        if producer is not self._producer or producer in self._retired:
            return
        self._retired.add(producer)
        self._replacing = asyncio.ensure_future(self._replace_producer())

    async def _replace_producer(self) -> None:
        old, self._producer = self._producer, None
        try:
            self._producer = await started_producer(self._options)
        finally:
            self._replacing = None
        if old is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.stop(), timeout=5.0)

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> Awaitable[int]:
        """Records appended straight into record batches (no future or metadata lookup per
        record, unlike :meth:`send`): the changelog flush path."""
        producer = self._require()
        batches: list[tuple[asyncio.Future[Any], int]] = []
        batch, count = producer.create_batch(), 0
        for key, value in records:
            if batch.append(key=key, value=value, timestamp=None) is None:
                # full: send it and start the next one (an empty batch takes any record)
                if count:
                    sent = await _send_batch_waiting(producer, batch, topic, partition)
                    batches.append((sent, count))
                    batch, count = producer.create_batch(), 0
                if batch.append(key=key, value=value, timestamp=None) is None:
                    size = single_record_batch_size(key, value, ())
                    raise RecordTooLargeError(
                        f"a record of {size} bytes for {topic}[{partition}] does not fit in a "
                        f"record batch of {self._options['max_batch_size']} bytes (key "
                        f"{len(key)} bytes, value {len(value or b'')} bytes); raise the "
                        "producer's max_batch_size",
                        topic=topic,
                        size=size,
                        limit=int(self._options["max_batch_size"]),
                    )
            count += 1
        if count:
            batches.append((await _send_batch_waiting(producer, batch, topic, partition), count))
        self.counters.sent(topic, len(records))
        self.counters.changelog_flush_records.observe(len(records))
        return asyncio.ensure_future(_last_offset(batches))

    async def partition_count(self, topic: str) -> int:
        partitions = await self._require().partitions_for(topic)
        return len(partitions)

    async def flush(self) -> None:
        """Until every record sent so far is acknowledged (or failed); what aiokafka holds
        lingering is sent now, not after ``linger_ms``."""
        if self._producer is not None:
            await self._submit_all()
            await flush_now(self._producer)


async def flush_now(producer: AIOKafkaProducer) -> None:
    """``producer.flush()`` without waiting out ``linger_ms``: the batches it holds are
    closed and sent at once. (aiokafka's ``flush`` waits for each batch's linger; its
    accumulator's ``flush_for_commit``, what a transaction's commit uses, closes them and
    wakes its sender. Checked at start: :func:`check_flush_now`.)"""
    await producer._message_accumulator.flush_for_commit()


def check_flush_now(producer: AIOKafkaProducer) -> None:
    """Raise :class:`StartupError` unless ``producer`` has what :func:`flush_now` uses."""
    accumulator = getattr(producer, "_message_accumulator", None)
    flush = getattr(accumulator, "flush_for_commit", None)
    if not inspect.iscoroutinefunction(flush):
        raise StartupError(
            f"aiokafka {aiokafka.__version__}: its producer has no "
            "_message_accumulator.flush_for_commit() coroutine, which streamjoin's flush "
            "uses to send lingering batches at once; install a tested aiokafka (see "
            "pyproject.toml)"
        )


async def _send_batch_waiting(
    producer: AIOKafkaProducer, batch: Any, topic: str, partition: int
) -> asyncio.Future[Any]:
    """``producer.send_batch``, waiting on while aiokafka has no room for the batch: it
    gives up after request_timeout_ms when the partition's batch before is unanswered (the
    broker away, a silent connection), but this batch was not taken and can wait on. The
    batch is complete: closed, so that aiokafka sends it without lingering."""
    batch.close()
    while True:
        try:
            sent: asyncio.Future[Any] = await producer.send_batch(batch, topic, partition=partition)
            return sent
        except KafkaTimeoutError:
            log.debug("%s[%d]: waiting on for room in the producer", topic, partition)


#: what an idempotent producer's later sends fail with once a refused or failed batch broke
#: its sequence numbers (the test traffic's producer, tests/integration/support.py, too)
SEQUENCE_BROKEN = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch)


def dropped_delivery() -> asyncio.Future[Any]:
    """The delivery of a record dropped before it was sent: cancelled."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.cancel()
    return future


def _awaiting(task: asyncio.Task[Any]) -> str:
    """Where ``task`` waits: its chain of coroutines, outermost first (function:line)."""
    chain: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and hasattr(awaited, "cr_frame"):
        frame = awaited.cr_frame
        if frame is not None:
            chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        awaited = awaited.cr_await
    return " > ".join(chain) or "?"


def _wake(outbox: Outbox) -> None:
    """Senders waiting for room in ``outbox`` may go on."""
    room, outbox.room = outbox.room, None
    if room is not None and not room.done():
        room.set_result(None)


def _settle(future: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail ``future`` with ``exc`` (read at once: whoever needs it asks the future; an
    unread failure is not worth a warning at garbage collection)."""
    if not future.done():
        future.set_exception(exc)
        future.exception()


async def _last_offset(batches: Sequence[tuple[asyncio.Future[Any], int]]) -> int:
    """Offset of the last record of the last batch, once every batch is acknowledged."""
    if not batches:
        raise InternalError("nothing was sent")
    metas = await asyncio.gather(*(future for future, _ in batches))
    return int(metas[-1].offset) + batches[-1][1] - 1
