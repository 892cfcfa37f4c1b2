"""The stream-global-table join (``app.join(stream, global_table, key=...)``).

Each event of the stream is enriched with the global table's row for ``key(event)`` as
the worker's local copy holds it when the event is processed. "Current" is the global
reader's position, not the event's timestamp (Kafka Streams' ``GlobalKTable`` joins are
not time-synchronized either): the copy is complete up to the topic's end as of the
worker's start before any event is processed, and follows the topic in the background
after that. The test driver makes it deterministic: a global table's record is applied
when it is sent, so events sent after it see it and events sent before do not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from streamjoin.agents import OnError
from streamjoin.errors import ConfigurationError
from streamjoin.events import Event
from streamjoin.global_tables import GlobalTable
from streamjoin.joins.enrich import JoinFunction, global_enricher, handle_batches
from streamjoin.stream import Stream
from streamjoin.topics import Topic

__all__ = ["StreamGlobalJoinDecl", "declare_global_join"]

KeyOf = Callable[[Event], Any]


class GlobalJoinDeclarations(Protocol):
    joins: dict[str, Any]

    def agent(
        self, topic: Topic, *, name: str | None = ..., on_error: OnError = ...
    ) -> Callable[[Any], Any]: ...


@dataclass(frozen=True)
class StreamGlobalJoinDecl:
    """A declared join of a stream with a global table (kept for the Spark twin and tooling)."""

    name: str
    stream: Topic
    table: GlobalTable
    key: KeyOf
    how: Literal["inner", "left"]
    output: Topic | None
    fun: JoinFunction


def declare_global_join(
    app: GlobalJoinDeclarations,
    name: str,
    stream: Topic,
    table: GlobalTable,
    key: KeyOf | None,
    how: str,
    output: Topic | None,
    fun: JoinFunction,
    on_error: OnError,
) -> StreamGlobalJoinDecl:
    """Declare the join and its agent (``<name>.stream``) over ``stream`` alone: the table
    is read from the local copy, so nothing is co-partitioned."""
    if key is None:
        raise ConfigurationError(
            f"join {name!r}: a join with global table {table.name!r} needs key=lambda event: "
            "... (the table key each event looks up)"
        )
    if how not in ("inner", "left"):
        raise ConfigurationError(
            f"join {name!r}: a stream-global-table join is inner or left, not {how!r}"
        )
    inner = how == "inner"
    decl = StreamGlobalJoinDecl(name, stream, table, key, how, output, fun)  # type: ignore[arg-type]
    app.joins[name] = decl
    handler = global_enricher(table.get, key, inner, fun, output)

    async def run(events: Stream) -> None:
        await handle_batches(events, handler)

    app.agent(stream, name=f"{name}.stream", on_error=on_error)(run)
    return decl
