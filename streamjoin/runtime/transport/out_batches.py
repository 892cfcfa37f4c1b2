"""Records sent as Kafka record batches, and the light handle a send returns.

A send appends its record to the open batch of its partition and returns a :class:`Sent`
(the batch and the record's index in it): no future, task or callback per record. The
batch is one unit for the broker (one produce, one acknowledgement, one failure), so it
is one unit here too: one future per batch, which the agent runtime watches to
acknowledge every event that sent a record into it, and a transaction to learn whether
all its records were written.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections import deque
from collections.abc import Callable, Generator
from contextvars import Context
from typing import TYPE_CHECKING, Any

import aiokafka
import msgspec
from aiokafka.structs import RecordMetadata

from streamjoin.context import OutgoingRecord
from streamjoin.errors import StartupError

if TYPE_CHECKING:
    from aiokafka.producer.message_accumulator import BatchBuilder

__all__ = ["OutBatch", "Outbox", "Sent", "check_batch_builder"]

#: the keywords the changelog flush appends a record to aiokafka's batch builder with
_APPEND_KEYWORDS = ("timestamp", "key", "value", "headers")


def check_batch_builder(builder: object) -> None:
    """Raise :class:`StartupError` unless ``builder`` (what ``AIOKafkaProducer.create_batch``
    returned) is aiokafka's ``BatchBuilder`` as the send paths use it: its record batch
    builder (``_builder``) appends ``(offset, timestamp, key, value, headers)``, None once
    full, and it counts records in ``_relative_offset``; ``close()`` and ``record_count()``
    (the records of agents' sends); ``append(timestamp=, key=, value=, headers=)``, None
    once full (:meth:`~streamjoin.runtime.transport.producer.KafkaSender.send_many`, the
    changelog flush).
    Checked when the sender starts (aiokafka's batch builder lives in a private module;
    this was written against aiokafka 0.14), so a different aiokafka fails there, saying
    what is missing, not at the first record."""
    problem = _builder_problem(builder)
    if problem is not None:
        raise StartupError(
            f"aiokafka {aiokafka.__version__}: its producer's record batch builder "
            f"({type(builder).__qualname__}) {problem}; streamjoin appends records to "
            "batches itself and was written against aiokafka 0.14's BatchBuilder: install "
            "a tested aiokafka (see pyproject.toml)"
        )


def _builder_problem(builder: object) -> str | None:
    for name in ("close", "record_count"):
        if not callable(getattr(builder, name, None)):
            return f"has no {name}()"
    if type(getattr(builder, "_relative_offset", None)) is not int:
        return "counts no records in _relative_offset"
    append = getattr(getattr(builder, "_builder", None), "append", None)
    if not callable(append):
        return "has no _builder.append()"
    try:
        appended = append(0, 0, b"k", b"v", [])
    except Exception as exc:
        return f"refused _builder.append(offset, timestamp, key, value, headers): {exc!r}"
    if appended is None:
        return "refused a first record in _builder.append()"
    append = getattr(builder, "append", None)
    try:
        parameters = inspect.signature(append).parameters if callable(append) else {}
    except (TypeError, ValueError):
        parameters = {}
    missing = [name for name in _APPEND_KEYWORDS if name not in parameters]
    if missing:
        return f"has no append() taking {', '.join(missing)}="
    return None


class OutBatch:
    """Records appended for one partition, sent to the broker together."""

    __slots__ = (
        "append_record",
        "builder",
        "future",
        "handed",
        "moved",
        "partition",
        "producer",
        "records",
        "refusals",
    )

    def __init__(self, partition: int, builder: BatchBuilder, future: asyncio.Future[Any]):
        self.partition = partition
        self.builder = builder
        #: ``append_record(offset, timestamp_ms, key, value, headers)``: the record batch
        #: builder's own append (compiled in aiokafka), None once the batch is full. The
        #: send path calls it directly, once per record: aiokafka's ``BatchBuilder.append``
        #: around it costs more than the append itself. :meth:`full` and
        #: :meth:`handing_over` keep the ``BatchBuilder`` told.
        self.append_record: Callable[[int, int, bytes | None, bytes | None, Any], Any] = (
            builder._builder.append
        )
        #: each record as it was appended, its timestamp filled in (kept to describe a
        #: refusal, or to send it again)
        self.records: list[OutgoingRecord] = []
        #: the batch's acknowledgement: its first record's metadata, or why it failed
        self.future = future
        #: the producer it was handed to (a refusal retires that producer)
        self.producer: Any = None
        #: the broker refused the batch: each record's own RecordRejected
        self.refusals: list[BaseException] | None = None
        #: sent again after a refusal broke the producer: where each record went
        self.moved: list[Sent] | None = None
        #: for a flush waiting until the batch was handed to the producer
        self.handed: asyncio.Future[None] | None = None

    def full(self) -> None:
        """The batch refused a record: closed, so that aiokafka sends it without
        lingering (what ``BatchBuilder.append`` does when its builder is full)."""
        self.builder.close()

    def handing_over(self) -> None:
        """The batch is about to be handed to aiokafka, which reads its record count
        (idempotent and transactional sequence numbers) from ``BatchBuilder``."""
        self.builder._relative_offset = len(self.records)

    def was_handed(self) -> None:
        """The batch left its outbox (handed over, failed or dropped)."""
        handed = self.handed
        if handed is not None and not handed.done():
            handed.set_result(None)


class Outbox:
    """One partition's batches not yet handed to the producer, in order."""

    __slots__ = ("full", "open", "partition", "pump", "room", "submitting", "topic")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        #: the batch records are appended to (None: the next record starts one)
        self.open: OutBatch | None = None
        #: full batches waiting for their turn
        self.full: deque[OutBatch] = deque()
        #: the batch being handed to the producer right now
        self.submitting: OutBatch | None = None
        #: the task handing batches to the producer while there are any
        self.pump: asyncio.Task[None] | None = None
        #: senders waiting while too many full batches wait (backpressure)
        self.room: asyncio.Future[None] | None = None

    def last(self) -> OutBatch | None:
        """The last batch not yet handed over (or being handed over)."""
        if self.open is not None and self.open.records:
            return self.open
        if self.full:
            return self.full[-1]
        return self.submitting


class Sent(msgspec.Struct, eq=False):
    """One record sent: awaitable like the asyncio future of a send (it gives the record's
    ``RecordMetadata``), with ``done()``, ``result()``, ``exception()``, ``cancelled()``
    and ``add_done_callback()``. ``acknowledged`` is the future of its whole batch.

    A msgspec ``Struct`` (built in C, one per record sent: about half the cost of a Python
    ``__init__``); ``eq=False``: two sends are equal only if they are the same send."""

    topic: str
    batch: OutBatch
    index: int

    @property
    def acknowledged(self) -> asyncio.Future[Any]:
        """Resolves when the record's batch is acknowledged or failed (one per batch)."""
        return self.batch.future

    def done(self) -> bool:
        return self.batch.future.done()

    def cancelled(self) -> bool:
        moved = self.batch.moved
        if moved is not None:
            return moved[self.index].cancelled()
        return self.batch.future.cancelled()

    def exception(self) -> BaseException | None:
        batch = self.batch
        if batch.moved is not None:
            return batch.moved[self.index].exception()
        exc = batch.future.exception()  # raises like a future's when pending or cancelled
        if exc is not None and batch.refusals is not None:
            return batch.refusals[self.index]
        return exc

    def result(self) -> Any:
        batch = self.batch
        if batch.moved is not None:
            return batch.moved[self.index].result()
        exc = self.exception()
        if exc is not None:
            raise exc
        base = batch.future.result()
        if base is None:
            return None
        timestamp = base.timestamp
        if timestamp == -1:  # the record's own time (CreateTime topics)
            timestamp = batch.records[self.index][5]
        return RecordMetadata(
            base.topic,
            base.partition,
            base.topic_partition,
            base.offset + self.index,
            timestamp,
            base.timestamp_type,
            base.log_start_offset,
        )

    def add_done_callback(
        self, fn: Callable[[Sent], object], *, context: Context | None = None
    ) -> None:
        """Call ``fn(self)`` once the record is acknowledged or failed."""
        self.batch.future.add_done_callback(lambda _: fn(self), context=context)

    def __await__(self) -> Generator[Any, None, Any]:
        future = self.batch.future
        if not future.done():
            # a waiter of our own: cancelling the awaiting task must not cancel the batch
            waiter = future.get_loop().create_future()
            future.add_done_callback(functools.partial(_wake, waiter))
            yield from waiter.__await__()
        return self.result()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "done"
        return f"<Sent {self.topic}[{self.batch.partition}] #{self.index} {state}>"


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)
