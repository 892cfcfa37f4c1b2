"""JSON Schema in the Confluent wire format: JSON payloads validated against a schema held
in a schema registry (Confluent's ``KafkaJsonSchemaSerializer`` format).

Encoding validates before anything is sent; decoding validates against the writer's
schema (the one the record's id names), with a validator compiled once per id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
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
    import jsonschema
    import jsonschema.exceptions
except ImportError:  # pragma: no cover - the registry extra is not installed
    jsonschema = None

__all__ = ["JsonSchemaCodec"]

_encode: Callable[[Any], bytes] = msgspec.json.Encoder(order="sorted").encode
_decode: Callable[[Any], Any] = msgspec.json.Decoder().decode


def _validator(schema: Any, where: str) -> Any:
    """A compiled validator for ``schema`` (its ``$schema`` draft, else the latest)."""
    if jsonschema is None:
        raise ConfigurationError(
            "JsonSchemaCodec needs jsonschema: pip install 'streamjoin[registry]' (or jsonschema)"
        )
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise ConfigurationError(f"{where}: not a valid JSON Schema: {exc.message}") from exc
    return cls(schema)


def _path(error: Any) -> str:
    """``$.lines[1].qty``: where in the document the error is."""
    out = "$"
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _first_error(validator: Any, document: Any) -> str | None:
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is None:
        return None
    return f"{_path(error)}: {error.message}"


class JsonSchemaCodec(RegistryCodec):
    """JSON documents checked against a JSON Schema, framed with the schema's id.

    ``schema``: the JSON Schema (text or a dict; its ``title`` names the record for the
    ``record``/``topic_record`` subject strategies). ``record_type``: a dataclass or
    ``msgspec.Struct`` to read documents into (and accept on write); plain JSON values
    otherwise. The other settings are :class:`~streamjoin.schema_registry.AvroCodec`'s.
    """

    schema_type: ClassVar[str] = "JSON"
    kind: ClassVar[str] = "jsonschema"

    def __init__(
        self,
        schema: str | Mapping[str, Any],
        registry: SchemaRegistryClient | str,
        *,
        record_type: type | None = None,
        auto_register: bool = True,
        use_latest_version: bool = False,
        subject: str | None = None,
        subject_name_strategy: SubjectNameStrategy = "topic",
        references: Sequence[SchemaReference] = (),
    ) -> None:
        if isinstance(schema, str):
            try:
                loaded = json.loads(schema)
            except ValueError as exc:
                raise ConfigurationError(f"JsonSchemaCodec: the schema is not JSON: {exc}") from exc
        elif isinstance(schema, Mapping):
            loaded = dict(schema)
        else:
            raise ArgumentTypeError(
                f"a JSON Schema is a JSON str or a dict, got {type(schema).__qualname__}"
            )
        self.record_type = check_record_type(record_type)
        self._validator = _validator(loaded, "JsonSchemaCodec")
        self._writer_schema: Any = loaded
        title = loaded.get("title") if isinstance(loaded, dict) else None
        super().__init__(
            json.dumps(loaded, separators=(",", ":")),
            registry,
            record_name=title if isinstance(title, str) and title else None,
            auto_register=auto_register,
            use_latest_version=use_latest_version,
            subject=subject,
            subject_name_strategy=subject_name_strategy,
            references=references,
        )

    def use_writer_schema(self, latest: RegisteredSchema) -> None:
        """Validate writes against the subject's latest schema (``use_latest_version``)."""
        self._writer_schema = json.loads(latest.schema)
        self._validator = _validator(self._writer_schema, f"{self.name}: latest schema")

    def encode_payload(self, obj: Any) -> bytes:
        """Validated JSON of ``obj``; an :class:`EncodeError` names the first bad field."""
        document = obj
        if self.record_type is not None and type(obj) is not dict:
            document = msgspec.to_builtins(obj)
        try:
            valid = self._validator.is_valid(document)
            if valid:
                return _encode(document)
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            raise encode_error(self.name, obj, f"not JSON: {exc}") from exc
        raise encode_error(self.name, obj, str(_first_error(self._validator, document)))

    def make_reader(self, writer: RegisteredSchema) -> Reader:
        """Parse, validate against ``writer`` (compiled once), convert to ``record_type``."""
        validator = _validator(json.loads(writer.schema), f"schema id {writer.schema_id}")
        is_valid = validator.is_valid
        name, record_type = self.name, self.record_type
        target = record_type.__qualname__ if record_type is not None else self.record_name

        def decode(payload: memoryview) -> Any:
            try:
                document = _decode(payload)
            except (ValueError, RecursionError) as exc:  # msgspec.DecodeError is a ValueError
                raise decode_error(name, payload, f"not JSON: {exc}", target) from exc
            if not is_valid(document):
                why = f"schema id {writer.schema_id}: {_first_error(validator, document)}"
                raise decode_error(name, payload, why, target)
            if record_type is None:
                return document
            try:
                return msgspec.convert(document, record_type)
            except msgspec.ValidationError as exc:
                raise decode_error(name, payload, str(exc), target) from exc

        return decode

    @property
    def plain_values(self) -> bool:
        """Values are plain data (dicts, lists, scalars) without a ``record_type``: a table
        may remember what it decoded (see :mod:`streamjoin.remembered_values`)."""
        return self.record_type is None

    def _options(self) -> tuple[object, ...]:
        return (*super()._options(), self.record_type)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["_validator"]  # (jsonschema's validators do not pickle: compiled again)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._validator = _validator(self._writer_schema, self.name)
