"""JSON codecs for typed records: ``msgspec.Struct`` types and pydantic models (pure).

``app.topic(..., value_serializer=Order)`` with ``Order`` a Struct or a pydantic
model resolves here (through :func:`streamjoin.codecs.resolve_codec`). Both libraries
validate while they parse, in compiled code, so a typed record costs about what a
plain JSON dict does (docs/codecs.md has the numbers). A record that does not fit
its type is a :class:`~streamjoin.errors.DecodeError` naming the field, so the
agent's ``on_error`` policy applies to it like to any undecodable record.

Unknown fields follow the type's own setting: msgspec ignores them unless the
Struct says ``forbid_unknown_fields=True``, pydantic unless the model's config says
``extra="forbid"``. pydantic is optional: it is imported only by code that already
has a pydantic model in hand.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Callable
from typing import Any

import msgspec

from streamjoin.codec_errors import Bytes, check_bytes, decode_error, encode_error
from streamjoin.errors import ArgumentTypeError, DecodeError

__all__ = ["PydanticJson", "StructJson", "is_pydantic_model", "is_struct_type", "record_codec"]

#: fields sorted, as the JSON codec sorts a dict's keys: the same record always has the
#: same bytes (and so the same partition, as a key), whatever the order fields are
#: declared in, and a Struct writes what a dataclass with the same fields writes
_encode: Callable[[Any], bytes] = msgspec.json.Encoder(order="sorted").encode

#: how many of pydantic's errors for one record a message lists
_MAX_ERRORS = 3


def is_struct_type(tp: object) -> bool:
    """Whether ``tp`` is a ``msgspec.Struct`` class."""
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def is_pydantic_model(tp: object) -> bool:
    """Whether ``tp`` is a pydantic (v2) model class; never imports pydantic."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def record_codec(tp: type) -> StructJson | PydanticJson | None:
    """The codec for a Struct or pydantic model type; None for any other class."""
    if is_struct_type(tp):
        return StructJson(tp)
    if is_pydantic_model(tp):
        return PydanticJson(tp)
    if hasattr(tp, "parse_raw") and not hasattr(tp, "model_validate_json"):
        raise ArgumentTypeError(
            f"{tp.__qualname__} looks like a pydantic v1 model; streamjoin reads pydantic 2 "
            "models (pydantic.BaseModel, not pydantic.v1.BaseModel)"
        )
    return None


def _struct_cause(message: str, target: str) -> str:
    """msgspec's ``Expected `int`, got `str` - at `$.lines[0].qty``` as
    ``Order.lines[0].qty: Expected `int`, got `str```."""
    what, at, path = message.rpartition(" - at `")
    if not at:
        return f"{target}: {message}"
    return f"{target}{path.rstrip('`')[1:]}: {what}"


class _RecordJson(abc.ABC):
    """What the Struct and pydantic codecs share: a parser that validates, errors worded
    by the subclass, equality by type."""

    def __init__(self, cls: type, parse: Callable[[bytes], Any]) -> None:
        self.cls = cls
        self.name = f"json[{cls.__qualname__}]"
        self._target = cls.__qualname__
        self._parse = parse

    def loads(self, data: Bytes | None) -> Any:
        """Decode into an instance of ``cls``."""
        if data is None:
            return None
        if type(data) is not bytes:
            data = bytes(check_bytes(self.name, data))  # (a str is a programming error)
        try:
            return self._parse(data)
        except Exception as exc:
            raise self._error(data, exc) from exc

    def loads_from(self, payload: bytes, record: Bytes) -> Any:
        """Decode ``payload``, made from ``record`` (errors show ``record``)."""
        try:
            return self._parse(payload)
        except Exception as exc:
            raise self._error(record, exc) from exc

    @abc.abstractmethod
    def _error(self, data: Bytes, exc: Exception) -> DecodeError:
        """The DecodeError for ``exc``, raised while decoding ``data``."""

    def __eq__(self, other: object) -> bool:
        """Codecs of the same type are the same codec (each declaration makes one)."""
        return type(other) is type(self) and other.cls is self.cls

    def __hash__(self) -> int:
        return hash((type(self), self.cls))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._target})"


class StructJson(_RecordJson):
    """JSON for one ``msgspec.Struct`` type, validated while it is parsed.

    Nested Structs, dataclasses, ``list``/``dict``/``tuple``/``set``, ``Optional`` and
    unions, ``Literal``, enums, ``datetime``/``date``/``time`` (RFC 3339), ``UUID`` and
    ``Decimal`` fields are rebuilt, as msgspec does; constraints given with
    ``msgspec.Meta`` are checked. Fields are written sorted by name. msgspec writes
    NaN and infinities as ``null``, which then do not decode into a ``float`` field.
    """

    def __init__(self, cls: type) -> None:
        if not is_struct_type(cls):
            raise ArgumentTypeError(f"StructJson needs a msgspec.Struct type, got {cls!r}")
        super().__init__(cls, msgspec.json.Decoder(cls).decode)
        self._accepts = (cls, dict)

    @property
    def forbids_unknown_fields(self) -> bool:
        """Whether the Struct refuses fields it does not declare (its own setting)."""
        config = self.cls.__struct_config__  # type: ignore[attr-defined]
        return bool(config.forbid_unknown_fields)

    def dumps(self, obj: Any) -> bytes | None:
        """Encode an instance of the Struct (or a plain dict of its fields)."""
        if obj is None:
            return None
        if not isinstance(obj, self._accepts):
            raise encode_error(self.name, obj, f"expected {self._target}, a dict or None")
        try:
            return _encode(obj)
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            raise encode_error(self.name, obj, str(exc)) from exc

    def _error(self, data: Bytes, exc: Exception) -> DecodeError:
        if isinstance(exc, msgspec.ValidationError):  # before DecodeError: a subclass
            cause = _struct_cause(str(exc), self._target)
        elif isinstance(exc, msgspec.DecodeError):  # malformed JSON
            cause = str(exc)
        else:  # __post_init__ is user code: what it raises says the record does not fit
            cause = f"{self._target}(...) raised {type(exc).__qualname__}: {exc}"
        return decode_error(self.name, data, cause, self._target)


def _pydantic_cause(exc: Any, target: str) -> str:
    """pydantic's errors as ``Order.lines[0].qty: Input should be a valid integer``."""
    errors = exc.errors(include_url=False)
    said = []
    for error in errors[:_MAX_ERRORS]:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        said.append(f"{target}{path}: {error['msg']}")
    if len(errors) > _MAX_ERRORS:
        said.append(f"and {len(errors) - _MAX_ERRORS} more")
    return "; ".join(said)


class PydanticJson(_RecordJson):
    """JSON for one pydantic (v2) model, validated by pydantic while it is parsed.

    Written with field aliases (what the model reads back by default), in the model's
    field order; read with ``model_validate_json``, so the model's validators, strict
    mode and ``extra`` setting apply.
    """

    def __init__(self, cls: type) -> None:
        if not is_pydantic_model(cls):
            raise ArgumentTypeError(f"PydanticJson needs a pydantic model class, got {cls!r}")
        import pydantic  # already imported: cls is a model

        super().__init__(cls, cls.model_validate_json)  # type: ignore[attr-defined]
        self._invalid: type[Exception] = pydantic.ValidationError
        self._to_json: Callable[..., bytes] = cls.__pydantic_serializer__.to_json  # type: ignore[attr-defined]

    @property
    def extra(self) -> str:
        """What the model does with fields it does not declare: ignore, allow or forbid."""
        return str(self.cls.model_config.get("extra") or "ignore")  # type: ignore[attr-defined]

    def dumps(self, obj: Any) -> bytes | None:
        """Encode an instance of the model (or a plain dict of its fields)."""
        if obj is None:
            return None
        try:
            if isinstance(obj, self.cls):
                return self._to_json(obj, by_alias=True)
            if isinstance(obj, dict):
                return _encode(obj)
        except (TypeError, ValueError, msgspec.EncodeError) as exc:  # PydanticSerializationError
            raise encode_error(self.name, obj, str(exc)) from exc
        raise encode_error(self.name, obj, f"expected {self._target}, a dict or None")

    def _error(self, data: Bytes, exc: Exception) -> DecodeError:
        if isinstance(exc, self._invalid):
            cause = _pydantic_cause(exc, self._target)
        else:
            cause = f"{self._target} validation raised {type(exc).__qualname__}: {exc}"
        return decode_error(self.name, data, cause, self._target)
