"""A table declared without ``copartitioned_with`` is co-partitioned with the topics of
the agents whose code uses it by name (streamjoin.table_inference), as a Faust port
expects; only direct uses count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from streamjoin import App
from streamjoin.errors import AgentFailed
from streamjoin.stream import Stream
from streamjoin.table_inference import names_used
from streamjoin.tables import Table
from streamjoin.testing.driver import TestDriver

SHARED = object()


def test_names_used_finds_globals_closure_cells_and_nested_code() -> None:
    captured = object()

    async def agent(stream: Any) -> None:
        async for _event in stream:
            print(SHARED, [captured for _ in range(1)])

    used = names_used(agent)
    assert used["SHARED"] is SHARED and used["captured"] is captured
    assert "_event" not in used and "stream" not in used  # locals are not loads by name


def _group_of(app: App, topic: str) -> set[str]:
    topology = app.topology()
    return next((set(g) for g in topology.copartition_groups if topic in g), set())


def test_a_table_used_by_an_agent_is_copartitioned_with_its_topic() -> None:
    app = App("infer", topic_partitions=4)
    words = app.topic("words", key_serializer="str", value_serializer="str")

    @app.agent(words)
    async def count(stream: Stream) -> None:
        async for word in stream.values():
            counts[word] += 1

    counts = app.table("counts", default=int, key_serializer="str")
    assert _group_of(app, "words") == {"words", "infer-counts-changelog"}
    assert counts.writers == frozenset({"words"})
    assert _group_of(app, "words") == {"words", "infer-counts-changelog"}  # (idempotent)


def test_tables_with_declared_writers_and_tables_not_used_directly_are_left_alone() -> None:
    app = App("infer-alone")
    a, b = app.topic("a"), app.topic("b")
    declared = app.table("declared", copartitioned_with=b)
    hidden = app.table("hidden")
    holder = {"table": hidden}

    @app.agent(a)
    async def use(stream: Stream) -> None:
        async for event in stream:
            declared[event.key] = 1  # (fails at run time: not co-partitioned with a)
            holder["table"][event.key] = 1

    app.topology()
    assert declared.writers == frozenset({"b"}) and hidden.writers == frozenset()


async def test_a_port_without_copartitioned_with_counts_through_the_driver() -> None:
    app = App("infer-run", topic_partitions=3)
    words = app.topic("words", key_serializer="str", value_serializer="str")
    counts = app.table("counts", default=int, key_serializer="str")

    def make() -> Callable[[Stream], Any]:
        async def count(stream: Stream) -> None:  # (the table through a closure cell)
            async for word in stream.values():
                counts[word] += 1

        return count

    app.agent(words, name="count")(make())
    async with TestDriver(app) as driver:
        for word in ["a", "b", "a", "c", "a"]:
            await driver.put("words", key=word, value=word)
        await driver.drain()
        assert {w: counts[w] for w in "abc"} == {"a": 3, "b": 1, "c": 1}


async def test_a_table_used_only_through_a_helper_still_says_what_to_declare() -> None:
    app = App("infer-helper")
    words = app.topic("words", key_serializer="str", value_serializer="str")
    tables: dict[str, Table] = {}

    def bump(word: str) -> None:
        tables["counts"][word] += 1

    @app.agent(words)
    async def count(stream: Stream) -> None:
        async for word in stream.values():
            bump(word)

    tables["counts"] = app.table("counts", default=int, key_serializer="str")
    async with TestDriver(app) as driver:
        await driver.put("words", key="a", value="a")
        with pytest.raises(AgentFailed, match="copartitioned_with"):
            await driver.drain()
