"""Avro in the Confluent wire format, with fastavro, schemas in a schema registry.

Values are dicts (fastavro's forms: ``bytes``, ``Decimal``, ``UUID``, ``date``,
``time``, timezone-aware ``datetime``...), or instances of ``record_type`` (a dataclass
or a ``msgspec.Struct``) when given. A record written with another schema of the
subject (an older or newer version) is read with fastavro's schema resolution into this
codec's schema: a field added with a default is filled in, a field removed is dropped.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from io import BytesIO
from typing import Any, ClassVar

import msgspec

from streamjoin.codec_errors import decode_error, encode_error
from streamjoin.errors import ArgumentTypeError, ConfigurationError
from streamjoin.schema_registry.client import (
    RegisteredSchema,
    SchemaReference,
    SchemaRegistryClient,
)
from streamjoin.schema_registry.registry_codec import (
    Reader,
    RegistryCodec,
    SubjectNameStrategy,
    check_record_type,
)

try:
    import fastavro
    from fastavro.validation import validate as _validate
except ImportError:  # pragma: no cover - the registry extra is not installed
    fastavro = None  # type: ignore[assignment]

__all__ = ["AvroCodec"]

#: what ``record_type`` instances are turned into before fastavro writes them: the types
#: fastavro writes as they are stay as they are
_AVRO_NATIVE = (dt.datetime, dt.date, dt.time, uuid.UUID, decimal.Decimal, bytes, bytearray)


def _schema_json(schema: str | Mapping[str, Any] | Sequence[Any]) -> Any:
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except ValueError:
            return schema  # a bare primitive name: "string", "long"...
    if isinstance(schema, Mapping | Sequence):
        return schema
    raise ArgumentTypeError(
        f"an Avro schema is a JSON str or a dict, got {type(schema).__qualname__}"
    )


def _parse(schema: Any, where: str) -> Any:
    if fastavro is None:
        raise ConfigurationError(
            "AvroCodec needs fastavro: pip install 'streamjoin[registry]' (or fastavro)"
        )
    try:
        return fastavro.parse_schema(schema, named_schemas={})
    except Exception as exc:  # fastavro raises SchemaParseException, ValueError, KeyError...
        raise ConfigurationError(f"{where}: not a valid Avro schema: {exc}") from exc


def _full_name(schema: Any) -> str | None:
    if not isinstance(schema, dict) or schema.get("type") not in ("record", "enum", "fixed"):
        return None
    name = str(schema.get("name", ""))
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


class AvroCodec(RegistryCodec):
    """Avro records framed with their schema id (Confluent's ``KafkaAvroSerializer`` format).

    ``schema``: the Avro schema (JSON text or a dict); it is the writer schema and the
    schema records are read into. ``registry``: a :class:`SchemaRegistryClient` or its
    URL. ``record_type``: a dataclass or ``msgspec.Struct`` to read records into (and
    accept on write); dicts otherwise. ``auto_register``: register the schema under the
    subject at the first write (else look its id up; absent: :class:`SchemaNotFound`).
    ``use_latest_version``: write with the subject's latest schema instead.
    ``subject`` / ``subject_name_strategy``: see docs/codecs.md ("Schema registry").
    """

    schema_type: ClassVar[str] = "AVRO"
    kind: ClassVar[str] = "avro"

    def __init__(
        self,
        schema: str | Mapping[str, Any] | Sequence[Any],
        registry: SchemaRegistryClient | str,
        *,
        record_type: type | None = None,
        auto_register: bool = True,
        use_latest_version: bool = False,
        subject: str | None = None,
        subject_name_strategy: SubjectNameStrategy = "topic",
        references: Sequence[SchemaReference] = (),
    ) -> None:
        loaded = _schema_json(schema)
        self._parsed = _parse(loaded, "AvroCodec")
        self._writer = self._parsed
        self.record_type = check_record_type(record_type)
        super().__init__(
            json.dumps(loaded, separators=(",", ":")),
            registry,
            record_name=_full_name(loaded),
            auto_register=auto_register,
            use_latest_version=use_latest_version,
            subject=subject,
            subject_name_strategy=subject_name_strategy,
            references=references,
        )

    def use_writer_schema(self, latest: RegisteredSchema) -> None:
        """Write with the subject's latest schema (``use_latest_version``)."""
        self._writer = _parse(json.loads(latest.schema), f"{self.name}: latest schema")

    def encode_payload(self, obj: Any) -> bytes:
        """The Avro binary form of ``obj`` (a dict, or a ``record_type`` instance)."""
        datum = obj
        if type(obj) is not dict and self.record_type is not None:
            datum = msgspec.to_builtins(obj, builtin_types=_AVRO_NATIVE)
        out = BytesIO()
        try:
            fastavro.schemaless_writer(out, self._writer, datum)
        except Exception as exc:  # fastavro's TypeError, ValueError, KeyError, AttributeError...
            raise encode_error(self.name, obj, self._why_not(datum, exc)) from exc
        return out.getvalue()

    def _why_not(self, datum: Any, exc: Exception) -> str:
        """fastavro's validator names the field path (``shop.Order.amount is <x> of type
        <class 'str'> expected long``); its writer's message often does not."""
        try:
            _validate(datum, self._writer, raise_errors=True)
        except Exception as invalid:
            errors = getattr(invalid, "errors", None)
            if errors:
                return "; ".join(str(e) for e in errors[:3])
            return str(invalid)
        return f"{type(exc).__name__}: {exc}"

    def make_reader(self, writer: RegisteredSchema) -> Reader:
        """Read ``writer``'s records into this codec's schema (resolved once per id)."""
        read = fastavro.schemaless_reader
        own = self._parsed
        if writer.schema == self.schema_text:
            parsed_writer, reader_schema = own, None
        else:
            parsed_writer = _parse(json.loads(writer.schema), f"schema id {writer.schema_id}")
            reader_schema = own
        name, target = self.name, self._target()
        convert: Callable[[Any], Any] | None = None
        if self.record_type is not None:
            record_type = self.record_type

            def convert(value: Any) -> Any:
                return msgspec.convert(value, record_type)

        def decode(payload: memoryview) -> Any:
            try:
                value = read(BytesIO(payload), parsed_writer, reader_schema)
                return value if convert is None else convert(value)
            except Exception as exc:  # any failure to read is a bad record
                raise decode_error(name, payload, f"{type(exc).__name__}: {exc}", target) from exc

        return decode

    def _target(self) -> str | None:
        if self.record_type is not None:
            return self.record_type.__qualname__
        return self.record_name

    @property
    def plain_values(self) -> bool:
        """Values are plain data (dicts, lists, scalars) without a ``record_type``: a table
        may remember what it decoded (see :mod:`streamjoin.remembered_values`)."""
        return self.record_type is None

    def _options(self) -> tuple[object, ...]:
        return (*super()._options(), self.record_type)
