"""Tasks: partition *p* of one co-partition group, as the runtime holds it (no Kafka).

Like Kafka Streams' ``StreamTask``, a :class:`Task` owns everything about its
partition: its table partitions (store plus unflushed writes), what windowed
tables and joins keep per partition (stream time and expiry, join cores), its
offset ledger. The :class:`TaskManager` creates tasks from an assignment and
takes them through their lifecycle::

    created -> restoring -> running -> suspended -> closed
                     \\__________\\________________-> lost

* **restoring**: its tables are being restored; its source partitions are paused;
* **running**: events of its source partitions are dispatched to agents;
* **suspended** (revocation began): nothing new is dispatched or started; events
  already being processed finish and are acknowledged; then its writes are flushed
  and its offsets committed, exactly up to what was flushed;
* **closed**: handed back (stores stay open only as standbys);
* **lost** (fenced out of the group, or an agent did not finish in time): its
  unflushed writes are forgotten and nothing is committed: the next owner replays.

Records queued for an agent carry their task; a record whose task is no longer
running is dropped when it reaches the agent (its offset was never acknowledged,
so the next owner reads it again).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping

from streamjoin.joins.run_state import JoinPartition
from streamjoin.runtime.tasks.offset_ledger import OffsetTracker, TopicPartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.window_partition import WindowPartition
from streamjoin.topology import TaskGroup, TaskId, Topology

log = logging.getLogger("streamjoin.tasks")


class TaskState(enum.Enum):
    CREATED = "created"
    RESTORING = "restoring"
    RUNNING = "running"
    SUSPENDED = "suspended"
    CLOSED = "closed"
    LOST = "lost"


class Task:
    """Partition ``partition`` of task group ``group`` on this worker."""

    __slots__ = (
        "awaiting_sends",
        "committed_at_assignment",
        "group",
        "handed_out_to",
        "id",
        "joins",
        "partition",
        "reset_offsets",
        "restoring",
        "state",
        "tables",
        "tracker",
        "windows",
    )

    def __init__(self, group: TaskGroup, partition: int) -> None:
        self.group = group
        self.partition = partition
        self.id: TaskId = (group.index, partition)
        self.state = TaskState.CREATED
        #: table name -> its partition state (set when the store is open and restored)
        self.tables: dict[str, TablePartition] = {}
        #: tables still restoring
        self.restoring: set[str] = set(group.tables)
        self.tracker = OffsetTracker()
        #: windowed table name -> its partition's stream time and expiry (made at first use)
        self.windows: dict[str, WindowPartition] = {}
        #: stream-stream join name -> its core over this task's buffer partition (made at
        #: first use)
        self.joins: dict[str, JoinPartition] = {}
        #: processed events whose sends are not acknowledged yet
        self.awaiting_sends = 0
        #: per source partition: the group's committed offset when it was assigned here
        self.committed_at_assignment: dict[TopicPartition, int] = {}
        #: per source partition without a committed offset: where the reset policy started it
        self.reset_offsets: dict[TopicPartition, int] = {}
        #: per source partition: the next offset to hand out (after the last record handed
        #: to the task, or where a restoring partition was sought back to); the fetcher
        #: resumes a kept partition here when it is pointed elsewhere
        self.handed_out_to: dict[TopicPartition, int] = {}

    def __repr__(self) -> str:
        return f"Task({self.name}, {self.state.value})"

    @property
    def name(self) -> str:
        topics = ",".join(self.group.sources or self.group.topics)
        return f"{topics}[{self.partition}]"

    @property
    def source_partitions(self) -> list[TopicPartition]:
        return [(topic, self.partition) for topic in self.group.sources]

    @property
    def running(self) -> bool:
        return self.state is TaskState.RUNNING

    @property
    def accepts_acks(self) -> bool:
        """Acknowledgements still count (running, or suspended until its commit)."""
        return self.state is TaskState.RUNNING or self.state is TaskState.SUSPENDED


class TaskManager:
    """The tasks of this worker: created from assignments, suspended, closed or lost."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._group_of = topology.group_of_topic()
        #: table name -> index of the task group holding it
        self._table_group = {
            table: group.index for group in topology.task_groups() for table in group.tables
        }
        self.tasks: dict[TaskId, Task] = {}
        #: source partition -> its task, for every task not closed or lost
        self._by_source: dict[TopicPartition, Task] = {}

    # ------------------------------------------------------------------ lookups

    def task_for(self, topic: str, partition: int) -> Task | None:
        return self._by_source.get((topic, partition))

    def tasks_of(self, tps: Iterable[TopicPartition]) -> list[Task]:
        """The live tasks owning any of ``tps`` (each once, in id order)."""
        found = {t.id: t for tp in tps if (t := self._by_source.get(tp)) is not None}
        return [found[k] for k in sorted(found)]

    def live(self) -> list[Task]:
        """Tasks that are neither closed nor lost, in id order."""
        return [self.tasks[k] for k in sorted(self.tasks)]

    def table_task(self, table: str, partition: int) -> Task | None:
        """The live task holding partition ``partition`` of ``table``."""
        group = self._table_group.get(table)
        return None if group is None else self.tasks.get((group, partition))

    def table_partitions(self, table: str) -> list[int]:
        """Partitions of ``table`` whose task is running with the table restored, sorted."""
        group = self._table_group.get(table)
        return sorted(
            p
            for (g, p), task in self.tasks.items()
            if g == group and task.running and table in task.tables
        )

    def active_table_partitions(self) -> dict[str, set[int]]:
        """Table name -> partitions of live tasks (what the state service must restore)."""
        out: dict[str, set[int]] = {name: set() for name in self.topology.tables}
        for task in self.live():
            for table in task.group.tables:
                out[table].add(task.partition)
        return out

    # ------------------------------------------------------------------ lifecycle

    def assign(self, tps: Iterable[TopicPartition]) -> list[Task]:
        """Create tasks for newly assigned source partitions; returns the new tasks.

        A task with tables starts restoring; one without starts running.
        """
        created: list[Task] = []
        for topic, partition in sorted(set(tps)):
            group = self._group_of.get(topic)
            if group is None:
                log.warning("assigned %s[%d], which no agent reads; ignored", topic, partition)
                continue
            key = (group.index, partition)
            task = self.tasks.get(key)
            if task is None:
                task = self.tasks[key] = Task(group, partition)
                created.append(task)
                task.state = TaskState.RESTORING if group.tables else TaskState.RUNNING
            self._by_source[(topic, partition)] = task
        return created

    def table_ready(self, table: str, partition: int, state: TablePartition) -> Task | None:
        """A table partition finished restoring; returns its task if it is now running."""
        task = self.table_task(table, partition)
        if task is None:
            return None
        if table in task.tables:
            # Ready once already (two assignments in quick succession can signal it twice):
            # the partition it has may hold unflushed writes, which a new one would drop.
            return None
        task.tables[table] = state
        task.restoring.discard(table)
        if task.state is TaskState.RESTORING and not task.restoring:
            task.state = TaskState.RUNNING
            return task
        return None

    def suspend(self, tasks: Iterable[Task]) -> None:
        """Revocation began: stop dispatching to ``tasks`` (events in flight still finish)."""
        for task in tasks:
            if task.state in (TaskState.CLOSED, TaskState.LOST):
                continue
            task.state = TaskState.SUSPENDED

    def close(self, tasks: Iterable[Task]) -> None:
        """Revocation finished (flushed and committed): forget ``tasks``."""
        self._remove(tasks, TaskState.CLOSED)

    def lose(self, tasks: Iterable[Task]) -> int:
        """The tasks were lost: forget their unflushed writes; returns how many were dropped."""
        dropped = 0
        for task in tasks:
            for state in task.tables.values():
                dropped += state.abandon()
        self._remove(tasks, TaskState.LOST)
        return dropped

    def _remove(self, tasks: Iterable[Task], final: TaskState) -> None:
        for task in list(tasks):
            if self.tasks.get(task.id) is not task:
                continue
            task.state = final
            task.windows.clear()
            task.joins.clear()
            del self.tasks[task.id]
            for tp in task.source_partitions:
                if self._by_source.get(tp) is task:
                    del self._by_source[tp]

    def committable(self, tasks: Iterable[Task] | None = None) -> dict[TopicPartition, int]:
        """Offsets safe to commit for ``tasks`` (default: every live task)."""
        out: dict[TopicPartition, int] = {}
        for task in self.live() if tasks is None else tasks:
            if task.accepts_acks:
                out.update(task.tracker.committable())
        return out

    def mark_committed(self, positions: Mapping[TopicPartition, int]) -> None:
        for tp, position in positions.items():
            task = self._by_source.get(tp)
            if task is not None:
                task.tracker.mark_committed({tp: position})
