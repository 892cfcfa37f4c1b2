"""Schema-registry codecs through the real broker and the real registry (Apicurio, Confluent
API): every Avro type read by an agent that writes JSON Schema, a table with Avro keys and
values restored after a restart, a stream-table join with Avro on both sides, the query
endpoint answering JSON, schema evolution both ways, a poison record dead-lettered,
``auto_register=False`` and an incompatible schema refused with the registry's reason."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import decimal
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

import streamjoin
from streamjoin.errors import AgentFailed, IncompatibleSchema, SchemaNotFound, TableAccessError
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.schema_registry import AvroCodec, JsonSchemaCodec, SchemaRegistryClient
from streamjoin.schema_registry.wire import unframe
from tests.integration.support import committed_offsets, end_offsets
from tests.integration.test_local_registry import call
from tests.unit.schema_registry.avro_schemas import (
    ALL_TYPES,
    ORDER_V1,
    ORDER_V2,
    ORDER_V3,
    all_types_value,
)

pytest.importorskip("fastavro")

ACCOUNT = {
    "type": "record",
    "name": "Account",
    "namespace": "bank",
    "fields": [{"name": "region", "type": "string"}, {"name": "user", "type": "long"}],
}
TOTAL = {
    "type": "record",
    "name": "Total",
    "namespace": "bank",
    "fields": [{"name": "count", "type": "long"}, {"name": "amount", "type": "double"}],
}
PAYMENT = {
    "type": "record",
    "name": "Payment",
    "namespace": "bank",
    "fields": [{"name": "amount", "type": "double"}],
}
CUSTOMER = {
    "type": "record",
    "name": "Customer",
    "namespace": "shop",
    "fields": [{"name": "name", "type": "string"}],
}
ENRICHED = {
    "type": "record",
    "name": "Enriched",
    "namespace": "shop",
    "fields": [
        {"name": "order", "type": "string"},
        {"name": "amount", "type": "long"},
        {"name": "customer", "type": ["null", "string"], "default": None},
    ],
}
#: what the agent writes for each AllTypes record: the same fields as JSON carries them
ALL_TYPES_JSON = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "AllTypesJson",
    "type": "object",
    "properties": {
        "big": {"type": "integer"},
        "text": {"type": "string"},
        "price": {"type": "string", "pattern": "^-?[0-9]+\\.[0-9]{3}$"},
        "numbers": {"type": "array", "items": {"type": "integer"}},
        "inner": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
    "required": ["big", "text", "price", "numbers", "inner"],
}


class Account(msgspec.Struct, frozen=True):
    """A table key: frozen, so hashable."""

    region: str
    user: int


class Total(msgspec.Struct):
    count: int
    amount: float


def as_json(value: Any) -> Any:
    """An Avro value as JSON can carry it (what the converting agent writes)."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, dt.date | dt.time):  # (datetime is a date)
        return value.isoformat()
    return value


async def produce_bytes(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]]
) -> None:
    """Records as they are (keys partitioned by murmur2, as streamjoin does)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def read_bytes(
    bootstrap: str, topic: str, expected: int, timeout: float = 30.0
) -> list[tuple[bytes | None, bytes | None, dict[str, bytes]]]:
    """The first ``expected`` records of ``topic``, as bytes."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    out: list[tuple[bytes | None, bytes | None, dict[str, bytes]]] = []
    try:
        async with asyncio.timeout(timeout):
            while len(out) < expected:
                batch = await consumer.getmany(timeout_ms=300)
                for records in batch.values():
                    out.extend((r.key, r.value, dict(r.headers or ())) for r in records)
    finally:
        await consumer.stop()
    return out


def registry_app(
    app_id: str,
    bootstrap: str,
    registry: SchemaRegistryClient,
    state_dir: Path,
    names: dict[str, str],
) -> tuple[streamjoin.App, list[dict[str, Any]]]:
    """The app under test; the second item collects what the v1 reader of ``evolve`` read."""
    app = streamjoin.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        commit_interval=0.2,
        state_dir=state_dir,
        web_port=0,
    )
    string = AvroCodec("string", registry)
    account = AvroCodec(ACCOUNT, registry, record_type=Account)
    all_in = app.topic(
        names["all"], key_serializer="str", value_serializer=AvroCodec(ALL_TYPES, registry)
    )
    json_out = app.topic(
        names["json"],
        key_serializer="str",
        value_serializer=JsonSchemaCodec(ALL_TYPES_JSON, registry),
        partitions=1,
    )
    payments = app.topic(
        names["payments"],
        key_serializer=account,
        value_serializer=AvroCodec(PAYMENT, registry),
        partitions=2,
    )
    totals = app.table(
        "totals",
        key_serializer=account,
        value_serializer=AvroCodec(TOTAL, registry, record_type=Total),
        default=lambda: Total(0, 0.0),
        copartitioned_with=payments,
    )
    customers = app.topic(
        names["customers"],
        key_serializer=string,
        value_serializer=AvroCodec(CUSTOMER, registry),
        partitions=2,
    )
    orders = app.topic(
        names["orders"],
        key_serializer=string,
        value_serializer=AvroCodec(ORDER_V1, registry),
        partitions=2,
    )
    enriched = app.topic(
        names["enriched"],
        key_serializer=string,
        value_serializer=AvroCodec(ENRICHED, registry),
        partitions=1,
    )
    evolve = app.topic(
        names["evolve"],
        key_serializer="str",
        value_serializer=AvroCodec(ORDER_V1, registry),
        partitions=1,
    )
    customer_table = app.topic_table(customers)
    seen_by_v1: list[dict[str, Any]] = []

    @app.agent(all_in, name="convert")
    async def convert(stream: Stream) -> None:
        async for event in stream:
            await json_out.send(key=event.key, value=as_json(event.value))

    @app.agent(payments, on_error="dead_letter", name="tally")
    async def tally(stream: Stream) -> None:
        async for event in stream:
            before = totals[event.key]
            totals[event.key] = Total(before.count + 1, before.amount + event.value["amount"])

    @app.agent(evolve, name="evolve_v1")
    async def read_v1(stream: Stream) -> None:
        async for event in stream:
            seen_by_v1.append(event.value)

    @app.join(orders, customer_table, how="left", output=enriched, name="enrich")
    def enrich(key: str, order: dict[str, Any], customer: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "order": order["id"],
            "amount": order["amount"],
            "customer": customer["name"] if customer else None,
        }

    return app, seen_by_v1


async def wait_for(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    for _ in range(int(seconds * 10)):
        if check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not there after {seconds:g}s")


async def test_registry_codecs_in_agents_tables_joins_queries_and_a_restart(
    kafka_bootstrap: str,
    schema_registry_url: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    registry = SchemaRegistryClient(schema_registry_url)
    app_id = unique_topic("registry")
    names = {
        name: unique_topic(name)
        for name in ("all", "json", "payments", "customers", "orders", "enriched", "evolve")
    }
    app, seen_by_v1 = registry_app(app_id, kafka_bootstrap, registry, tmp_path / "a", names)
    topics = app.topics
    values = [all_types_value(n) for n in range(8)]
    account = topics[names["payments"]].key_codec
    payment = topics[names["payments"]].value_codec
    string = topics[names["orders"]].key_codec
    payments = [
        (Account("eu", 1), 5.0),
        (Account("us", 2), 2.5),
        (Account("eu", 1), 1.5),
    ]
    evolve_v2 = AvroCodec(ORDER_V2, registry).bind(names["evolve"], False)
    evolve_v1 = topics[names["evolve"]].value_codec
    async with app:
        assert app.web_url is not None
        all_codec = topics[names["all"]].value_codec
        await produce_bytes(
            kafka_bootstrap, names["all"], [(b"k", all_codec.dumps(v)) for v in values]
        )
        await produce_bytes(
            kafka_bootstrap,
            names["payments"],
            [(account.dumps(k), payment.dumps({"amount": a})) for k, a in payments]
            + [(account.dumps(Account("eu", 1)), b"not avro")],
        )
        customers = topics[names["customers"]]
        await produce_bytes(
            kafka_bootstrap,
            names["customers"],
            [(string.dumps("c1"), customers.value_codec.dumps({"name": "Ada"}))],
        )
        await produce_bytes(
            kafka_bootstrap,
            names["evolve"],
            [
                (b"1", evolve_v1.dumps({"id": "o1", "amount": 1})),
                (b"2", evolve_v2.dumps({"id": "o2", "amount": 2, "currency": "USD"})),
            ],
        )
        table = app.tables["totals"]

        def stored() -> dict[Any, Any]:
            return dict(item for p in range(2) for item in table.local_items(p))

        expected = {Account("eu", 1): Total(2, 6.5), Account("us", 2): Total(1, 2.5)}
        await wait_for(lambda: stored() == expected, "the totals")
        known = app.tables[f"{names['customers']}-table"]
        await wait_for(
            lambda: any(k == "c1" for p in range(2) for k, _ in known.local_items(p)),
            "the customer",
        )
        orders = topics[names["orders"]]
        await produce_bytes(
            kafka_bootstrap,
            names["orders"],
            [
                (string.dumps("c1"), orders.value_codec.dumps({"id": "o1", "amount": 3})),
                (string.dumps("c9"), orders.value_codec.dumps({"id": "o2", "amount": 4})),
            ],
        )

        # the query endpoint: the key typed in the URL as JSON, the value answered as JSON
        key = quote('{"region": "eu", "user": 1}', safe="")
        url = f"{app.web_url.rstrip('/')}/tables/totals/{key}"
        async with aiohttp.ClientSession() as session:
            for _ in range(100):  # (queries read what the last commit flushed)
                async with session.get(url) as reply:
                    answer = await reply.json()
                if reply.status == 200 and answer["value"]["count"] == 2:
                    break
                await asyncio.sleep(0.1)
        assert (reply.status, answer["value"]) == (200, {"count": 2, "amount": 6.5}), answer
        await wait_for(lambda: len(seen_by_v1) == 2, "the v1 reader")
        # the join, Avro on both sides
        joined = await read_bytes(kafka_bootstrap, names["enriched"], 2)

    # every Avro type, read by an agent and written as JSON Schema
    json_codec = topics[names["json"]].value_codec
    converted = await read_bytes(kafka_bootstrap, names["json"], len(values))
    assert [json_codec.loads(v) for _, v, _ in converted] == [as_json(v) for v in values]
    enriched_codec = topics[names["enriched"]].value_codec
    assert {string.loads(k): enriched_codec.loads(v) for k, v, _ in joined} == {
        "c1": {"order": "o1", "amount": 3, "customer": "Ada"},
        "c9": {"order": "o2", "amount": 4, "customer": None},
    }
    # a record that is not Avro: dead-lettered with the codec's reason
    dead = await read_bytes(kafka_bootstrap, f"{app_id}-tally-dead-letters", 1)
    assert dead[0][1] == b"not avro"
    assert "not in the Confluent wire format" in dead[0][2]["streamjoin-error"].decode()
    # evolution: the v1 reader read the v2 record; a v2 reader reads the v1 record
    assert seen_by_v1 == [{"id": "o1", "amount": 1}, {"id": "o2", "amount": 2}]
    raw = await read_bytes(kafka_bootstrap, names["evolve"], 2)
    assert [evolve_v2.loads(v) for _, v, _ in raw] == [
        {"id": "o1", "amount": 1, "currency": "EUR"},
        {"id": "o2", "amount": 2, "currency": "USD"},
    ]
    # the changelog holds framed records under the changelog's subjects
    changelog = f"{app_id}-totals-changelog"
    logged = await read_bytes(kafka_bootstrap, changelog, 2)  # (at least one per key)
    key_id, _ = unframe(logged[0][0] or b"")
    value_id, _ = unframe(logged[0][1] or b"")
    assert registry.id_for(f"{changelog}-key", account.schema_text) == key_id
    assert registry.id_for(f"{changelog}-value", AvroCodec(TOTAL, registry).schema_text) == value_id

    # a new worker with empty local state restores the table from the framed changelog
    again, _ = registry_app(
        app_id, kafka_bootstrap, SchemaRegistryClient(schema_registry_url), tmp_path / "b", names
    )
    async with again:
        restored = again.tables["totals"]

        def restored_totals() -> dict[Any, Any]:
            try:
                return dict(item for p in range(2) for item in restored.local_items(p))
            except TableAccessError:  # not assigned or not restored yet
                return {}

        await wait_for(lambda: restored_totals() == expected, "the restored totals")


def test_unregistered_schemas_and_incompatible_changes_fail_clearly(
    schema_registry_url: str, unique_topic: Callable[..., str]
) -> None:
    registry = SchemaRegistryClient(schema_registry_url)
    topic = unique_topic("orders")
    reader_only = AvroCodec(ORDER_V1, registry, auto_register=False).bind(topic, False)
    with pytest.raises(SchemaNotFound, match=rf"not registered under subject '{topic}-value'"):
        reader_only.dumps({"id": "o1", "amount": 1})

    v1 = AvroCodec(ORDER_V1, registry).bind(topic, False)
    v1.dumps({"id": "o1", "amount": 1})
    assert reader_only.dumps({"id": "o1", "amount": 1}) == v1.dumps({"id": "o1", "amount": 1})
    status, body = call(
        schema_registry_url, "PUT", f"/config/{topic}-value", {"compatibility": "BACKWARD"}
    )
    assert status == 200, body
    v2 = AvroCodec(ORDER_V2, registry).bind(topic, False)
    assert registry.check_compatible(v2.subject, v2.schema_text) == []
    v2.dumps({"id": "o2", "amount": 2})
    v3 = AvroCodec(ORDER_V3, registry).bind(topic, False)
    assert registry.check_compatible(v3.subject, v3.schema_text) != []
    with pytest.raises(
        IncompatibleSchema, match=rf"subject '{topic}-value'.*incompatible"
    ) as caught:
        v3.dumps({"id": "o3", "amount": 3, "customer": "c"})
    assert caught.value.reasons and "customer" in caught.value.reasons[0]


@pytest.mark.parametrize("where", ["decode", "encode"])
async def test_an_unreachable_registry_stops_the_worker_whatever_on_error_says(
    kafka_bootstrap: str,
    schema_registry_url: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    where: str,
) -> None:
    """Dead-lettering (or skipping) a record because the registry is down would lose it for
    the registry's fault: the worker stops before committing it, to read it again later."""
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}"
    live = SchemaRegistryClient(schema_registry_url)
    app = streamjoin.App(
        unique_topic("outage"),
        broker=f"kafka://{kafka_bootstrap}",
        commit_interval=0.2,
        state_dir=tmp_path,
    )
    source = app.topic(
        unique_topic("in"),
        key_serializer="str",
        value_serializer=AvroCodec(ORDER_V1, down) if where == "decode" else "str",
        partitions=1,
    )
    sink = app.topic(
        unique_topic("out"),
        key_serializer="str",
        value_serializer=AvroCodec(ORDER_V1, down) if where == "encode" else "json",
        partitions=1,
    )

    @app.agent(source, on_error="dead_letter", name="forward")
    async def forward(stream: Stream) -> None:
        async for event in stream:
            await sink.send(key=event.key, value={"id": "o1", "amount": 1})

    framed = AvroCodec(ORDER_V1, live).bind(source.name, False).dumps({"id": "o1", "amount": 1})
    value = framed if where == "decode" else b"o1"
    await app.start()
    try:
        await produce_bytes(kafka_bootstrap, source.name, [(b"k", value)])
        with pytest.raises(AgentFailed, match="could not be reached"):
            await asyncio.wait_for(app.wait(), timeout=60)
    finally:
        await app.stop()
    assert sum(await committed_offsets(kafka_bootstrap, app.id, source.name, 1)) == 0
    dead_letters = f"{app.id}-forward-dead-letters"
    assert await end_offsets(kafka_bootstrap, dead_letters, 1) == [0]
