"""The one door between declarations and the running worker (no asyncio, no Kafka).

Declarations (topics, tables, joins) are plain values; at run time they need three
things from the worker: where to send records, which task the event being processed
belongs to, and the local table partitions for reads outside agents. The runtime
provides them through this module, so declarations never import the runtime and the
runtime never imports the app:

* :data:`current_event` is set by the agent runtime for the duration of each event: it
  knows the record, the task, and delays the event's acknowledgement until the records
  sent while processing it are acknowledged;
* a :class:`RuntimeLink` is created by the App for its declarations and connected by the
  worker while it runs (a sender, and the worker's table partitions).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from contextvars import Context, ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from streamjoin.errors import TransportNotReady
from streamjoin.events import RawRecord

if TYPE_CHECKING:
    from streamjoin.state.table_partition import TablePartition

Headers = Sequence[tuple[str, bytes]]


class Delivery(Protocol):
    """What a send returns: the record's acknowledgement, read like an asyncio future
    (``await`` it for the record's metadata). The Kafka producer's also has
    ``acknowledged``, one future for all the records the broker acknowledges together
    (its record batch): the agent runtime waits on that instead of on each record."""

    def __await__(self) -> Generator[Any, None, Any]: ...

    def done(self) -> bool: ...

    def cancelled(self) -> bool: ...

    def result(self) -> Any: ...

    def exception(self) -> BaseException | None: ...

    def add_done_callback(
        self, fn: Callable[[Any], object], /, *, context: Context | None = None
    ) -> None: ...


class Sender(Protocol):
    """Where encoded records go: the Kafka producer, or the in-memory test driver."""

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None,
        headers: Headers,
        timestamp_ms: int | None,
    ) -> Delivery:
        """Enqueue a record; what it returns resolves once the broker acknowledged it."""

    def send_now(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None,
        headers: Headers,
        timestamp_ms: int | None,
    ) -> Delivery | None:
        """:meth:`send` when it needs no wait (the record joins an open batch at once);
        None when it would wait or cannot tell: then ``await send(...)`` instead."""

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> Awaitable[int]:
        """Enqueue keyed records for one partition, in order, without headers or timestamps
        (changelog writes); the awaitable gives the last record's offset once every one of
        them is acknowledged. Much cheaper per record than :meth:`send`."""

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (for the key partitioner)."""


class EventContext(Protocol):
    """The event an agent is processing right now, as the runtime sees it."""

    @property
    def record(self) -> RawRecord: ...

    def track_send(self, sent: Delivery) -> None:
        """Delay this event's acknowledgement until ``sent`` completes."""

    def table_partition(self, table: str) -> TablePartition | None:
        """This event's task's partition of ``table`` (None: not co-partitioned)."""

    @property
    def task_values(self) -> dict[str, Any]:
        """Values the event's task keeps (join cores): dropped with the task, so nothing
        outlives the partition's ownership."""

    @property
    def worker_values(self) -> dict[str, Any]:
        """Values the worker keeps while it runs (join counters)."""


#: The event being processed in this asyncio task (None outside agents).
current_event: ContextVar[EventContext | None] = ContextVar(
    "streamjoin_current_event", default=None
)


def current_record() -> RawRecord | None:
    """The record whose event the calling agent is processing (None outside agents)."""
    event = current_event.get()
    return None if event is None else event.record


class TablePartitions(Protocol):
    """The worker's table partitions, for reads outside agents."""

    def active_partition(self, table: str, partition: int) -> TablePartition | None:
        """The partition's state when it is active here and restored; else None."""

    def active_partitions(self, table: str) -> list[int]:
        """Partitions of ``table`` active and restored here, sorted."""

    def held_partition(self, table: str, partition: int) -> bool:
        """Whether this worker holds the partition at all (active restoring, or standby)."""


class RuntimeLink:
    """What an App's declarations reach while a worker runs them; empty otherwise."""

    __slots__ = ("sender", "tables")

    def __init__(self) -> None:
        self.sender: Sender | None = None
        self.tables: TablePartitions | None = None

    def connect(self, sender: Sender, tables: TablePartitions) -> None:
        self.sender = sender
        self.tables = tables

    def disconnect(self) -> None:
        self.sender = None
        self.tables = None

    def require_sender(self, topic: str) -> Sender:
        if self.sender is None:
            raise TransportNotReady(
                f"cannot send to {topic!r}: the app is not running "
                "(use `async with app:` or `await app.start()`)"
            )
        return self.sender
