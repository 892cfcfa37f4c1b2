"""Typed records through the real broker: msgspec Structs and pydantic models as keys and
values of topics, tables and a stream-table join; records Faust producers wrote read
into them; a record that does not fit its type dead-lettered with the field named.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

import streamjoin
from streamjoin.faust_records import FaustRecord
from streamjoin.runtime.tasks.agent_runtime import Stream
from tests.integration.support import committed_offsets, produce, read_all

pydantic = pytest.importorskip("pydantic")


class Account(msgspec.Struct, frozen=True):
    """A table key: frozen, so hashable."""

    region: str
    user: int


class Payment(msgspec.Struct):
    amount: float
    currency: str = "EUR"


class Total(msgspec.Struct):
    count: int
    amount: float


class Customer(pydantic.BaseModel):
    name: str
    tier: str


class Order(msgspec.Struct):
    id: str
    amount: float


@dataclass
class Enriched:
    order: str
    amount: float
    customer: str | None


def _key(region: str, user: int) -> str:
    """An Account key as StructJson writes it (fields sorted, compact)."""
    return f'{{"region":"{region}","user":{user}}}'


def _faust(ns: str, **fields: object) -> str:
    """A value as a Faust producer writes a record."""
    return json.dumps({**fields, "__faust": {"ns": ns}})


async def _committed(app: streamjoin.App, bootstrap: str, topic: str, n: int, parts: int) -> None:
    for _ in range(200):
        if sum(await committed_offsets(bootstrap, app.id, topic, parts)) >= n:
            return
        assert app.running, f"{app.id} stopped"
        await asyncio.sleep(0.1)
    raise AssertionError(f"{app.id} never committed {n} records of {topic}")


async def test_structs_and_models_in_agents_tables_and_a_stream_table_join(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app = streamjoin.App(
        unique_topic("typed"),
        broker=f"kafka://{kafka_bootstrap}",
        commit_interval=0.2,
        state_dir=tmp_path,
    )
    payments = app.topic(
        unique_topic("payments"), key_serializer=Account, value_serializer=Payment, partitions=2
    )
    totals = app.table(
        "totals",
        key_serializer=Account,
        value_serializer=Total,
        default=lambda: Total(0, 0.0),
        copartitioned_with=payments,
    )
    customers = app.topic(
        unique_topic("customers"),
        key_serializer="str",
        value_serializer=FaustRecord(Customer),
        partitions=2,
    )
    orders = app.topic(
        unique_topic("orders"), key_serializer="str", value_serializer=Order, partitions=2
    )
    enriched = app.topic(
        unique_topic("enriched"),
        key_serializer="str",
        value_serializer=FaustRecord(Enriched, namespace="shop.Enriched"),
        partitions=1,
    )
    customer_table = app.topic_table(customers)

    @app.agent(payments, on_error="dead_letter", name="tally")
    async def tally(stream: Stream) -> None:
        async for event in stream:
            assert isinstance(event.key, Account) and isinstance(event.value, Payment)
            before = totals[event.key]
            totals[event.key] = Total(before.count + 1, before.amount + event.value.amount)

    @app.join(orders, customer_table, how="left", output=enriched, name="enrich")
    def enrich(key: str, order: Order, customer: Customer | None) -> Enriched:
        return Enriched(order.id, order.amount, customer.name if customer else None)

    async with app:
        await produce(
            kafka_bootstrap,
            customers.name,
            [
                ("c1", _faust("shop.Customer", name="Ada", tier="gold")),
                ("c2", _faust("shop.Customer", name="Bob", tier="basic")),
            ],
        )
        await produce(
            kafka_bootstrap,
            payments.name,
            [
                (_key("eu", 1), '{"amount": 5}'),
                (_key("eu", 1), '{"amount": "ten"}'),  # does not fit Payment
                (_key("us", 2), '{"amount": 2.5, "currency": "USD"}'),
                (_key("eu", 1), '{"amount": 1.5}'),
            ],
        )
        await _committed(app, kafka_bootstrap, customers.name, 2, 2)
        await produce(
            kafka_bootstrap,
            orders.name,
            [("c1", '{"id": "o1", "amount": 3}'), ("c9", '{"id": "o2", "amount": 4}')],
        )
        out = await read_all(kafka_bootstrap, enriched.name, 2)
        await _committed(app, kafka_bootstrap, payments.name, 4, 2)
        table = app.tables["totals"]
        stored = dict(item for p in range(2) for item in table.local_items(p))

    assert stored == {Account("eu", 1): Total(2, 6.5), Account("us", 2): Total(1, 2.5)}
    dead = await read_all(kafka_bootstrap, f"{app.id}-tally-dead-letters", 1)
    assert [(k, v) for k, v, _ in dead] == [(_key("eu", 1), '{"amount": "ten"}')]
    error = dead[0][2]["streamjoin-error"].decode()
    assert "Payment.amount: Expected `float`, got `str`" in error, error
    written = {key: json.loads(value) for key, value, _ in out}
    ns = {"__faust": {"ns": "shop.Enriched"}}
    assert written == {
        "c1": {**ns, "order": "o1", "amount": 3.0, "customer": "Ada"},
        "c9": {**ns, "order": "o2", "amount": 4.0, "customer": None},
    }
