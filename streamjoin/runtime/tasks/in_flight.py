"""The event an actor is processing: the runtime's side of :mod:`streamjoin.context`.

Tables, joins and ``current_record()`` reach the event's record and task through it, and
each send made while processing it is tracked on it; the acknowledgements and the error
policy read it once the event is done. An event that sent nothing leaves its context to
the actor's next event, so the usual event allocates nothing.
"""

from __future__ import annotations

from typing import Protocol

from streamjoin.agents import Agent
from streamjoin.context import Delivery
from streamjoin.events import RawRecord
from streamjoin.joins.run_state import JoinStats
from streamjoin.runtime.tasks.task import Task
from streamjoin.state.table_partition import TablePartition


class Actor(Protocol):
    """The actor processing an event, as the error policy sees it (an
    :class:`~streamjoin.runtime.tasks.actors.AgentRunner`)."""

    @property
    def agent(self) -> Agent: ...

    @property
    def name(self) -> str: ...


class InFlight:
    """One event (or one batch of events) an actor is processing."""

    __slots__ = (
        "batch",
        "join_stats",
        "pending",
        "record",
        "runner",
        "senders",
        "sends",
        "settled",
        "split_errors",
        "task",
    )

    def __init__(
        self, raw: RawRecord, task: Task, join_stats: dict[str, JoinStats], runner: Actor
    ) -> None:
        #: (an attribute, not a property: windowed tables read it twice per access)
        self.record = raw
        self.task = task
        #: join name -> its counters, kept for the worker's lifetime
        self.join_stats = join_stats
        self.runner = runner
        self.sends: list[Delivery] = []
        #: acknowledgements (record batches) still awaited before the event counts
        self.pending = 0
        #: a batch of events (``stream.take``): all its records, and which record each send
        #: was made for (``record`` moves from event to event as the batch is iterated)
        self.batch: list[RawRecord] | None = None
        self.senders: list[RawRecord] = []
        #: records of the batch that an error policy acknowledged on its own (by id)
        self.settled: set[int] = set()
        #: an error in the batch gets the policy for its event alone (``per_event_errors``)
        self.split_errors = False

    def track_send(self, sent: Delivery) -> None:
        self.sends.append(sent)
        if self.batch is not None:
            self.senders.append(self.record)

    def table_partition(self, table: str) -> TablePartition | None:
        return self.task.tables.get(table)
