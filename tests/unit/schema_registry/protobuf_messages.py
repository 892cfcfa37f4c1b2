"""Protobuf message classes for the codec's tests, built at run time from descriptors (the
machines have no ``protoc``): every scalar type, an enum, a nested message, repeated, map,
oneof and a well-known type, in a v1 and a v2 (one more field) of the same file."""

from __future__ import annotations

import itertools
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

_F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    "f_double": _F.TYPE_DOUBLE,
    "f_float": _F.TYPE_FLOAT,
    "f_int32": _F.TYPE_INT32,
    "f_int64": _F.TYPE_INT64,
    "f_uint32": _F.TYPE_UINT32,
    "f_uint64": _F.TYPE_UINT64,
    "f_sint32": _F.TYPE_SINT32,
    "f_sint64": _F.TYPE_SINT64,
    "f_fixed32": _F.TYPE_FIXED32,
    "f_fixed64": _F.TYPE_FIXED64,
    "f_sfixed32": _F.TYPE_SFIXED32,
    "f_sfixed64": _F.TYPE_SFIXED64,
    "f_bool": _F.TYPE_BOOL,
    "f_string": _F.TYPE_STRING,
    "f_bytes": _F.TYPE_BYTES,
}
_files = itertools.count()


def _field(
    msg: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    kind: int,
    type_name: str = "",
    label: int = _F.LABEL_OPTIONAL,
    oneof: int | None = None,
) -> None:
    f = msg.field.add(name=name, number=number, type=kind, label=label)
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof


def build(
    *, package: str | None = None, with_note: bool = False, retyped: bool = False
) -> dict[str, Any]:
    """Classes ``Order`` (the all-types message, first in its file), ``Item`` and
    ``Order.Line`` from a new file in a new pool; ``with_note`` adds ``string note = 40`` to
    ``Order`` (the v2 of the schema); ``retyped`` makes ``f_string`` a ``Line`` message (an
    incompatible change). Same ``package`` gives same full names."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    package = package or f"sjtest{next(_files)}"
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{package}/orders.proto", package=package, syntax="proto3"
    )
    file.dependency.append("google/protobuf/timestamp.proto")
    status = file.enum_type.add(name="Status")
    for number, name in enumerate(["STATUS_UNKNOWN", "STATUS_OPEN", "STATUS_SHIPPED"]):
        status.value.add(name=name, number=number)

    order = file.message_type.add(name="Order")
    for number, (name, kind) in enumerate(SCALARS.items(), start=1):
        if retyped and name == "f_string":
            _field(order, name, number, _F.TYPE_MESSAGE, f".{package}.Order.Line")
        else:
            _field(order, name, number, kind)
    line = order.nested_type.add(name="Line")
    _field(line, "sku", 1, _F.TYPE_STRING)
    _field(line, "qty", 2, _F.TYPE_INT32)
    entry = order.nested_type.add(name="LabelsEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_INT64)
    order.oneof_decl.add(name="payment")
    _field(order, "status", 20, _F.TYPE_ENUM, f".{package}.Status")
    _field(order, "first_line", 21, _F.TYPE_MESSAGE, f".{package}.Order.Line")
    _field(order, "lines", 22, _F.TYPE_MESSAGE, f".{package}.Order.Line", _F.LABEL_REPEATED)
    _field(order, "tags", 23, _F.TYPE_STRING, label=_F.LABEL_REPEATED)
    _field(order, "scores", 24, _F.TYPE_SINT64, label=_F.LABEL_REPEATED)
    _field(order, "labels", 25, _F.TYPE_MESSAGE, f".{package}.Order.LabelsEntry", _F.LABEL_REPEATED)
    _field(order, "card", 26, _F.TYPE_STRING, oneof=0)
    _field(order, "voucher", 27, _F.TYPE_INT64, oneof=0)
    _field(order, "placed_at", 28, _F.TYPE_MESSAGE, ".google.protobuf.Timestamp")
    if with_note:
        _field(order, "note", 40, _F.TYPE_STRING)

    item = file.message_type.add(name="Item")
    _field(item, "sku", 1, _F.TYPE_STRING)
    _field(item, "price", 2, _F.TYPE_DOUBLE)

    pool.Add(file)
    classes: dict[str, Any] = {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in ("Order", "Order.Line", "Item")
    }
    classes["package"] = package
    return classes


def full_order(classes: dict[str, Any]) -> Any:
    """An ``Order`` with every field set to a value away from its default and its limits."""
    order = classes["Order"](
        f_double=-1.5e300,
        f_float=0.25,
        f_int32=-(2**31),
        f_int64=-(2**63),
        f_uint32=2**32 - 1,
        f_uint64=2**64 - 1,
        f_sint32=-123456,
        f_sint64=-(2**62),
        f_fixed32=4000000000,
        f_fixed64=2**63 + 5,
        f_sfixed32=-7,
        f_sfixed64=-(2**40),
        f_bool=True,
        f_string="grüße \u2603",
        f_bytes=b"\x00\xff\x00",
        status=2,
        tags=["a", "b"],
        scores=[-1, 0, 1],
        voucher=42,
    )
    order.first_line.sku = "s1"
    order.first_line.qty = 3
    order.lines.add(sku="s2", qty=1)
    order.lines.add(sku="s3", qty=-2)
    order.labels["x"] = 1
    order.labels["y"] = -(2**50)
    order.placed_at.seconds = 1_700_000_000
    order.placed_at.nanos = 123
    return order
