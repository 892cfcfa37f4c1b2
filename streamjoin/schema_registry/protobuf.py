"""Protobuf values and keys in the Confluent wire format, with their schemas in a registry.

A record is the magic byte, the schema id, the message-index array (which message of the
``.proto`` file this is), then the Protobuf bytes: what Confluent's serializers write in every
language, so Java and Go producers and consumers share the topic.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError as _ProtobufDecodeError
from google.protobuf.message import Message

from streamjoin.codec_errors import decode_error, encode_error
from streamjoin.errors import ArgumentTypeError, DecodeError
from streamjoin.schema_registry.client import (
    RegisteredSchema,
    SchemaReference,
    SchemaRegistryClient,
)
from streamjoin.schema_registry.protobuf_schema import (
    WELL_KNOWN_PREFIX,
    decode_indexes,
    encode_indexes,
    message_indexes,
    proto_text,
)
from streamjoin.schema_registry.registry_codec import Reader, RegistryCodec, SubjectNameStrategy

__all__ = ["ProtobufCodec"]


class ProtobufCodec(RegistryCodec):
    """``message_class`` (a generated Protobuf class) in the Confluent Protobuf wire format.

    The schema registered is the ``.proto`` text of the class's file, rebuilt from its
    descriptor. Imports other than Google's well-known types (``google/protobuf/*.proto``,
    which registries know built in) are registered first under their file name and referred
    to. Reading asks the registry nothing about the writer's schema beyond its type: the
    bytes are parsed as ``message_class``, so readers with fewer or more fields than the
    writer work as Protobuf always does (unknown fields are kept and written on, missing
    ones read as their defaults). Picklable, class included (Spark ships it to executors).
    """

    schema_type = "PROTOBUF"
    kind = "protobuf"

    def __init__(
        self,
        message_class: type[Message],
        registry: SchemaRegistryClient | str,
        *,
        auto_register: bool = True,
        subject: str | None = None,
        subject_name_strategy: SubjectNameStrategy = "topic",
    ) -> None:
        if not (isinstance(message_class, type) and issubclass(message_class, Message)):
            raise ArgumentTypeError(
                f"ProtobufCodec needs a generated Protobuf message class, got {message_class!r}"
            )
        descriptor = message_class.DESCRIPTOR
        super().__init__(
            proto_text(descriptor.file),
            registry,
            record_name=descriptor.full_name,
            auto_register=auto_register,
            subject=subject,
            subject_name_strategy=subject_name_strategy,
        )
        self.message_class = message_class
        self._full_name = descriptor.full_name
        self._indexes = encode_indexes(message_indexes(descriptor))

    def prepare(self) -> bytes:
        """The record header: magic byte, schema id and this message's index array."""
        if not self.references:
            self.references = self._register_imports(self.message_class.DESCRIPTOR.file)
        header = super().prepare() + self._indexes
        self._header = header
        return header

    def encode_payload(self, obj: Any) -> bytes:
        """``obj``'s Protobuf bytes (the message-index array is in the header)."""
        if type(obj) is self.message_class or (
            isinstance(obj, Message) and obj.DESCRIPTOR.full_name == self._full_name
        ):  # (the same message from another pool, as a shipped codec's class is, passes)
            return obj.SerializeToString()
        raise encode_error(self.name, obj, f"expected a {self._full_name} message")

    def parse_text(self, text: str) -> Any:
        """A key typed as text (the query endpoint's URL key): a JSON object in Protobuf's
        JSON mapping (``{"region": "eu", "user": 1}``) as a message, else the text."""
        try:
            return json_format.Parse(text, self.message_class())
        except json_format.ParseError:
            return text

    def make_reader(self, writer: RegisteredSchema) -> Reader:
        """Parse as ``message_class`` after the index array (the writer's schema is another
        version of the same message: Protobuf matches fields by number)."""
        parse = self.message_class.FromString
        name, target = self.name, self.message_class.__qualname__

        def decode(payload: memoryview) -> Any:
            try:
                _indexes, start = decode_indexes(payload)
                return parse(payload[start:])  # type: ignore[arg-type]
            except (DecodeError, _ProtobufDecodeError) as exc:
                raise decode_error(
                    name, payload, f"schema id {writer.schema_id}: {exc}", target
                ) from exc

        return decode

    def _register_imports(self, file: Any) -> tuple[SchemaReference, ...]:
        """A reference for each import of ``file`` but the well-known types, registered (with
        ``auto_register``) under its file name, its own imports first."""
        references = []
        for dep in file.dependencies:
            if dep.name.startswith(WELL_KNOWN_PREFIX):
                continue
            text, nested = proto_text(dep), self._register_imports(dep)
            if self.auto_register:
                self.registry.register(dep.name, text, "PROTOBUF", nested)
            version = _version_of(self.registry, dep.name, text, nested)
            references.append(SchemaReference(dep.name, dep.name, version))
        return tuple(references)

    # -- identity, pickling -------------------------------------------------------------------

    def _options(self) -> tuple[object, ...]:
        # the references follow from the class's file and are filled in at the first write:
        # left out, so equality and hash do not change then
        options = tuple(o for o in super()._options() if o is not self.references)
        return (*options, self._full_name)

    def __copy__(self) -> ProtobufCodec:
        """A copy sharing the class (:meth:`bind` copies; pickling ships the class)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        # the class travels as its descriptors: classes built at run time (and _pb2 modules
        # the executor never imported) have no importable name
        state["message_class"] = _ShippedClass.of(self.message_class)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["message_class"] = state["message_class"].rebuild()
        self.__dict__.update(state)


class _ShippedClass:
    """A message class as its full name and its file's descriptors (imports first)."""

    def __init__(self, full_name: str, files: list[bytes]) -> None:
        self.full_name = full_name
        self.files = files

    @classmethod
    def of(cls, message_class: type[Message]) -> _ShippedClass:
        files: list[bytes] = []
        seen: set[str] = set()

        def add(file: Any) -> None:
            if file.name in seen:
                return
            seen.add(file.name)
            for dep in file.dependencies:
                add(dep)
            files.append(file.serialized_pb)

        add(message_class.DESCRIPTOR.file)
        return cls(message_class.DESCRIPTOR.full_name, files)

    def rebuild(self) -> type[Message]:
        try:  # the generated module was imported here: the same class
            found = descriptor_pool.Default().FindMessageTypeByName(self.full_name)
        except KeyError:
            pool = descriptor_pool.DescriptorPool()
            for serialized in self.files:
                pool.AddSerializedFile(serialized)
            found = pool.FindMessageTypeByName(self.full_name)
        return message_factory.GetMessageClass(found)


def _version_of(
    registry: SchemaRegistryClient,
    subject: str,
    schema: str,
    references: Sequence[SchemaReference],
) -> int:
    """The version of ``subject`` that holds ``schema`` (a reference names a version)."""
    body = registry._schema_body(schema, "PROTOBUF", references)
    reply = registry._call(
        "POST", f"/subjects/{urllib.parse.quote(subject, safe='')}", body, f"subject {subject!r}"
    )
    return int(reply["version"])
