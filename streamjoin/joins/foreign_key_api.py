"""The declared foreign-key join of two topic tables:
``@app.join(left_table, right_table, foreign_key=lambda left_value: ...)``.

The tables need not be co-partitioned (nor have as many partitions). A change of a left
row (in the left table's agent) subscribes it to the right row its foreign key names,
through ``<app id>-<join>-subscription`` (partitioned like the right table, by the foreign
key); an internal agent stores the subscription in ``<join>-subscriptions`` (a table
co-partitioned with the right table) and answers with the right row through
``<app id>-<join>-response`` (partitioned like the left table). A change of a right row
(in the right table's agent) answers every subscriber again. A second internal agent
applies each response that passes the hash check of :mod:`streamjoin.joins.foreign_key`
to the result: the table named after the join, keyed by the left key, whose every change
is sent to ``output``. All state is in changelogged tables and every message goes through
a topic, so recovery and exactly-once are those of any table and agent.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from streamjoin.agents import Agent
from streamjoin.codecs import Codec
from streamjoin.context import current_event
from streamjoin.errors import ConfigurationError, JoinError, TableAccessError
from streamjoin.joins.foreign_key import (
    ForeignKeyHow,
    Outcome,
    parse_response,
    parse_subscription,
    plan_left_change,
    response_outcome,
    response_to,
    split_subscription_key,
    subscribe_message,
    subscribers_range,
    subscription_key,
    unsubscribe_message,
    value_hash,
)
from streamjoin.joins.results import PLAIN_RESULTS
from streamjoin.partitioner import partition_for_key
from streamjoin.stream import INTERNAL_AGENT_BATCH, Stream
from streamjoin.tables import Table
from streamjoin.topics import Topic

__all__ = ["ForeignKeyJoinDecl", "declare_foreign_key_join"]

ForeignKeyFunction = Callable[[Any], Any]
JoinFunction = Callable[[Any, Any, Any], Any]
OnError = Literal["stop", "skip", "dead_letter"]


class ForeignKeyDeclarations(Protocol):
    """What declaring a foreign-key join needs from the App (the facade implements it)."""

    id: str
    config: Any
    table_sources: dict[str, Topic]
    joins: dict[str, Any]
    agents: dict[str, Agent]

    def topic(
        self,
        name: str,
        *,
        key_serializer: str | Codec | type | None = None,
        value_serializer: str | Codec | type | None = None,
    ) -> Topic: ...

    def table(
        self,
        name: str,
        *,
        key_serializer: str | Codec | type | None = None,
        value_serializer: str | Codec | type | None = None,
        copartitioned_with: Any = (),
    ) -> Table: ...

    def agent(
        self, topic: Any, *, name: str | None = None, on_error: Any = "stop"
    ) -> Callable[[Any], Any]: ...

    def attach_reader(self, table: Table, topic: Topic) -> None: ...

    def on_table_update(self, table: Table, listener: Callable[[Any], Awaitable[None]]) -> None: ...


@dataclass(frozen=True)
class ForeignKeyJoinDecl:
    """A declared foreign-key join of two topic tables, kept as the table ``result``
    (keyed by the left key)."""

    name: str
    left: Table
    right: Table
    left_source: Topic
    right_source: Topic
    foreign_key: ForeignKeyFunction
    result: Table
    how: ForeignKeyHow
    output: Topic | None
    fun: JoinFunction
    #: ``<app id>-<join>-subscription`` and ``<app id>-<join>-response``
    subscriptions: Topic
    responses: Topic
    #: per right partition: (foreign key, left key) -> the subscribed value's hash
    subscription_store: Table
    #: per left partition: left key -> the foreign key it is subscribed to
    foreign_keys: Table


def _partition_of(table: Table) -> Any:
    """The current event's partition of ``table`` (raw bytes in, raw bytes out)."""
    context = current_event.get()
    state = None if context is None else context.table_partition(table.name)
    if state is None:
        raise TableAccessError(
            f"table {table.name!r}: a foreign-key join reaches it only from its own agents"
        )
    return state


def declare_foreign_key_join(
    app: ForeignKeyDeclarations,
    name: str,
    left: Table,
    right: Table,
    foreign_key: ForeignKeyFunction,
    how: str,
    output: Topic | None,
    fun: JoinFunction,
    on_error: OnError,
) -> ForeignKeyJoinDecl:
    """Declare the join's topics, tables and agents (see the module docstring)."""
    if not callable(foreign_key):
        raise ConfigurationError(
            f"join {name!r}: foreign_key= is a function of the left value, got {foreign_key!r}"
        )
    if how not in ("inner", "left"):
        raise ConfigurationError(
            f"join {name!r}: a foreign-key join is inner or left, not {how!r} (a right row "
            "has no single left row to be joined with)"
        )
    left_source = app.table_sources.get(left.name)
    right_source = app.table_sources.get(right.name)
    if left_source is None or right_source is None:
        raise ConfigurationError(
            f"join {name!r}: a foreign-key join needs tables read from topics "
            "(declare them with app.topic_table(topic))"
        )
    kind: ForeignKeyHow = "inner" if how == "inner" else "left"
    subscriptions = app.topic(
        f"{app.id}-{name}-subscription", key_serializer="raw", value_serializer="raw"
    )
    responses = app.topic(f"{app.id}-{name}-response", key_serializer="raw", value_serializer="raw")
    store = app.table(
        f"{name}-subscriptions",
        key_serializer="raw",
        value_serializer="raw",
        copartitioned_with=[right_source, subscriptions],
    )
    foreign_keys = app.table(
        f"{name}-foreign-keys",
        key_serializer="raw",
        value_serializer="raw",
        copartitioned_with=[left_source],
    )
    result = app.table(
        name, key_serializer=left.key_codec, copartitioned_with=[left_source, responses]
    )
    app.attach_reader(right, subscriptions)  # a subscription is answered with the right row
    app.attach_reader(left, responses)  # a response is checked against the left row
    decl = ForeignKeyJoinDecl(
        name,
        left,
        right,
        left_source,
        right_source,
        foreign_key,
        result,
        kind,
        output,
        fun,
        subscriptions,
        responses,
        store,
        foreign_keys,
    )
    app.joins[name] = decl
    sides = _Sides(decl, app)
    app.on_table_update(left, sides.left_changed)
    app.on_table_update(right, sides.right_changed)
    app.agent(subscriptions, name=f"{name}.subscriptions", on_error=on_error)(
        sides.run_subscriptions
    )
    app.agent(responses, name=f"{name}.responses", on_error=on_error)(sides.run_responses)
    for agent in (f"{name}.subscriptions", f"{name}.responses"):
        app.agents[agent].take_raw_records()  # (raw bytes both sides: nothing to decode)
    return decl


class _Sides:
    """The join's work on each side: what runs in the tables' agents and its own two."""

    def __init__(self, decl: ForeignKeyJoinDecl, app: ForeignKeyDeclarations) -> None:
        self.decl = decl
        self.app = app
        self._guarantee: str | None = None

    async def left_changed(self, key: Any) -> None:
        """A left row was written or deleted (in the left table's agent): move its
        subscription and settle its result when no response will come."""
        decl = self.decl
        left, right = decl.left, decl.right
        left_key = left.key_codec.dumps(key)
        if left_key is None:
            return
        value = _partition_of(left).lookup(left_key)
        new_fk: bytes | None = None
        if value is not None:
            try:
                chosen = decl.foreign_key(left.value_codec.loads(value))
            except Exception as exc:
                raise JoinError(
                    f"join {decl.name!r}: foreign_key failed on the value of left key {key!r}: "
                    f"{exc!r}"
                ) from exc
            new_fk = None if chosen is None else right.key_codec.dumps(chosen)
        foreign_keys = _partition_of(decl.foreign_keys)
        old_fk = foreign_keys.lookup(left_key)
        plan = plan_left_change(old_fk, value, new_fk, decl.how)
        if plan.unsubscribe is not None:
            sending = self._subscribe(plan.unsubscribe, left_key, unsubscribe_message())
            if sending is not None:
                await sending
        if plan.subscribe is not None and value is not None:
            context = current_event.get()
            partition = 0 if context is None else context.record.partition
            message = subscribe_message(value_hash(value), partition)
            sending = self._subscribe(plan.subscribe, left_key, message)
            if sending is not None:
                await sending
        if new_fk != old_fk:
            foreign_keys.put(left_key, new_fk)
        if plan.outcome is not Outcome.KEEP:
            settling = self._settle(key, left_key, plan.outcome, value, None)
            if settling is not None:
                await settling

    def _subscribe(
        self, foreign_key: bytes, left_key: bytes, message: bytes
    ) -> Awaitable[object] | None:
        """Send a (un)subscription to the right partition of ``foreign_key``; what is left
        to await (None: it joined a batch at once, no coroutine)."""
        decl = self.decl
        topic, key = decl.subscriptions, subscription_key(foreign_key, left_key)
        partition = partition_for_key(foreign_key, decl.right.partitions)
        if topic.try_send(key=key, value=message, partition=partition) is None:
            return topic.send(key=key, value=message, partition=partition)
        return None

    async def run_subscriptions(self, stream: Stream) -> None:
        """Store each subscription (drop each unsubscription) and answer it with the right
        row as it is now. (Its records come undecoded: raw bytes both sides.)"""
        decl = self.decl
        async for batch in stream.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
            # (a batch is one task's: the same partitions for all its events)
            store = _partition_of(decl.subscription_store)
            right = _partition_of(decl.right)
            for event in batch:
                key: bytes = event.key
                stored = parse_subscription(event.value)
                if stored is None:
                    # (the row subscribed to this foreign key before, so the store holds
                    # the key: a delete with no lookup at the flush; a repeated
                    # unsubscription, replayed, costs one needless tombstone at worst)
                    store.remove(key, None)
                    continue
                store.put(key, stored)
                foreign_key, _ = split_subscription_key(key)
                sending = self._respond(key, stored, right.lookup(foreign_key))
                if sending is not None:
                    await sending

    def _respond(
        self, key: bytes, stored: bytes, right_value: bytes | None
    ) -> Awaitable[object] | None:
        """Send the response to one subscription; what is left to await (None: none)."""
        left_key, partition, message = response_to(key, stored, right_value)
        topic = self.decl.responses
        if topic.try_send(key=left_key, value=message, partition=partition) is None:
            return topic.send(key=left_key, value=message, partition=partition)
        return None

    async def right_changed(self, key: Any) -> None:
        """A right row was written or deleted (in the right table's agent): answer every
        left row subscribed to it again."""
        decl = self.decl
        foreign_key = decl.right.key_codec.dumps(key)
        if foreign_key is None:
            return
        right_value = _partition_of(decl.right).lookup(foreign_key)
        start, end = subscribers_range(foreign_key)
        for sub_key, stored in list(_partition_of(decl.subscription_store).scan(start, end)):
            sending = self._respond(sub_key, stored, right_value)
            if sending is not None:
                await sending

    async def run_responses(self, stream: Stream) -> None:
        """Apply each response computed for the left row's current value. (Its records
        come undecoded: raw bytes both sides.)"""
        decl = self.decl
        left, how = decl.left, decl.how
        load_key = left.key_codec.loads
        async for batch in stream.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
            left_rows = _partition_of(left)  # (one task's batch: one partition)
            for event in batch:
                left_key: bytes = event.key
                left_hash, right_value = parse_response(event.value)
                current = left_rows.lookup(left_key)
                outcome = response_outcome(current, left_hash, right_value, how)
                if outcome is not Outcome.KEEP:
                    settling = self._settle(
                        load_key(left_key), left_key, outcome, current, right_value
                    )
                    if settling is not None:
                        await settling

    def _settle(
        self,
        key: Any,
        key_bytes: bytes,
        outcome: Outcome,
        left_value: bytes | None,
        right_value: bytes | None,
    ) -> Awaitable[None] | None:
        """Write the left row's result (DELETE or JOIN) and send it; what is left to await
        (None: nothing, the usual case: no coroutine per result)."""
        joined: Any = None
        if outcome is Outcome.JOIN and left_value is not None:
            decl = self.decl
            lv = decl.left.value_codec.loads(left_value)
            rv = None if right_value is None else decl.right.value_codec.loads(right_value)
            joined = decl.fun(key, lv, rv)
            if type(joined) not in PLAIN_RESULTS and inspect.isawaitable(joined):
                return self._settle_awaited(key, key_bytes, joined)
        return self._write_and_send(key, key_bytes, joined)

    async def _settle_awaited(self, key: Any, key_bytes: bytes, joining: Awaitable[Any]) -> None:
        """:meth:`_settle` of a join function that returned an awaitable."""
        sending = self._write_and_send(key, key_bytes, await joining)
        if sending is not None:
            await sending

    def _write_and_send(self, key: Any, key_bytes: bytes, joined: Any) -> Awaitable[None] | None:
        """Write the result ``joined`` (None: deleted) and send it.

        Under exactly-once an unchanged result is not sent again: the table and the output
        commit together, so the table says what was sent. Under at-least-once a crash can
        leave a sent result out of the restored table; every result is sent then, so the
        output's last record for a key is always the table's value. "Unchanged" compares the
        encoded bytes (one encode, no decode of the stored value; codecs that could encode
        equal values differently at worst send an equal value again)."""
        decl = self.decl
        result = decl.result
        encoded = None if joined is None else result.value_codec.dumps(joined)
        rows = _partition_of(result)
        if encoded != rows.lookup(key_bytes):
            rows.put(key_bytes, encoded)  # (None: a delete)
        elif self._exactly_once():
            return None
        output = decl.output
        if output is None or output.try_send(key=key, value=joined) is not None:
            return None
        return self._send_later(key, joined)

    async def _send_later(self, key: Any, joined: Any) -> None:
        """Send a result that could not join a batch at once. Meanwhile the other agent
        that settles this row (the left table's, or the responses') may write and send a
        newer result: send the row's value until it is what was sent last, so the output
        ends as the table does."""
        decl = self.decl
        output, result = decl.output, decl.result
        assert output is not None
        sent: Any = joined
        await output.send(key=key, value=sent)
        while (current := result.get(key)) != sent:
            sent = current
            await output.send(key=key, value=sent)

    def _exactly_once(self) -> bool:
        """Whether the app runs exactly-once (read at the first result: settings may change
        until the app starts)."""
        if self._guarantee is None:
            self._guarantee = self.app.config.processing_guarantee
        return self._guarantee == "exactly_once"
