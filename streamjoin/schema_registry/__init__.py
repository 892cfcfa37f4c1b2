"""Codecs whose schemas live in a schema registry, in the Confluent wire format.

``AvroCodec`` (fastavro) and ``JsonSchemaCodec`` (jsonschema) need the ``registry`` extra
(``pip install 'streamjoin[registry]'``); docs/codecs.md ("Schema registry") shows them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamjoin.schema_registry.avro import AvroCodec
from streamjoin.schema_registry.client import (
    RegisteredSchema,
    SchemaReference,
    SchemaRegistryClient,
)
from streamjoin.schema_registry.json_schema import JsonSchemaCodec
from streamjoin.schema_registry.registry_codec import RegistryCodec, subject_name

if TYPE_CHECKING:
    from streamjoin.schema_registry.protobuf import ProtobufCodec

__all__ = [
    "AvroCodec",
    "JsonSchemaCodec",
    "ProtobufCodec",
    "RegisteredSchema",
    "RegistryCodec",
    "SchemaReference",
    "SchemaRegistryClient",
    "subject_name",
]


def __getattr__(name: str) -> object:
    """``ProtobufCodec`` on first use: it needs the ``protobuf`` package (registry extra)."""
    if name == "ProtobufCodec":
        from streamjoin.schema_registry.protobuf import ProtobufCodec

        return ProtobufCodec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
