"""Protobuf schemas as a registry holds them (pure): ``.proto`` text rebuilt from a compiled
file descriptor, and the message-index path of the Confluent Protobuf wire format.

A Python Protobuf class keeps its file's descriptor, not its source, so the codec writes the
``.proto`` text back from the descriptor: the registry stores and compares text, and other
languages' readers compile it. Options (``java_package``, ``deprecated``...) are not
written: they change no byte on the wire.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FileDescriptor

from streamjoin.errors import ConfigurationError, DecodeError

__all__ = [
    "WELL_KNOWN_PREFIX",
    "decode_indexes",
    "encode_indexes",
    "message_indexes",
    "proto_text",
]

#: imports the registry knows without a reference (Confluent's and Apicurio's built-ins)
WELL_KNOWN_PREFIX = "google/protobuf/"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    _F.TYPE_DOUBLE: "double",
    _F.TYPE_FLOAT: "float",
    _F.TYPE_INT64: "int64",
    _F.TYPE_UINT64: "uint64",
    _F.TYPE_INT32: "int32",
    _F.TYPE_FIXED64: "fixed64",
    _F.TYPE_FIXED32: "fixed32",
    _F.TYPE_BOOL: "bool",
    _F.TYPE_STRING: "string",
    _F.TYPE_BYTES: "bytes",
    _F.TYPE_UINT32: "uint32",
    _F.TYPE_SFIXED32: "sfixed32",
    _F.TYPE_SFIXED64: "sfixed64",
    _F.TYPE_SINT32: "sint32",
    _F.TYPE_SINT64: "sint64",
}
_MAX_RANGE_END = 536870912  # field numbers end at 2^29 - 1; ranges store end + 1


def proto_text(file: FileDescriptor | Any) -> str:
    """The ``.proto`` source of ``file``, as the registry is given it."""
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    syntax = proto.syntax or "proto2"
    if syntax not in ("proto2", "proto3"):
        raise ConfigurationError(
            f"{file.name}: Protobuf {syntax!r} files cannot be registered (the registries "
            "parse proto2 and proto3 source only)"
        )
    lines = [f'syntax = "{syntax}";']
    if proto.package:
        lines.append(f"package {proto.package};")
    lines += [f'import "{dep}";' for dep in proto.dependency]
    for enum in proto.enum_type:
        lines += _enum(enum, "")
    for message in proto.message_type:
        lines += _message(message, "", syntax)
    return "\n".join(lines) + "\n"


def message_indexes(message: Descriptor | Any) -> list[int]:
    """The path from the file to ``message``: its index among the file's top-level
    messages, then among each enclosing message's nested ones."""
    path: list[int] = []
    current: Descriptor | Any = message
    while current is not None:
        parent = current.containing_type
        names = (
            [d.name for d in parent.nested_types]
            if parent is not None
            else list(current.file.message_types_by_name)  # in the file's order
        )
        path.append(names.index(current.name))
        current = parent
    return path[::-1]


def _zigzag_varint(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_indexes(indexes: Sequence[int]) -> bytes:
    """The message-index array: its length, then each index, as zig-zag varints; ``[0]`` (the
    file's first message, the common case) is the single byte ``0``."""
    if list(indexes) == [0]:
        return b"\x00"
    return _zigzag_varint(len(indexes)) + b"".join(_zigzag_varint(i) for i in indexes)


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError(
                "record is not in the Confluent Protobuf wire format: the message-index "
                "array after the schema id is cut short or malformed"
            )
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def decode_indexes(data: memoryview) -> tuple[list[int], int]:
    """The message-index array at the start of ``data`` and the offset of the payload after
    it; :class:`DecodeError` when it is malformed."""
    count, pos = _read_varint(data, 0)
    if count == 0:
        return [0], pos
    if count < 0 or count > len(data):
        raise DecodeError(
            f"record is not in the Confluent Protobuf wire format: a message-index array of "
            f"{count} entries"
        )
    indexes = []
    for _ in range(count):
        index, pos = _read_varint(data, pos)
        indexes.append(index)
    return indexes, pos


# -- rendering ------------------------------------------------------------------------------


def _enum(enum: descriptor_pb2.EnumDescriptorProto, indent: str) -> list[str]:
    lines = [f"{indent}enum {enum.name} {{"]
    if enum.options.allow_alias:
        lines.append(f"{indent}  option allow_alias = true;")
    lines += [f"{indent}  {v.name} = {v.number};" for v in enum.value]
    lines += _reserved(enum.reserved_range, enum.reserved_name, indent + "  ", inclusive=True)
    lines.append(f"{indent}}}")
    return lines


def _reserved(
    ranges: Sequence[object], names: Sequence[str], indent: str, *, inclusive: bool
) -> list[str]:
    parts = []
    for r in ranges:
        start, end = r.start, r.end  # type: ignore[attr-defined]
        last = end if inclusive else end - 1
        if not inclusive and end >= _MAX_RANGE_END:
            parts.append(f"{start} to max")
        else:
            parts.append(str(start) if start == last else f"{start} to {last}")
    lines = [f"{indent}reserved {', '.join(parts)};"] if parts else []
    if names:
        quoted = ", ".join('"' + n + '"' for n in names)
        lines.append(f"{indent}reserved {quoted};")
    return lines


def _type_name(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type in (_F.TYPE_MESSAGE, _F.TYPE_ENUM, _F.TYPE_GROUP):
        return field.type_name  # fully qualified (".pkg.Msg"): valid wherever it is written
    return _SCALARS[field.type]


def _field(
    field: descriptor_pb2.FieldDescriptorProto,
    maps: dict[str, descriptor_pb2.DescriptorProto],
    syntax: str,
    indent: str,
    in_oneof: bool,
) -> str:
    if field.type == _F.TYPE_GROUP:
        raise ConfigurationError(
            f"field {field.name!r}: proto2 groups cannot be registered; use a nested message"
        )
    entry = maps.get(field.type_name) if field.type == _F.TYPE_MESSAGE else None
    if entry is not None:
        key, value = entry.field[0], entry.field[1]
        return f"{indent}map<{_type_name(key)}, {_type_name(value)}> {field.name} = {field.number};"
    if in_oneof:
        label = ""
    elif field.label == _F.LABEL_REPEATED:
        label = "repeated "
    elif field.label == _F.LABEL_REQUIRED:
        label = "required "
    elif syntax == "proto2" or field.proto3_optional:
        label = "optional "
    else:
        label = ""
    options = []
    if field.HasField("default_value"):
        default = field.default_value
        if field.type == _F.TYPE_STRING:
            default = '"' + default.replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif field.type == _F.TYPE_BYTES:
            default = f'"{default}"'  # already C-escaped by protoc
        options.append(f"default = {default}")
    if syntax == "proto2" and field.options.HasField("packed"):
        options.append(f"packed = {'true' if field.options.packed else 'false'}")
    suffix = f" [{', '.join(options)}]" if options else ""
    return f"{indent}{label}{_type_name(field)} {field.name} = {field.number}{suffix};"


def _message(message: descriptor_pb2.DescriptorProto, indent: str, syntax: str) -> list[str]:
    inner = indent + "  "
    # map entries are referred to by full name (".pkg.Outer.FooEntry"): match its tail
    by_suffix = {
        f".{message.name}.{nested.name}": nested
        for nested in message.nested_type
        if nested.options.map_entry
    }
    lines = [f"{indent}message {message.name} {{"]
    for nested in message.nested_type:
        if not nested.options.map_entry:
            lines += _message(nested, inner, syntax)
    for enum in message.enum_type:
        lines += _enum(enum, inner)
    real_oneofs = {
        f.oneof_index for f in message.field if f.HasField("oneof_index") and not f.proto3_optional
    }
    entries = {
        f.type_name: entry
        for f in message.field
        if (entry := _map_entry(f.type_name, by_suffix)) is not None
    }
    written_oneofs: set[int] = set()
    for field in message.field:
        index = field.oneof_index if field.HasField("oneof_index") else None
        if index is not None and index in real_oneofs:
            if index in written_oneofs:
                continue
            written_oneofs.add(index)
            lines.append(f"{inner}oneof {message.oneof_decl[index].name} {{")
            lines += [
                _field(f, entries, syntax, inner + "  ", True)
                for f in message.field
                if f.HasField("oneof_index") and f.oneof_index == index
            ]
            lines.append(f"{inner}}}")
        else:
            lines.append(_field(field, entries, syntax, inner, False))
    lines += _reserved(message.reserved_range, message.reserved_name, inner, inclusive=False)
    lines.append(f"{indent}}}")
    return lines


def _map_entry(
    type_name: str, by_suffix: dict[str, descriptor_pb2.DescriptorProto]
) -> descriptor_pb2.DescriptorProto | None:
    for suffix, entry in by_suffix.items():
        if type_name.endswith(suffix):
            return entry
    return None
