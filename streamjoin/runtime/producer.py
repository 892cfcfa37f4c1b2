"""The Kafka producer as a mode service implementing :class:`streamjoin.topics.Sender`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidProducerEpoch,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    UnknownProducerId,
)
from mode import Service

from streamjoin.errors import InternalError, LifecycleError, RecordRejected, RecordTooLargeError
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.record_limits import (
    RecordLimits,
    describe_rejection,
    is_rejection,
    single_record_batch_size,
)
from streamjoin.topics import Headers

log = logging.getLogger("streamjoin.producer")

#: the producer's batch size unless the app sets ``max_batch_size`` (bigger record batches:
#: fewer produce round trips for changelog flushes)
DEFAULT_MAX_BATCH_SIZE = 256 * 1024


class KafkaSender(Service):
    """Idempotent, ``acks=all`` producer: a send's future resolves once the record is durable."""

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
        #: records out per topic, changelog flush sizes
        self.counters = counters if counters is not None else WorkerCounters()
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
        #: a new producer being started after a refusal (sends wait for it)
        self._replacing: asyncio.Future[None] | None = None
        #: producers replaced after a refusal: what they fail afterwards is sent again
        self._retired: weakref.WeakSet[AIOKafkaProducer] = weakref.WeakSet()
        self._resends: set[asyncio.Future[None]] = set()

    async def on_start(self) -> None:
        self._producer = AIOKafkaProducer(**self._options)
        await self._producer.start()

    async def on_stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()  # flushes what is buffered
            self._producer = None

    def _require(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise LifecycleError("the producer is not started")
        return self._producer

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None,
        headers: Headers,
        timestamp_ms: int | None,
    ) -> asyncio.Future[Any]:
        self.limits.check(topic, key, value, headers)
        future = await self._send_checked(
            topic, key, value, partition=partition, headers=headers, timestamp_ms=timestamp_ms
        )
        out = self.counters.records_out
        out[topic] = out.get(topic, 0) + 1
        return future

    async def _send_checked(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None,
        headers: Headers,
        timestamp_ms: int | None,
    ) -> asyncio.Future[Any]:
        """Enqueue a record that passed :meth:`RecordLimits.check`; the returned future fails
        with :class:`RecordRejected` (naming topic, size and limit) if the broker refuses it."""
        if self._replacing is not None:
            await self._replacing
        producer = self._require()
        try:
            sent: asyncio.Future[Any] = await producer.send(
                topic,
                value,
                key=key,
                partition=partition,
                headers=list(headers) or None,
                timestamp_ms=timestamp_ms,
            )
        except MessageSizeTooLargeError as exc:  # the producer's own max_request_size
            limit = int(self._options.get("max_request_size", 1048576))
            size = single_record_batch_size(key, value, headers)
            raise RecordTooLargeError(
                f"a record of {size} bytes for topic {topic!r} is larger than the producer's "
                f"max_request_size ({limit})",
                topic=topic,
                size=size,
                limit=limit,
            ) from exc
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(future: asyncio.Future[Any]) -> None:
            if outcome.done():
                return
            if future.cancelled():
                outcome.cancel()
                return
            exc = future.exception()
            if exc is None:
                outcome.set_result(future.result())
                return
            if is_rejection(exc):
                self.limits.remember(topic, key, value, exc)
                rejected = RecordRejected(
                    "the broker refused the record: "
                    + describe_rejection(topic, key, value, exc, self.limits),
                    topic=topic,
                )
                rejected.__cause__ = exc
                outcome.set_exception(rejected)
                self._refused(producer)
                return
            if isinstance(exc, _AFTER_A_REFUSAL) and producer in self._retired:
                # sent behind the refused record by the producer it broke: send it again
                resend = self._send_checked(
                    topic,
                    key,
                    value,
                    partition=partition,
                    headers=headers,
                    timestamp_ms=timestamp_ms,
                )
                forwarding = asyncio.ensure_future(_forward(resend, outcome))
                self._resends.add(forwarding)
                forwarding.add_done_callback(self._resends.discard)
                return
            outcome.set_exception(exc)

        sent.add_done_callback(done)
        return outcome

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
            producer = AIOKafkaProducer(**self._options)
            await producer.start()
            self._producer = producer
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
                    sent = await producer.send_batch(batch, topic, partition=partition)
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
            batches.append((await producer.send_batch(batch, topic, partition=partition), count))
        self.counters.sent(topic, len(records))
        self.counters.changelog_flush_records.observe(len(records))
        return asyncio.ensure_future(_last_offset(batches))

    async def partition_count(self, topic: str) -> int:
        partitions = await self._require().partitions_for(topic)
        return len(partitions)

    async def flush(self) -> None:
        if self._producer is not None:
            await self._producer.flush()


#: what a producer's later sends fail with once a refused batch broke its sequence numbers
_AFTER_A_REFUSAL = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch)


async def _forward(source: Awaitable[asyncio.Future[Any]], target: asyncio.Future[Any]) -> None:
    """Resolve ``target`` like the future ``source`` gives."""
    try:
        result = await (await source)
    except asyncio.CancelledError:
        target.cancel()
    except BaseException as exc:
        if not target.done():
            target.set_exception(exc)
    else:
        if not target.done():
            target.set_result(result)


async def _last_offset(batches: Sequence[tuple[asyncio.Future[Any], int]]) -> int:
    """Offset of the last record of the last batch, once every batch is acknowledged."""
    if not batches:
        raise InternalError("nothing was sent")
    metas = await asyncio.gather(*(future for future, _ in batches))
    return int(metas[-1].offset) + batches[-1][1] - 1
