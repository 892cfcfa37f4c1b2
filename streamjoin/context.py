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

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from contextvars import Context, ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from streamjoin.errors import LifecycleError
from streamjoin.events import RawRecord

if TYPE_CHECKING:
    from streamjoin.joins.run_state import JoinPartition, JoinStats
    from streamjoin.state.table_partition import TablePartition
    from streamjoin.state.window_partition import WindowPartition, WindowStats

Headers = Sequence[tuple[str, bytes]]

#: One record on its way to a topic, as a :class:`~streamjoin.topics.Topic` hands it to a
#: :class:`Sender`: ``(topic, key, value, partition, headers, timestamp_ms)``, the key and
#: value encoded, ``partition`` None to let the sender pick it (by key, or sticky without
#: one), ``timestamp_ms`` None for now. A plain tuple, read by unpacking, and not a class:
#: one is built per record sent, and building a NamedTuple or a ``__slots__`` object costs
#: about three times as much as building the tuple (issue 31's measurement). The Kafka
#: sender keeps it in the record's batch as it was given, its timestamp filled in.
OutgoingRecord = tuple[str, bytes | None, bytes | None, int | None, Headers, int | None]


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

    async def send(self, record: OutgoingRecord) -> Delivery:
        """Enqueue a record; what it returns resolves once the broker acknowledged it."""

    def send_now(self, record: OutgoingRecord) -> Delivery | None:
        """:meth:`send` when it needs no wait (the record joins an open batch at once);
        None when it would wait or cannot tell: then ``await send(record)`` instead."""

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> Awaitable[int]:
        """Enqueue keyed records for one partition, in order, without headers or timestamps
        (changelog writes); the awaitable gives the last record's offset once every one of
        them is acknowledged. Much cheaper per record than :meth:`send`."""

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (for the key partitioner)."""


class TaskScope(Protocol):
    """The task owning a partition, as declarations see it: where they keep what they
    need per partition at run time (dropped with the task, so nothing outlives the
    partition's ownership here)."""

    @property
    def tables(self) -> dict[str, TablePartition]:
        """Table name -> the task's partition of it."""

    @property
    def windows(self) -> dict[str, WindowPartition]:
        """Windowed table name -> its partition's stream time and expiry (made at first use)."""

    @property
    def joins(self) -> dict[str, JoinPartition]:
        """Stream-stream join name -> its core over the task's buffer partition (made at
        first use)."""


class EventContext(Protocol):
    """The event an agent is processing right now, as the runtime sees it."""

    @property
    def record(self) -> RawRecord: ...

    @property
    def task(self) -> TaskScope:
        """The task of the event's partition."""

    def track_send(self, sent: Delivery) -> None:
        """Delay this event's acknowledgement until ``sent`` completes."""

    def table_partition(self, table: str) -> TablePartition | None:
        """This event's task's partition of ``table`` (None: not co-partitioned)."""

    @property
    def join_stats(self) -> dict[str, JoinStats]:
        """Join name -> its counters on this worker (kept while the worker runs)."""


#: The event being processed in this asyncio task (None outside agents).
current_event: ContextVar[EventContext | None] = ContextVar(
    "streamjoin_current_event", default=None
)

#: The agent of an in-memory channel running in this asyncio task (None elsewhere): its
#: events belong to no partition (``streamjoin.memory_channels``), and tables say so.
current_channel_agent: ContextVar[str | None] = ContextVar("streamjoin_channel_agent", default=None)


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

    def active_task(self, table: str, partition: int) -> TaskScope | None:
        """The task owning the partition when it is active here and restored; else None."""

    def held_partition(self, table: str, partition: int) -> bool:
        """Whether this worker holds the partition at all (active restoring, or standby)."""


class RuntimeLink:
    """What an App's declarations reach while a worker runs them; empty otherwise."""

    __slots__ = (
        "join_stats",
        "late_writes",
        "partitions",
        "sender",
        "tables",
        "too_late",
        "ttl_expired",
        "window_stats",
    )

    def __init__(self) -> None:
        self.sender: Sender | None = None
        self.tables: TablePartitions | None = None
        #: windowed table name -> its emission counters on this worker (running or last run)
        self.window_stats: dict[str, WindowStats] = {}
        #: join name -> its counters on this worker: the objects the agents' events count
        #: into, reached here by what counts outside events (a join's idle closes)
        self.join_stats: dict[str, JoinStats] = {}
        #: TTL table name -> keys purged as expired on this worker (running or last run)
        self.ttl_expired: dict[str, int] = {}
        #: versioned table name -> writes dropped on this worker for being older than the
        #: history, and stream-table join events dropped for the same reason (running or
        #: last run)
        self.late_writes: dict[str, int] = {}
        self.too_late: dict[str, int] = {}
        #: every topic's partition count as the worker settled it at start (declared, or
        #: the existing topic's, or the default); empty while nothing runs
        self.partitions: Mapping[str, int] = {}

    def settle_partitions(self, counts: Mapping[str, int]) -> None:
        """The partition counts settled at start (before anything is read or sent)."""
        self.partitions = dict(counts)

    def connect(self, sender: Sender, tables: TablePartitions) -> None:
        self.sender = sender
        self.tables = tables
        self.window_stats = {}
        self.join_stats = {}
        self.ttl_expired = {}
        self.late_writes = {}
        self.too_late = {}

    def disconnect(self) -> None:
        self.sender = None
        self.tables = None
        self.partitions = {}

    def require_sender(self, topic: str) -> Sender:
        if self.sender is None:
            raise LifecycleError(
                f"cannot send to {topic!r}: the app is not running "
                "(use `async with app:` or `await app.start()`)"
            )
        return self.sender
