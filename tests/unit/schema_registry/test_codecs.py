"""The Avro and JSON Schema registry codecs, against the in-process fake registry: every Avro
type, record types, evolution both ways, errors naming the field, subjects, binding by
declarations, the query endpoint's text keys, pickling; and a printed speed check."""

from __future__ import annotations

import dataclasses
import json
import pickle
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

import streamjoin
from streamjoin.errors import (
    ArgumentTypeError,
    ConfigurationError,
    DecodeError,
    EncodeError,
    SchemaNotFound,
)
from streamjoin.query.routing import parse_key
from streamjoin.schema_registry import AvroCodec, JsonSchemaCodec, SchemaRegistryClient
from streamjoin.schema_registry.wire import frame, unframe
from tests.unit.schema_registry.avro_schemas import ALL_TYPES, ORDER_V1, ORDER_V2, all_types_value
from tests.unit.schema_registry.fake_registry import FakeRegistry, fake_registry


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeRegistry]:
    with fake_registry() as registry:
        yield registry


@pytest.fixture
def client(fake: FakeRegistry) -> SchemaRegistryClient:
    return SchemaRegistryClient(fake.url)


class Inner(msgspec.Struct):
    x: int


@dataclasses.dataclass
class Order:
    id: str
    amount: int
    currency: str = "EUR"


class OrderStruct(msgspec.Struct, frozen=True):
    id: str
    amount: int


def test_every_avro_type_round_trips(client: SchemaRegistryClient) -> None:
    codec = AvroCodec(ALL_TYPES, client).bind("all", False)
    for n in range(6):
        value = all_types_value(n)
        data = codec.dumps(value)
        assert data is not None
        assert unframe(data)[0] == codec.writer_id
        assert codec.loads(data) == value
    assert codec.dumps(None) is None and codec.loads(None) is None


def test_primitive_schemas_are_keys(client: SchemaRegistryClient) -> None:
    key = AvroCodec("string", client).bind("words", True)
    assert key.subject == "words-key" and key.name == "avro[words-key]"
    assert key.loads(key.dumps("héllo")) == "héllo"
    number = AvroCodec('"long"', client).bind("words", True)
    assert number.loads(number.dumps(2**40)) == 2**40


def test_record_types_are_read_into_and_written_from(client: SchemaRegistryClient) -> None:
    dataclass_codec = AvroCodec(ORDER_V2, client, record_type=Order).bind("orders", False)
    order = Order("o1", 5, "USD")
    assert dataclass_codec.loads(dataclass_codec.dumps(order)) == order
    assert dataclass_codec.loads(dataclass_codec.dumps({"id": "o2", "amount": 1})) == Order("o2", 1)
    struct_codec = AvroCodec(ORDER_V1, client, record_type=OrderStruct).bind("o2", True)
    assert struct_codec.loads(struct_codec.dumps(OrderStruct("a", 1))) == OrderStruct("a", 1)
    nested = AvroCodec(
        {
            "type": "record",
            "name": "Outer",
            "fields": [{"name": "inner", "type": ALL_TYPES["fields"][-1]["type"]}],
        },
        client,
        record_type=_Outer,
    ).bind("nested", False)
    assert nested.loads(nested.dumps(_Outer(Inner(3)))) == _Outer(Inner(3))
    with pytest.raises(ArgumentTypeError, match="record_type"):
        AvroCodec(ORDER_V1, client, record_type=dict)


class _Outer(msgspec.Struct):
    inner: Inner


def test_schema_evolution_reads_old_and_new_records(client: SchemaRegistryClient) -> None:
    v1 = AvroCodec(ORDER_V1, client).bind("evolving", False)
    v2 = AvroCodec(ORDER_V2, client).bind("evolving", False)
    old = v1.dumps({"id": "o1", "amount": 1})
    new = v2.dumps({"id": "o2", "amount": 2, "currency": "USD"})
    assert old is not None and new is not None and old[:5] != new[:5]
    # a v2 reader fills the new field's default in; a v1 reader drops it
    assert v2.loads(old) == {"id": "o1", "amount": 1, "currency": "EUR"}
    assert v1.loads(new) == {"id": "o2", "amount": 2}
    typed = AvroCodec(ORDER_V2, client, record_type=Order).bind("evolving", False)
    assert typed.loads(old) == Order("o1", 1)


def test_encode_errors_name_the_field(client: SchemaRegistryClient) -> None:
    codec = AvroCodec(ORDER_V1, client).bind("bad", False)
    with pytest.raises(EncodeError, match=r"avro\[bad-value\].*shop\.Order\.amount is <ten>"):
        codec.dumps({"id": "o1", "amount": "ten"})
    with pytest.raises(EncodeError, match="amount"):
        codec.dumps({"id": "o1"})
    with pytest.raises(EncodeError, match="avro"):
        codec.dumps(["not", "a", "record"])


def test_bad_records_are_decode_errors(fake: FakeRegistry, client: SchemaRegistryClient) -> None:
    codec = AvroCodec(ORDER_V1, client).bind("poison", False)
    good = codec.dumps({"id": "o1", "amount": 1})
    assert good is not None
    with pytest.raises(DecodeError, match=r"avro\[poison-value\] codec: .*wire format"):
        codec.loads(b'{"id": "o1"}')
    with pytest.raises(DecodeError, match="schema id 99999 is not in the registry"):
        codec.loads(frame(99999, b"\x02a\x02"))
    with pytest.raises(DecodeError, match=r"avro\[poison-value\] codec could not decode"):
        codec.loads(good[:6])  # truncated
    json_id = client.register("other", '{"type":"object"}', "JSON")
    with pytest.raises(DecodeError, match="is a JSON schema, not AVRO"):
        codec.loads(frame(json_id, b"{}"))


def test_subjects_follow_the_naming_strategy(client: SchemaRegistryClient) -> None:
    assert AvroCodec(ORDER_V1, client).bind("t", False).subject == "t-value"
    assert AvroCodec(ORDER_V1, client).bind("t", True).subject == "t-key"
    record = AvroCodec(ORDER_V1, client, subject_name_strategy="record").bind("t", False)
    assert record.subject == "shop.Order"
    both = AvroCodec(ORDER_V1, client, subject_name_strategy="topic_record").bind("t", False)
    assert both.subject == "t-shop.Order"
    assert AvroCodec(ORDER_V1, client, subject="fixed").bind("t", False).subject == "fixed"
    with pytest.raises(ConfigurationError, match="named record schema"):
        _ = AvroCodec("string", client, subject_name_strategy="record").subject
    with pytest.raises(ConfigurationError, match="give subject= explicitly"):
        AvroCodec(ORDER_V1, client).dumps({"id": "x", "amount": 1})
    with pytest.raises(ConfigurationError, match="subject_name_strategy must be one of"):
        AvroCodec(ORDER_V1, client, subject_name_strategy="topicname")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not a valid Avro schema"):
        AvroCodec({"type": "nonsense"}, client)


def test_auto_register_off_and_latest_version(
    fake: FakeRegistry, client: SchemaRegistryClient
) -> None:
    unregistered = AvroCodec(ORDER_V1, client, auto_register=False).bind("absent", False)
    with pytest.raises(
        SchemaNotFound, match="not registered under subject 'absent-value' and auto_register=False"
    ):
        unregistered.dumps({"id": "x", "amount": 1})
    registered = AvroCodec(ORDER_V1, client).bind("absent", False)
    registered.dumps({"id": "x", "amount": 1})
    assert unregistered.dumps({"id": "x", "amount": 1}) == registered.dumps(
        {"id": "x", "amount": 1}
    )
    AvroCodec(ORDER_V2, client).bind("absent", False).dumps({"id": "x", "amount": 1})
    latest = AvroCodec(ORDER_V1, client, use_latest_version=True).bind("absent", False)
    data = latest.dumps({"id": "x", "amount": 1, "currency": "CHF"})  # written as v2
    assert data is not None
    assert client.schema_of(unframe(data)[0]).schema == json.dumps(ORDER_V2, separators=(",", ":"))
    assert latest.loads(data) == {"id": "x", "amount": 1}  # read as v1


def test_json_schema_validates_both_ways(client: SchemaRegistryClient) -> None:
    schema = {
        "title": "Order",
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "lines": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"qty": {"type": "integer", "minimum": 1}},
                },
            },
        },
        "required": ["id"],
    }
    codec = JsonSchemaCodec(schema, client).bind("orders", False)
    value = {"id": "o1", "lines": [{"qty": 2}]}
    data = codec.dumps(value)
    assert data is not None and bytes(unframe(data)[1]) == b'{"id":"o1","lines":[{"qty":2}]}'
    assert codec.loads(data) == value
    with pytest.raises(
        EncodeError,
        match=r"jsonschema\[orders-value\].*\$\.lines\[0\]\.qty: 0 is less than the minimum of 1",
    ):
        codec.dumps({"id": "o1", "lines": [{"qty": 0}]})
    with pytest.raises(EncodeError, match="'id' is a required property"):
        codec.dumps({"lines": []})
    writer_id = unframe(data)[0]
    with pytest.raises(
        DecodeError, match=rf"schema id {writer_id}: \$\.id: 5 is not of type 'string'"
    ):
        codec.loads(frame(writer_id, b'{"id": 5}'))
    with pytest.raises(DecodeError, match="not JSON"):
        codec.loads(frame(writer_id, b"{"))
    typed = JsonSchemaCodec(schema, client, record_type=_Order).bind("orders", False)
    assert typed.loads(data) == _Order("o1", [{"qty": 2}])
    assert typed.loads(typed.dumps(_Order("o2"))) == _Order("o2")
    assert JsonSchemaCodec(schema, client, subject_name_strategy="record").subject == "Order"
    with pytest.raises(ConfigurationError, match="not a valid JSON Schema"):
        JsonSchemaCodec({"type": 5}, client)


class _Order(msgspec.Struct):
    id: str
    lines: list[dict[str, Any]] = []


def test_declarations_bind_codecs_to_their_topic_and_the_changelog(
    client: SchemaRegistryClient,
) -> None:
    app = streamjoin.App("shop", broker="kafka://127.0.0.1:9")
    value = AvroCodec(ORDER_V1, client)
    key = AvroCodec("string", client)
    orders = app.topic("orders", key_serializer=key, value_serializer=value)
    assert (orders.key_codec.name, orders.value_codec.name) == (
        "avro[orders-key]",
        "avro[orders-value]",
    )
    assert app.topic("orders", value_serializer=value) is orders  # the same codec agrees
    table = app.table("totals", key_serializer=key, value_serializer=value)
    assert table.key_codec.name == "avro[shop-totals-changelog-key]"
    assert table.value_codec.name == "avro[shop-totals-changelog-value]"
    assert value.name == "avro[shop.Order]"  # the declared codec itself is unchanged
    with pytest.raises(ConfigurationError, match="declared twice"):
        app.topic("orders", value_serializer=AvroCodec(ORDER_V2, client))


def test_the_query_endpoint_parses_text_keys(client: SchemaRegistryClient) -> None:
    words = AvroCodec("string", client).bind("words", True)
    assert parse_key("42", words) == words.dumps("42")
    assert parse_key("héllo", words) == words.dumps("héllo")
    records = AvroCodec(ORDER_V1, client).bind("orders", True)
    assert parse_key('{"amount": 1, "id": "a"}', records) == records.dumps({"id": "a", "amount": 1})


def test_codecs_pickle_without_their_caches(
    fake: FakeRegistry, client: SchemaRegistryClient
) -> None:
    for codec in (
        AvroCodec(ORDER_V2, client, record_type=Order).bind("pickled", False),
        JsonSchemaCodec({"type": "object"}, client).bind("pickled-json", False),
    ):
        data = codec.dumps({"id": "a", "amount": 1})
        copy = pickle.loads(pickle.dumps(codec))
        assert copy == codec and copy.writer_id is None
        assert copy.loads(data) == codec.loads(data)


def test_speed_per_record_is_printed(client: SchemaRegistryClient) -> None:
    """Not asserted (timing belongs in benchmarks/): encode and decode of one order-sized
    record, for the docs."""
    codec = AvroCodec(ORDER_V2, client).bind("speed", False)
    typed = AvroCodec(ORDER_V2, client, record_type=Order).bind("speed", False)
    json_codec = JsonSchemaCodec(
        {"type": "object", "properties": {"id": {"type": "string"}}}, client
    ).bind("speed-j", False)
    value = {"id": "order-1", "amount": 1234, "currency": "EUR"}
    n = 20_000
    for name, c, v in (
        ("avro dict", codec, value),
        ("avro dataclass", typed, Order("order-1", 1234)),
        ("json schema", json_codec, value),
    ):
        data = c.dumps(v)
        start = time.perf_counter()
        for _ in range(n):
            c.dumps(v)
        encode = (time.perf_counter() - start) / n * 1e9
        start = time.perf_counter()
        for _ in range(n):
            c.loads(data)
        decode = (time.perf_counter() - start) / n * 1e9
        print(f"{name}: encode {encode:,.0f} ns/record, decode {decode:,.0f} ns/record")


def test_a_table_remembers_plain_avro_values_but_not_typed_ones(
    client: SchemaRegistryClient,
) -> None:
    """A stream-table join decodes its key's row for every event: plain Avro rows are
    remembered by their bytes (each read gets its own copy); typed records are not."""
    from streamjoin.remembered_values import value_loader

    codec = AvroCodec(ORDER_V2, client).bind("remember", False)
    data = codec.dumps({"id": "o1", "amount": 5, "currency": "EUR"})
    assert data is not None
    loads = value_loader(codec)
    first, second = loads(data), loads(data)
    assert first == second == {"id": "o1", "amount": 5, "currency": "EUR"}
    assert first is not second  # (a caller changing its row leaves the next read alone)
    assert len(loads.__self__) == 1  # type: ignore[attr-defined]
    typed = AvroCodec(ORDER_V2, client, record_type=Order).bind("remember", False)
    assert value_loader(typed) == typed.loads
