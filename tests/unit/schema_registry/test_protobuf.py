"""The Protobuf codec: wire format, every field kind, evolution, registration, errors. The real
registry and broker: tests/integration/test_registry_protobuf.py."""

from __future__ import annotations

import pickle
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamjoin.errors import (
    ArgumentTypeError,
    ConfigurationError,
    DecodeError,
    EncodeError,
    SchemaNotFound,
)
from streamjoin.schema_registry.client import SchemaReference, SchemaRegistryClient
from streamjoin.schema_registry.protobuf import ProtobufCodec
from streamjoin.schema_registry.protobuf_schema import (
    decode_indexes,
    encode_indexes,
    message_indexes,
    proto_text,
)
from tests.unit.schema_registry.fake_registry import fake_registry
from tests.unit.schema_registry.protobuf_messages import build, full_order

V1 = build(package="pbtest.v")
V2 = build(package="pbtest.v", with_note=True)


def test_every_field_kind_round_trips() -> None:
    with fake_registry() as reg:
        codec = ProtobufCodec(V1["Order"], reg.url, subject="orders-value")
        order = full_order(V1)
        data = codec.dumps(order)
        assert data is not None
        back = codec.loads(data)
        assert back == order
        assert back.WhichOneof("payment") == "voucher"
        assert back.labels["y"] == -(2**50)
        assert (back.placed_at.seconds, back.placed_at.nanos) == (1_700_000_000, 123)
        assert back.f_uint64 == 2**64 - 1 and back.f_int64 == -(2**63)
        assert back.f_bytes == b"\x00\xff\x00" and back.f_string == "grüße \u2603"


def test_wire_format_is_magic_id_indexes_payload() -> None:
    with fake_registry() as reg:
        first = ProtobufCodec(V1["Order"], reg.url, subject="o-value")
        item = ProtobufCodec(V1["Item"], reg.url, subject="i-value")
        line = ProtobufCodec(V1["Order.Line"], reg.url, subject="l-value")
        data = first.dumps(V1["Order"](f_int32=1))
        assert data is not None
        magic, schema_id = struct.unpack(">bI", data[:5])
        assert (magic, schema_id) == (0, 1)
        assert data[5:6] == b"\x00"  # the [0] shortcut
        assert data[6:] == V1["Order"](f_int32=1).SerializeToString()
        item_data = item.dumps(V1["Item"](sku="a"))
        line_data = line.dumps(V1["Order.Line"](sku="b"))
        assert item_data is not None and line_data is not None
        assert item_data[5:7] == b"\x02\x02"  # one index: 1
        assert line_data[5:8] == b"\x04\x00\x00"  # two indexes: 0, 0
        assert item.loads(item_data).sku == "a" and line.loads(line_data).sku == "b"


def test_registers_the_proto_text_once_with_its_type() -> None:
    with fake_registry() as reg:
        codec = ProtobufCodec(V1["Order"], reg.url, subject="orders-value")
        for n in range(3):
            codec.dumps(V1["Order"](f_int32=n))
        posts = [r for r in reg.requests if r[0] == "POST"]
        assert posts == [("POST", "/subjects/orders-value/versions")]
        assert reg.schemas == [("PROTOBUF", proto_text(V1["Order"].DESCRIPTOR.file))]


def test_adding_a_field_old_and_new_readers_both_work() -> None:
    with fake_registry() as reg:
        old = ProtobufCodec(V1["Order"], reg.url, subject="orders-value")
        new = ProtobufCodec(V2["Order"], reg.url, subject="orders-value")
        written_new = new.dumps(V2["Order"](f_string="n", note="hello"))
        written_old = old.dumps(V1["Order"](f_string="o"))
        assert written_new is not None and written_old is not None
        read_by_old = old.loads(written_new)
        assert read_by_old.f_string == "n"
        assert new.loads(written_new).note == "hello"
        assert new.loads(written_old).note == ""  # the default
        # the old reader keeps the field it does not know: forwarding it loses nothing
        assert new.loads(old.dumps(read_by_old)).note == "hello"
        assert len(reg.subjects["orders-value"]) == 2  # two versions of one subject


def test_without_auto_register_an_unknown_schema_is_an_error() -> None:
    with fake_registry() as reg:
        codec = ProtobufCodec(V1["Order"], reg.url, subject="orders-value", auto_register=False)
        with pytest.raises(SchemaNotFound, match="orders-value"):
            codec.dumps(V1["Order"]())
        ProtobufCodec(V1["Order"], reg.url, subject="orders-value").dumps(V1["Order"]())
        assert codec.dumps(V1["Order"](f_int32=5)) is not None


def test_bind_names_the_subject_by_topic() -> None:
    client = SchemaRegistryClient("http://127.0.0.1:1")
    codec = ProtobufCodec(V1["Order"], client)
    assert codec.bind("orders", False).subject == "orders-value"
    bound_class = getattr(codec.bind("orders", False), "message_class", None)
    assert bound_class is not None and bound_class.DESCRIPTOR is V1["Order"].DESCRIPTOR
    assert codec.bind("orders", True).subject == "orders-key"
    named = ProtobufCodec(V1["Order"], client, subject="shared")
    assert named.bind("orders", False).subject == "shared"
    by_record = ProtobufCodec(V1["Item"], client, subject_name_strategy="record")
    assert by_record.bind("orders", False).subject == "pbtest.v.Item"
    with pytest.raises(ConfigurationError, match="give subject="):
        codec.dumps(V1["Order"]())


def test_bad_input_is_a_clear_error() -> None:
    with fake_registry() as reg:
        codec = ProtobufCodec(V1["Order"], reg.url, subject="s")
        with pytest.raises(EncodeError, match=r"expected a pbtest\.v\.Order message"):
            codec.dumps(V1["Item"]())
        assert codec.dumps(None) is None
        with pytest.raises(DecodeError, match="Confluent wire format"):
            codec.loads(b'{"json": 1}')
        with pytest.raises(DecodeError, match="message-index"):
            codec.loads(b"\x00\x00\x00\x00\x01\x80")
        with pytest.raises(DecodeError, match="schema id 1"):
            codec.loads(b"\x00\x00\x00\x00\x01\x00\xff\xff\xff")
        with pytest.raises(DecodeError, match="schema id 7 is not in the registry"):
            codec.loads(b"\x00\x00\x00\x00\x07\x00")
    with pytest.raises(ArgumentTypeError, match="generated Protobuf message class"):
        ProtobufCodec(dict, reg.url)  # type: ignore[arg-type]


def test_pickled_codec_looks_its_id_up_again() -> None:
    with fake_registry() as reg:
        codec = ProtobufCodec(V1["Order"], reg.url, subject="orders-value")
        codec.dumps(V1["Order"]())
        assert codec._header is not None
        copy = pickle.loads(pickle.dumps(codec))
        assert copy._header is None and copy.registry._ids == {}
        assert copy == codec and hash(copy) == hash(codec)
        assert copy.message_class.DESCRIPTOR.full_name == "pbtest.v.Order"
        data = copy.dumps(V1["Order"](f_int32=9))  # the class of the sender's pool
        assert data is not None and codec.loads(data).f_int32 == 9
        assert copy.loads(data) == copy.message_class(f_int32=9)
        assert len([r for r in reg.requests if r[0] == "POST"]) == 2


def test_message_indexes_follow_nesting() -> None:
    assert message_indexes(V1["Order"].DESCRIPTOR) == [0]
    assert message_indexes(V1["Item"].DESCRIPTOR) == [1]
    assert message_indexes(V1["Order.Line"].DESCRIPTOR) == [0, 0]


@given(st.lists(st.integers(min_value=0, max_value=2**31), min_size=1, max_size=6))
def test_index_arrays_round_trip(indexes: list[int]) -> None:
    encoded = encode_indexes(indexes)
    assert decode_indexes(memoryview(encoded + b"tail")) == (indexes, len(encoded))


def test_proto_text_writes_every_construct() -> None:
    text = proto_text(V2["Order"].DESCRIPTOR.file)
    for line in (
        'syntax = "proto3";',
        "package pbtest.v;",
        'import "google/protobuf/timestamp.proto";',
        "  STATUS_SHIPPED = 2;",
        "  message Line {",
        "  sint64 f_sint64 = 8;",
        "  map<string, int64> labels = 25;",
        "  oneof payment {",
        "    int64 voucher = 27;",
        "  repeated .pbtest.v.Order.Line lines = 22;",
        "  .google.protobuf.Timestamp placed_at = 28;",
        "  string note = 40;",
    ):
        assert line in text.splitlines(), line
    assert "LabelsEntry" not in text


def test_imports_are_registered_first_and_referred_to() -> None:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    common = descriptor_pb2.FileDescriptorProto(name="shop/money.proto", package="shop")
    money = common.message_type.add(name="Money")
    money.field.add(name="cents", number=1, type=3, label=1)  # int64
    pool.Add(common)
    main = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop")
    main.syntax = "proto3"
    main.dependency.append("shop/money.proto")
    order = main.message_type.add(name="Order")
    order.field.add(name="total", number=1, type=11, label=1, type_name=".shop.Money")
    pool.Add(main)
    order_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    with fake_registry() as reg:
        codec = ProtobufCodec(order_class, reg.url, subject="orders-value")
        data = codec.dumps(order_class(total={"cents": 250}))
        assert data is not None and codec.loads(data).total.cents == 250
        assert list(reg.subjects) == ["shop%2Fmoney.proto", "orders-value"]  # (URL-quoted)
        assert codec.references == (SchemaReference("shop/money.proto", "shop/money.proto", 1),)
        assert 'syntax = "proto2";' in reg.schemas[0][1]
        assert "  optional int64 cents = 1;" in reg.schemas[0][1]


def test_query_endpoint_keys_and_values_as_json() -> None:
    from streamjoin.query.routing import jsonable

    codec = ProtobufCodec(V1["Item"], SchemaRegistryClient("http://127.0.0.1:1"))
    assert codec.parse_text('{"sku": "a", "price": 2.5}') == V1["Item"](sku="a", price=2.5)
    assert codec.parse_text("plain") == "plain"
    assert codec.parse_text('{"nope": 1}') == '{"nope": 1}'
    order = full_order(V1)
    as_json = jsonable(order)
    assert as_json["f_int32"] == -(2**31) and as_json["f_uint64"] == str(2**64 - 1)
    assert as_json["first_line"] == {"sku": "s1", "qty": 3}
    assert as_json["labels"] == {"x": "1", "y": str(-(2**50))}  # 64-bit ints: strings
    assert as_json["placed_at"] == "2023-11-14T22:13:20.000000123Z"
    assert as_json["status"] == "STATUS_SHIPPED"


def test_proto_text_of_proto3_optional_nested_enums_and_reserved() -> None:
    from google.protobuf import descriptor_pb2, descriptor_pool

    file = descriptor_pb2.FileDescriptorProto(name="t/opt.proto", package="t", syntax="proto3")
    msg = file.message_type.add(name="M")
    msg.oneof_decl.add(name="_maybe")
    msg.field.add(name="maybe", number=1, type=5, label=1, oneof_index=0, proto3_optional=True)
    kind = msg.enum_type.add(name="Kind")
    kind.value.add(name="KIND_A", number=0)
    msg.field.add(name="kind", number=2, type=14, label=1, type_name=".t.M.Kind")
    msg.reserved_range.add(start=5, end=6)
    msg.reserved_range.add(start=10, end=13)
    msg.reserved_name.append("old")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    text = proto_text(pool.FindFileByName("t/opt.proto"))
    assert text.splitlines()[2:] == [
        "message M {",
        "  enum Kind {",
        "    KIND_A = 0;",
        "  }",
        "  optional int32 maybe = 1;",
        "  .t.M.Kind kind = 2;",
        "  reserved 5, 10 to 12;",
        '  reserved "old";',
        "}",
    ]
