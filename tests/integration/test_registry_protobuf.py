"""Protobuf values through the real broker and the real schema registry: an agent reads
records a newer writer wrote (one field more), writes Protobuf records of another message of
the same file, and dead-letters a record that is not in the wire format."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import streamjoin
from streamjoin.errors import IncompatibleSchema
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.schema_registry.client import SchemaRegistryClient
from streamjoin.schema_registry.protobuf import ProtobufCodec
from tests.integration.support import read_all
from tests.integration.test_local_registry import call
from tests.integration.test_registry_codecs import produce_bytes, read_bytes
from tests.unit.schema_registry.protobuf_messages import build, full_order

V1 = build(package="pbint")
V2 = build(package="pbint", with_note=True)


async def test_an_agent_reads_and_writes_protobuf_values(
    kafka_bootstrap: str,
    schema_registry_url: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    registry = SchemaRegistryClient(schema_registry_url)
    app = streamjoin.App(
        unique_topic("pb"),
        broker=f"kafka://{kafka_bootstrap}",
        commit_interval=0.2,
        state_dir=tmp_path,
    )
    orders_name, items_name = unique_topic("pb-orders"), unique_topic("pb-items")
    reader = ProtobufCodec(V1["Order"], registry)  # the old reader; app.topic binds it
    orders = app.topic(orders_name, key_serializer="str", value_serializer=reader, partitions=2)
    items = app.topic(
        items_name,
        key_serializer="str",
        value_serializer=ProtobufCodec(V1["Item"], registry),
        partitions=1,
    )
    seen: list[Any] = []

    @app.agent(orders, on_error="dead_letter", name="price")
    async def price(stream: Stream) -> None:
        async for event in stream:
            seen.append(event.value)
            order = event.value
            await items.send(
                key=event.key, value=V1["Item"](sku=order.first_line.sku, price=order.f_double)
            )

    writer = ProtobufCodec(V2["Order"], schema_registry_url).bind(orders_name, False)  # newer
    sent = []
    for n in range(6):
        order = full_order(V2)
        order.first_line.sku = f"sku-{n}"
        order.f_double = n + 0.5
        order.note = f"note {n}"
        sent.append(order)
    records = [(f"k{n}".encode(), writer.dumps(o)) for n, o in enumerate(sent)]
    records.insert(3, (b"bad", b'{"not": "protobuf"}'))

    async with app:
        await produce_bytes(kafka_bootstrap, orders_name, records)  # type: ignore[arg-type]
        out = await read_bytes(kafka_bootstrap, items_name, 6)
        dead = await read_all(kafka_bootstrap, f"{app.id}-price-dead-letters", 1)

    item_reader = ProtobufCodec(V2["Item"], schema_registry_url).bind(items_name, False)
    assert sorted((k, item_reader.loads(v)) for k, v, _ in out) == sorted(
        (f"k{n}".encode(), V2["Item"](sku=f"sku-{n}", price=n + 0.5)) for n in range(6)
    )
    # every field the old reader knows arrived; the one it does not know is kept
    assert len(seen) == 6
    by_sku = {o.first_line.sku: o for o in seen}
    for order in sent:
        got = by_sku[order.first_line.sku]
        assert got == V1["Order"].FromString(order.SerializeToString())
        assert V2["Order"].FromString(got.SerializeToString()).note == order.note
    assert [k for k, _, _ in dead] == ["bad"]
    assert "Confluent wire format" in dead[0][2]["streamjoin-error"].decode()
    # the registry holds the .proto text, its Timestamp import resolved without a reference
    latest = registry.latest(f"{orders_name}-value")
    assert latest.schema_type == "PROTOBUF"
    assert 'import "google/protobuf/timestamp.proto";' in latest.schema
    assert latest.schema_id == int.from_bytes((records[0][1] or b"")[1:5], "big")
    assert "message Item {" in registry.latest(f"{items_name}-value").schema


def test_an_incompatible_protobuf_change_fails_clearly(
    schema_registry_url: str, unique_topic: Callable[..., str]
) -> None:
    registry = SchemaRegistryClient(schema_registry_url)
    topic = unique_topic("pb-compat")
    ProtobufCodec(V1["Order"], registry).bind(topic, False).dumps(V1["Order"](f_int32=1))
    status, body = call(
        schema_registry_url, "PUT", f"/config/{topic}-value", {"compatibility": "BACKWARD"}
    )
    assert status == 200, body
    ProtobufCodec(V2["Order"], registry).bind(topic, False).dumps(V2["Order"](note="added"))
    retyped = build(package="pbint", retyped=True)
    v3 = ProtobufCodec(retyped["Order"], registry).bind(topic, False)
    with pytest.raises(IncompatibleSchema, match=rf"subject '{topic}-value'.*incompatible"):
        v3.dumps(retyped["Order"]())


def test_an_imported_file_is_registered_and_referred_to(
    schema_registry_url: str, unique_topic: Callable[..., str]
) -> None:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    package = unique_topic("shop").replace("-", "_")
    pool = descriptor_pool.DescriptorPool()
    common = descriptor_pb2.FileDescriptorProto(name=f"{package}/money.proto", package=package)
    money = common.message_type.add(name="Money")
    money.field.add(name="cents", number=1, type=3, label=1)  # proto2 optional int64
    pool.Add(common)
    main = descriptor_pb2.FileDescriptorProto(
        name=f"{package}/order.proto", package=package, syntax="proto3"
    )
    main.dependency.append(f"{package}/money.proto")
    order = main.message_type.add(name="Order")
    order.field.add(name="total", number=1, type=11, label=1, type_name=f".{package}.Money")
    pool.Add(main)
    order_class = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Order"))

    registry = SchemaRegistryClient(schema_registry_url)
    topic = unique_topic("pb-refs")
    codec = ProtobufCodec(order_class, registry).bind(topic, False)
    data = codec.dumps(order_class(total={"cents": 250}))
    assert data is not None and codec.loads(data).total.cents == 250
    written = SchemaRegistryClient(schema_registry_url).schema_of(codec.writer_id or -1)
    assert [(r.name, r.subject) for r in written.references] == [
        (f"{package}/money.proto", f"{package}/money.proto")
    ]
    assert "message Money {" in registry.latest(f"{package}/money.proto").schema
