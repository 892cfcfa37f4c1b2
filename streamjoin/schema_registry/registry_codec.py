"""What every schema-registry codec shares: subjects, the writer's schema id, framing, and
a reader per writer schema id (the Avro, JSON Schema and Protobuf codecs build on it).

A codec learns its topic and role when a declaration binds it (``app.topic``,
``app.table`` for its changelog): :meth:`RegistryCodec.bind` returns a copy for that
subject, so one codec object can serve several topics. The writer id is resolved at the
first encode (registered, or looked up with ``auto_register=False``) and kept; a reader
is built once per writer id met, so the registry is asked once per id per process.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import json
import struct
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, TypeAlias

from streamjoin.codec_errors import Bytes, decode_error
from streamjoin.errors import (
    ArgumentTypeError,
    ConfigurationError,
    DecodeError,
    EncodeError,
    SchemaNotFound,
    SchemaRegistryError,
)
from streamjoin.record_codecs import is_struct_type
from streamjoin.schema_registry.client import (
    RegisteredSchema,
    SchemaReference,
    SchemaRegistryClient,
)
from streamjoin.schema_registry.wire import HEADER_SIZE, MAGIC, frame, header_of, unframe

__all__ = [
    "SUBJECT_NAME_STRATEGIES",
    "Reader",
    "RegistryCodec",
    "SubjectNameStrategy",
    "check_record_type",
    "subject_name",
]

#: turns a framed record's payload into the object
Reader: TypeAlias = Callable[[memoryview], Any]
SubjectNameStrategy: TypeAlias = Literal["topic", "record", "topic_record"]
#: Confluent's TopicNameStrategy, RecordNameStrategy and TopicRecordNameStrategy
SUBJECT_NAME_STRATEGIES: tuple[SubjectNameStrategy, ...] = ("topic", "record", "topic_record")


def subject_name(
    strategy: SubjectNameStrategy, topic: str | None, is_key: bool, record_name: str | None
) -> str:
    """The subject a schema is registered under: ``<topic>-key``/``<topic>-value``
    (``"topic"``), the record's full name (``"record"``) or ``<topic>-<record name>``
    (``"topic_record"``)."""
    if strategy != "topic" and not record_name:
        raise ConfigurationError(
            f"subject_name_strategy={strategy!r} needs a named record schema (an Avro record, "
            "a JSON Schema with a title, a Protobuf message); this schema has no name"
        )
    if strategy == "record":
        assert record_name is not None
        return record_name
    if topic is None:
        raise ConfigurationError(
            f"subject_name_strategy={strategy!r} names the subject after the topic, and this "
            "codec is used outside a topic declaration: give subject= explicitly"
        )
    if strategy == "topic":
        return f"{topic}-{'key' if is_key else 'value'}"
    return f"{topic}-{record_name}"


def resolve_registry(registry: SchemaRegistryClient | str) -> SchemaRegistryClient:
    """A client for ``registry`` (a client, kept, or a URL)."""
    if isinstance(registry, SchemaRegistryClient):
        return registry
    if isinstance(registry, str):
        return SchemaRegistryClient(registry)
    raise ArgumentTypeError(
        f"registry must be a SchemaRegistryClient or its URL, got {type(registry).__qualname__}"
    )


def check_record_type(record_type: type | None) -> type | None:
    """``record_type`` if it is None, a dataclass or a ``msgspec.Struct`` type."""
    if record_type is not None and not (
        isinstance(record_type, type)
        and (dataclasses.is_dataclass(record_type) or is_struct_type(record_type))
    ):
        raise ArgumentTypeError(
            f"record_type must be a dataclass or a msgspec.Struct type, got {record_type!r}"
        )
    return record_type


class RegistryCodec(abc.ABC):
    """A codec framing its payloads in the Confluent wire format.

    Subclasses give the schema (:attr:`schema_text`, :attr:`record_name`), the payload
    encoder (:meth:`encode_payload`, raising :class:`EncodeError` naming the field) and a
    reader per writer schema (:meth:`make_reader`, whose reader raises
    :class:`DecodeError`).
    """

    #: "AVRO", "PROTOBUF" or "JSON"
    schema_type: ClassVar[str]
    #: e.g. "avro": the codec's name is ``<kind>[<subject>]`` once bound
    kind: ClassVar[str]

    def __init__(
        self,
        schema_text: str,
        registry: SchemaRegistryClient | str,
        *,
        record_name: str | None,
        auto_register: bool = True,
        use_latest_version: bool = False,
        subject: str | None = None,
        subject_name_strategy: SubjectNameStrategy = "topic",
        references: Sequence[SchemaReference] = (),
    ) -> None:
        if subject_name_strategy not in SUBJECT_NAME_STRATEGIES:
            raise ConfigurationError(
                f"subject_name_strategy must be one of {', '.join(SUBJECT_NAME_STRATEGIES)}, "
                f"got {subject_name_strategy!r}"
            )
        if subject is not None and (not isinstance(subject, str) or not subject):
            raise ConfigurationError(f"subject must be a non-empty str, got {subject!r}")
        self.registry = resolve_registry(registry)
        self.schema_text = schema_text
        self.record_name = record_name
        self.auto_register = bool(auto_register)
        self.use_latest_version = bool(use_latest_version)
        self.subject_name_strategy: SubjectNameStrategy = subject_name_strategy
        self.references = tuple(references)
        self._subject = subject
        self.topic: str | None = None
        self.is_key = False
        self.name = f"{self.kind}[{subject or record_name or 'unbound'}]"
        self._reset()

    def _reset(self) -> None:
        """Forget what was learned from the registry (after a copy or unpickling)."""
        self._header: bytes | None = None  # the writer id's 5 header bytes, once known
        self._readers: dict[int, Reader] = {}

    # -- binding to a topic -----------------------------------------------------------------

    def bind(self, topic: str, is_key: bool) -> RegistryCodec:
        """A copy of this codec writing and reading ``topic``'s keys (``is_key``) or values:
        the subject follows from them (unless ``subject=`` was given)."""
        bound = copy.copy(self)
        bound.topic, bound.is_key = topic, is_key
        bound.name = f"{self.kind}[{bound.subject}]"
        bound._reset()
        return bound

    @property
    def subject(self) -> str:
        """The subject the writer schema is registered (or looked up) under."""
        if self._subject is not None:
            return self._subject
        return subject_name(self.subject_name_strategy, self.topic, self.is_key, self.record_name)

    # -- the codec ----------------------------------------------------------------------------

    def dumps(self, obj: Any) -> bytes | None:
        """Frame the payload of ``obj`` behind the writer schema's id; ``None`` stays null."""
        if obj is None:
            return None
        header = self._header
        if header is None:
            header = self.prepare()
        return header + self.encode_payload(obj)

    def loads(self, data: Bytes | None) -> Any:
        """Decode a framed record with the schema its id names (read as this codec's
        schema says); a record of an id the registry does not know is a DecodeError."""
        if data is None:
            return None
        try:
            magic, schema_id = header_of(data)
        except struct.error:
            magic = None
        if magic == MAGIC:  # (the common case: one unpack, one lookup)
            reader = self._readers.get(schema_id)
            if reader is not None:
                return reader(memoryview(data)[HEADER_SIZE:])
        try:
            schema_id, payload = unframe(data)
        except DecodeError as exc:
            raise DecodeError(f"{self.name} codec: {exc}") from exc
        reader = self._readers.get(schema_id)
        if reader is None:
            reader = self._reader_for(schema_id, data)
        return reader(payload)

    def parse_text(self, text: str) -> Any:
        """A key or value typed as text (the query endpoint's URL key): JSON (``{"id": 1}``,
        ``42``), else the text itself as a string; ``dumps`` then checks it fits the schema."""
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if isinstance(value, str):
            return value
        try:
            self.encode_payload(value)
        except EncodeError:
            return text  # "42" as a key of a string schema
        return value

    def prepare(self) -> bytes:
        """Resolve the writer schema's id now (else at the first encode): registered with
        ``auto_register``, looked up otherwise, the subject's latest with
        ``use_latest_version``. Returns the record header."""
        subject = self.subject
        if self.use_latest_version:
            latest = self.registry.latest(subject)
            self._check_type(latest, subject)
            self.use_writer_schema(latest)
            schema_id = latest.schema_id
        elif self.auto_register:
            schema_id = self.registry.register(
                subject, self.schema_text, self.schema_type, self.references
            )
        else:
            try:
                schema_id = self.registry.id_for(
                    subject, self.schema_text, self.schema_type, self.references
                )
            except SchemaNotFound as exc:
                raise SchemaNotFound(
                    f"{self.name}: the schema is not registered under subject {subject!r} "
                    f"and auto_register=False: register it first (or set auto_register=True); "
                    f"{exc}",
                    status=exc.status,
                    code=exc.code,
                ) from exc
        header = frame(schema_id, b"")
        self._header = header
        return header

    @property
    def writer_id(self) -> int | None:
        """The schema id records are written with, once known."""
        return None if self._header is None else int.from_bytes(self._header[1:HEADER_SIZE], "big")

    def _reader_for(self, schema_id: int, data: Bytes) -> Reader:
        try:
            writer = self.registry.schema_of(schema_id)
        except SchemaNotFound as exc:
            raise decode_error(
                self.name, data, f"schema id {schema_id} is not in the registry ({exc})"
            ) from exc
        if writer.schema_type != self.schema_type:
            raise decode_error(
                self.name,
                data,
                f"schema id {schema_id} is a {writer.schema_type} schema, not {self.schema_type}",
            )
        reader = self.make_reader(writer)
        self._readers[schema_id] = reader
        return reader

    def _check_type(self, found: RegisteredSchema, subject: str) -> None:
        if found.schema_type != self.schema_type:
            raise SchemaRegistryError(
                f"{self.name}: the latest schema of subject {subject!r} is {found.schema_type}, "
                f"not {self.schema_type}"
            )

    def use_writer_schema(self, latest: RegisteredSchema) -> None:
        """With ``use_latest_version``: encode with ``latest`` instead of the codec's own
        schema (subclasses that can, override)."""
        if latest.schema != self.schema_text:
            raise ConfigurationError(
                f"{self.name}: use_latest_version=True is not supported by this codec unless "
                "the latest schema is the codec's own"
            )

    @abc.abstractmethod
    def encode_payload(self, obj: Any) -> bytes:
        """The payload of ``obj`` (no header); :class:`EncodeError` naming the field."""

    @abc.abstractmethod
    def make_reader(self, writer: RegisteredSchema) -> Reader:
        """A function decoding payloads written with ``writer`` (compiled once)."""

    # -- identity, pickling -------------------------------------------------------------------

    def _options(self) -> tuple[object, ...]:
        return (
            type(self),
            self.registry.url,
            self.schema_text,
            self.auto_register,
            self.use_latest_version,
            self.subject_name_strategy,
            self._subject,
            self.topic,
            self.is_key,
            self.references,
        )

    def __eq__(self, other: object) -> bool:
        """Codecs of the same schema, registry, options and subject are the same codec."""
        return isinstance(other, RegistryCodec) and other._options() == self._options()

    def __hash__(self) -> int:
        return hash(self._options())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_header"] = None
        state["_readers"] = {}
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(subject={self._subject or self.topic!r}, {self.registry!r})"
