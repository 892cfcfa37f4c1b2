"""The declarations of an app frozen into one value, and the tasks they make (pure).

The App collects declarations (topics, agents, tables, joins, co-partition groups)
while its module is imported; ``app.topology()`` freezes them into a
:class:`Topology`, which is all the runtime (and the Spark jobs) get: nothing in it
holds run-time state, and nothing in the runtime reaches back into the App.

A *task* is partition *p* of one co-partition group (:class:`TaskGroup`): the
unit the assignor places, and the unit the runtime creates, suspends and closes.
It covers partition *p* of every source topic of the group and of every table
whose changelog is in the group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from streamjoin.agents import Agent
from streamjoin.errors import CopartitioningError
from streamjoin.global_tables import GlobalTable
from streamjoin.punctuation import Punctuation
from streamjoin.tables import Table
from streamjoin.timers import AppTask, Timer
from streamjoin.topics import Topic

__all__ = ["TaskGroup", "TaskId", "Topology"]

#: (group index, partition)
TaskId = tuple[int, int]


@dataclass(frozen=True)
class TaskGroup:
    """Topics whose partition *p* is processed together, and the tables they hold."""

    index: int
    #: source topics of the group (consumed by agents), sorted
    sources: tuple[str, ...]
    #: tables whose changelog is in the group, sorted by name
    tables: tuple[str, ...]
    #: every topic of the group (sources, changelogs, others), sorted
    topics: tuple[str, ...]


@dataclass(frozen=True)
class Topology:
    """Everything an app declares, frozen; what the Worker runs."""

    app_id: str
    topics: Mapping[str, Topic]
    agents: Mapping[str, Agent]
    tables: Mapping[str, Table]
    joins: Mapping[str, Any]
    #: tables materialized from a topic (``app.topic_table``): table name -> topic
    table_sources: Mapping[str, Topic]
    copartition_groups: tuple[tuple[str, ...], ...]
    #: ``@app.timer`` and ``@app.crontab``, and ``@app.task``, by name
    timers: Mapping[str, Timer] = field(default_factory=lambda: MappingProxyType({}))
    app_tasks: Mapping[str, AppTask] = field(default_factory=lambda: MappingProxyType({}))
    #: per-task punctuations of agents (``@app.punctuate``), in declaration order
    punctuations: tuple[Punctuation, ...] = ()
    #: ``app.global_table`` declarations (every worker holds all of each), by name
    global_tables: Mapping[str, GlobalTable] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def freeze(
        cls,
        app_id: str,
        *,
        topics: Mapping[str, Topic],
        agents: Mapping[str, Agent],
        tables: Mapping[str, Table],
        joins: Mapping[str, Any],
        table_sources: Mapping[str, Topic],
        copartition_groups: list[tuple[str, ...]],
        timers: Mapping[str, Timer] | None = None,
        app_tasks: Mapping[str, AppTask] | None = None,
        punctuations: tuple[Punctuation, ...] = (),
        global_tables: Mapping[str, GlobalTable] | None = None,
    ) -> Topology:
        return cls(
            app_id,
            MappingProxyType(dict(topics)),
            MappingProxyType(dict(agents)),
            MappingProxyType(dict(tables)),
            MappingProxyType(dict(joins)),
            MappingProxyType(dict(table_sources)),
            tuple(tuple(g) for g in copartition_groups),
            MappingProxyType(dict(timers or {})),
            MappingProxyType(dict(app_tasks or {})),
            punctuations=tuple(punctuations),
            global_tables=MappingProxyType(dict(global_tables or {})),
        )

    @property
    def runs_on_leader(self) -> bool:
        """Some timer or app task runs only on the group's leader: a worker joins the group
        to know whether it leads, even when no agent reads a topic."""
        timers, tasks = self.timers.values(), self.app_tasks.values()
        return any(t.on_leader for t in timers) or any(t.on_leader for t in tasks)

    # ------------------------------------------------------------------ topics

    @property
    def source_topics(self) -> frozenset[str]:
        """Topics some agent reads."""
        return frozenset(t.name for a in self.agents.values() for t in a.topics)

    @property
    def changelog_topics(self) -> frozenset[str]:
        return frozenset(t.changelog.name for t in self.tables.values())

    def aligned_groups(self) -> list[tuple[str, ...]]:
        """Source topics read together by one agent: consumed in timestamp order per partition.

        Agents sharing a topic (two joins of one stream) share one group: a single
        timestamp order of all their topics is also each agent's."""
        groups: list[set[str]] = []
        for agent in self.agents.values():
            if not agent.more_topics:
                continue
            merged = {t.name for t in agent.topics}
            for group in [g for g in groups if g & merged]:
                merged |= group
                groups.remove(group)
            groups.append(merged)
        return [tuple(sorted(g)) for g in groups]

    def ties_first(self) -> frozenset[str]:
        """Aligned topics released before the others of their group on equal timestamps."""
        return frozenset(t for a in self.agents.values() for t in a.ties_first)

    def resolve_partitions(self, existing: Mapping[str, int], default: int) -> dict[str, int]:
        """Every topic's partition count: its declared one; else an existing topic's; else
        that of the topics it is co-partitioned with; else ``default``. Declarations are
        left as they are (the counts reach the running worker through its RuntimeLink)."""
        counts: dict[str, int] = {}
        for topic in self.topics.values():
            if topic.partitions is not None:
                counts[topic.name] = topic.partitions
            elif topic.name in existing:
                counts[topic.name] = existing[topic.name]
        for group in self.copartition_groups:
            known = {counts[name] for name in group if name in counts}
            if len(known) == 1:
                count = known.pop()
                for name in group:
                    counts.setdefault(name, count)
        for name in self.topics:
            counts.setdefault(name, default)
        return counts

    def check_copartitioning(self, counts: Mapping[str, int]) -> None:
        """Raise :class:`CopartitioningError` naming every group whose counts differ."""
        for group in self.copartition_groups:
            by_count: dict[int, list[str]] = {}
            for name in group:
                if name in counts:
                    by_count.setdefault(counts[name], []).append(name)
            if len(by_count) > 1:
                detail = "; ".join(
                    f"{n} partitions: {', '.join(names)}" for n, names in sorted(by_count.items())
                )
                raise CopartitioningError(
                    f"topics declared co-partitioned have different partition counts ({detail}). "
                    "Partition p of each must hold the same keys: recreate them with one count, "
                    "or repartition one side with app.group_by(topic, key, name=..., "
                    "partitions=N) and join that instead."
                )

    # ------------------------------------------------------------------ tasks

    def task_groups(self) -> tuple[TaskGroup, ...]:
        """The co-partition groups as tasks see them: declared groups first, then each
        source topic and table changelog that is in no group, alone."""
        groups: list[set[str]] = [set(g) for g in self.copartition_groups]
        grouped = set().union(*groups) if groups else set()
        for name in sorted(self.source_topics | self.changelog_topics):
            if name not in grouped:
                groups.append({name})
                grouped.add(name)
        by_changelog = {t.changelog.name: t.name for t in self.tables.values()}
        sources = self.source_topics
        out = []
        for index, group in enumerate(groups):
            out.append(
                TaskGroup(
                    index,
                    tuple(sorted(group & sources)),
                    tuple(sorted(by_changelog[n] for n in group if n in by_changelog)),
                    tuple(sorted(group)),
                )
            )
        return tuple(out)

    def group_of_topic(self) -> dict[str, TaskGroup]:
        """Every grouped topic -> its task group."""
        return {name: g for g in self.task_groups() for name in g.topics}
