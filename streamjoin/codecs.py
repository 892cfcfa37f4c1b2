"""Key/value serializers for topics (pure: no I/O).

A codec turns a Python object into the bytes of a Kafka record and back. Topics
pick one by name (``"raw"``, ``"str"``, ``"json"``, or anything registered with
:func:`register_codec`), by instance, or by record type (a dataclass here; a
``msgspec.Struct`` or pydantic model in :mod:`streamjoin.record_codecs`), through
:func:`resolve_codec`. Faust's record format is :mod:`streamjoin.faust_records`.

``None`` is never encoded as bytes: it is Kafka's null key or null value (a
tombstone), so the built-in codecs pass it through unchanged both ways.

Every decoding failure of a built-in codec is a :class:`DecodeError`, whatever
the bytes, so the runtime can apply the agent's ``on_error`` policy to a poison
record instead of crashing on an arbitrary exception type.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable

import msgspec

from streamjoin.codec_errors import Bytes as _Bytes
from streamjoin.codec_errors import check_bytes as _check_bytes
from streamjoin.codec_errors import decode_error as _decode_error
from streamjoin.codec_errors import encode_error as _encode_error
from streamjoin.errors import ArgumentTypeError, ConfigurationError, EncodeError
from streamjoin.native import native_function
from streamjoin.record_codecs import PydanticJson, StructJson, record_codec

__all__ = [
    "JSON",
    "RAW",
    "STR",
    "Codec",
    "DataclassJson",
    "JsonCodec",
    "PydanticJson",
    "RawCodec",
    "StrCodec",
    "StructJson",
    "register_codec",
    "registered_codec_names",
    "resolve_codec",
]


@runtime_checkable
class Codec(Protocol):
    """Serializer for record keys or values.

    The runtime never calls ``loads`` with ``None`` (null keys and tombstones
    skip the codec), but ``dumps`` may return ``None`` to produce one.
    ``loads`` must raise :class:`DecodeError` on bad input.
    """

    name: str

    def dumps(self, obj: Any) -> bytes | None:
        """Serialize ``obj``; ``None`` means a null key or value."""
        ...

    def loads(self, data: bytes) -> Any:
        """Deserialize ``data``, raising :class:`DecodeError` when it is invalid."""
        ...


def _utf8(codec: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates
        raise _encode_error(codec, text, str(exc)) from exc


class RawCodec:
    """Bytes as they are; ``str`` is accepted on the way out as UTF-8."""

    name = "raw"

    def dumps(self, obj: Any) -> bytes | None:
        """Pass bytes through, encode ``str`` as UTF-8, keep ``None`` (null)."""
        if obj is None or type(obj) is bytes:
            return obj
        if isinstance(obj, _Bytes):
            return bytes(obj)
        if isinstance(obj, str):
            return _utf8(self.name, obj)
        raise _encode_error(self.name, obj, "expected bytes, str or None")

    def loads(self, data: _Bytes | None) -> bytes | None:
        """The record bytes unchanged."""
        if data is None:
            return None
        return bytes(_check_bytes(self.name, data))

    def __repr__(self) -> str:
        return "RAW"


class StrCodec:
    """UTF-8 text; handy for keys such as user ids."""

    name = "str"

    def dumps(self, obj: Any) -> bytes | None:
        """Encode ``str`` as UTF-8; other types are refused so ids are never ``repr``-ed."""
        if type(obj) is str:
            try:
                return obj.encode()
            except UnicodeEncodeError:
                pass  # a lone surrogate: _utf8 words the error
        if obj is None:
            return None
        if isinstance(obj, str):
            return _utf8(self.name, obj)
        raise _encode_error(self.name, obj, "expected str or None")

    def loads(self, data: _Bytes | None) -> str | None:
        """Decode strict UTF-8."""
        if data is None:
            return None
        try:
            if type(data) is bytes:
                return data.decode()  # (strict UTF-8, as below, without the type check)
            return str(_check_bytes(self.name, data), "utf-8")
        except UnicodeDecodeError as exc:
            raise _decode_error(self.name, data, str(exc), "str") from exc

    def __repr__(self) -> str:
        return "STR"


def _json_default(obj: Any) -> Any:
    """Common non-JSON types, as other languages' JSON libraries write them."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, dt.datetime | dt.date | dt.time):
        return obj.isoformat()
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, uuid.UUID | Decimal):
        return str(obj)
    if isinstance(obj, set | frozenset):
        return list(obj)
    raise EncodeError(f"Object of type {type(obj).__qualname__} is not JSON serializable")


#: Canonical bytes: the same mapping always encodes (and so partitions) the same, which
#: matters when JSON is used for keys. NaN/Infinity are not JSON; other consumers would
#: reject the record. (One encoder for every call: ``json.dumps`` with options builds one
#: per call.)
_ENCODER = json.JSONEncoder(
    separators=(",", ":"),
    sort_keys=True,
    ensure_ascii=False,
    allow_nan=False,
    default=_json_default,
)
#: types msgspec writes byte for byte as the encoder above does (not float: the encoder
#: decides its form; not subclasses, whose JSON form the encoder decides)
_PLAIN_SCALARS = frozenset((str, int, bool, type(None)))
#: what the encoder does with a str (ensure_ascii=False)
_encode_str: Callable[[str], str] = json.encoder.encode_basestring
#: msgspec writes a dict with str keys sorted, compact, UTF-8 (not ASCII-escaped): the
#: bytes of _ENCODER (a test compares them), several times faster; its bytes are sized to
#: fit (orjson's kept a 4 KB buffer each, which table values and sends held until flushed)
fast_json_encode: Callable[[Any], bytes] = msgspec.json.Encoder(order="sorted").encode
#: msgspec reads strict UTF-8 JSON as the standard parser does (integers of any size
#: too), several times faster; what it refuses goes to the standard parser
fast_json_decode: Callable[[bytes], Any] = msgspec.json.Decoder().decode


def pure_plain_json(obj: Any) -> bool:
    """Whether ``obj`` is a dict (exactly, str keys) or list (exactly) of scalars that
    msgspec writes byte for byte as :data:`_ENCODER` does: exactly str, int, bool or None,
    or a float where msgspec writes Python's repr (zero and magnitudes in [1e-4, 1e16),
    the range repr writes without an exponent; outside it msgspec writes 1e16 where repr
    writes 1e+16). The twin of the compiled ``streamjoin_native.plain_json`` (loops
    spelled out: about 2x faster than all() of a generator)."""
    kind = type(obj)
    if kind is dict:
        items: Iterable[Any] = obj.values()
        for key in obj:
            if type(key) is not str:
                return False
    elif kind is list:
        items = obj
    else:
        return False
    for item in items:
        if type(item) not in _PLAIN_SCALARS and not (
            type(item) is float and (1e-4 <= item < 1e16 or -1e16 < item <= -1e-4 or item == 0.0)
        ):
            return False
    return True


#: the check above, compiled where native/ is built (about 5x faster on a 4-field row)
plain_json: Callable[[Any], bool] = native_function("plain_json") or pure_plain_json


def _json_dumps(codec: str, obj: Any) -> bytes:
    kind = type(obj)
    if kind is int and -(2**63) <= obj < 2**64:
        return b"%d" % obj
    if kind is str:
        return _utf8(codec, _encode_str(obj))
    # A dict (str keys) or list of scalars goes to msgspec (once per record sent and per
    # table write: the check is compiled where native/ is built)
    if (kind is dict or kind is list) and plain_json(obj):
        try:
            return fast_json_encode(obj)
        except (ValueError, msgspec.EncodeError):
            pass  # a lone surrogate: the encoder words the error
    try:
        text = _ENCODER.encode(obj)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _encode_error(codec, obj, str(exc)) from exc
    return _utf8(codec, text)


def _json_loads(codec: str, data: _Bytes, target: str | None) -> Any:
    # What msgspec refuses (NaN and Infinity, numbers out of a float's range, lone
    # surrogate escapes, deep nesting, bad bytes) goes to the standard parser, which
    # reads what JSON allows of it and words the error for the rest.
    if type(data) is bytes:
        try:
            return fast_json_decode(data)
        except (ValueError, RecursionError):  # msgspec.DecodeError is a ValueError
            pass
    try:
        # Decode first: json.loads(bytes) would silently accept UTF-16/32 too.
        return json.loads(str(_check_bytes(codec, data), "utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise _decode_error(codec, data, str(exc), target) from exc


class JsonCodec:
    """Compact UTF-8 JSON.

    Encodes dataclasses, datetimes (ISO-8601), enums, UUIDs, decimals and sets
    as JSON; decoding gives plain JSON types (dict, list, str, int, float...).
    """

    name = "json"

    def dumps(self, obj: Any) -> bytes | None:
        """``None`` is a null record, not ``b"null"``."""
        if obj is None:
            return None
        return _json_dumps(self.name, obj)

    def loads(self, data: _Bytes | None) -> Any:
        """Parse strict UTF-8 JSON."""
        if type(data) is bytes:  # (_json_loads's fast path, inlined: once per record read)
            try:
                return fast_json_decode(data)
            except (ValueError, RecursionError):
                pass  # _json_loads reads it or words the error
        if data is None:
            return None
        return _json_loads(self.name, data, None)

    def __repr__(self) -> str:
        return "JSON"


# -- dataclass-aware JSON ------------------------------------------------------------------


class _FieldError(Exception):
    """Where in the payload a value did not fit the dataclass schema."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.message = message


_Decoder = Callable[[Any, str], Any]


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


class _SchemaCompiler:
    """Turns type hints into decoders once, so decoding does no introspection.

    ``ignore_unknown``: objects may carry fields their dataclass does not declare
    (dropped); ``ignore_keys``: fields dropped wherever they appear (Faust's metadata).
    """

    def __init__(
        self, *, ignore_unknown: bool = False, ignore_keys: frozenset[str] = frozenset()
    ) -> None:
        # One entry per dataclass; filled lazily so recursive dataclasses terminate.
        self._dataclasses: dict[type, _Decoder] = {}
        self._ignore_unknown = ignore_unknown
        self._ignore_keys = ignore_keys

    def compile(self, tp: Any) -> _Decoder:
        if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
            return _passthrough
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self._dataclass(tp)
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is typing.Union or origin is types.UnionType:
            optional = type(None) in args
            arms = [self.compile(a) for a in args if a is not type(None)]
            return self._union(arms, optional)
        if origin is typing.Literal:
            return _literal(args)
        if origin in (list, set, frozenset) or (origin is tuple and args[-1:] == (...,)):
            return _sequence(origin, self.compile(args[0]) if args else _passthrough)
        if origin is tuple:
            return _fixed_tuple([self.compile(a) for a in args])
        if origin is dict or origin is Mapping:
            key = args[0] if args else str
            return _mapping(key, self.compile(args[1]) if args else _passthrough)
        if origin is not None:  # other generics (Sequence[int], ...): check nothing
            return _passthrough
        if tp in (list, set, frozenset, tuple):
            return _sequence(tp, _passthrough)
        if tp is dict:
            return _mapping(str, _passthrough)
        if isinstance(tp, type):
            return _scalar(tp)
        return _passthrough

    def _union(self, arms: list[_Decoder], optional: bool) -> _Decoder:
        if len(arms) == 1:  # Optional[X]: None or X, so X's own error is the clearest
            (only,) = arms
            return lambda value, path: None if value is None else only(value, path)

        def decode(value: Any, path: str) -> Any:
            if value is None and optional:
                return None
            errors = []
            for arm in arms:
                try:
                    return arm(value, path)
                except _FieldError as exc:
                    errors.append(exc.message)
            raise _FieldError(path, "no type of the union fits: " + "; ".join(errors))

        return decode

    def _dataclass(self, cls: type) -> _Decoder:
        if cls in self._dataclasses:
            return self._dataclasses[cls]
        plan: dict[str, _Decoder] = {}
        self._dataclasses[cls] = lambda value, path: decode(value, path)
        try:
            hints = typing.get_type_hints(cls)
        except Exception as exc:  # NameError etc. from unresolvable annotations
            raise ArgumentTypeError(
                f"cannot read the type hints of dataclass {cls.__qualname__}: {exc}"
            ) from exc
        fields = dataclasses.fields(cls)
        init_fields = [f for f in fields if f.init]
        # asdict() also writes init=False fields; they are recomputed, so accept and drop them.
        derived = {f.name for f in fields if not f.init} | self._ignore_keys
        check_unknown = not self._ignore_unknown
        required = {
            f.name
            for f in init_fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        for f in init_fields:
            plan[f.name] = self.compile(hints.get(f.name, Any))
        name = cls.__qualname__

        def decode(value: Any, path: str) -> Any:
            of = "" if path == name else f" of {name}"
            if not isinstance(value, dict):
                raise _FieldError(path, f"expected an object{of}, got {_json_type(value)}")
            if check_unknown:
                unknown = [k for k in value if k not in plan and k not in derived]
                if unknown:
                    raise _FieldError(path, f"unknown field(s){of}: {_names(unknown)}")
            missing = [k for k in sorted(required) if k not in value]
            if missing:
                raise _FieldError(path, f"missing required field(s){of}: {_names(missing)}")
            kwargs = {k: plan[k](v, f"{path}.{k}") for k, v in value.items() if k in plan}
            try:
                return cls(**kwargs)
            except Exception as exc:  # __post_init__ validation is user code
                raise _FieldError(
                    path, f"{name}(...) raised {type(exc).__qualname__}: {exc}"
                ) from exc

        self._dataclasses[cls] = decode
        return decode


def _names(keys: list[str]) -> str:
    return ", ".join(repr(k) for k in keys)


def _passthrough(value: Any, path: str) -> Any:
    return value


def _literal(allowed: tuple[Any, ...]) -> _Decoder:
    def decode(value: Any, path: str) -> Any:
        for option in allowed:
            if value == option and type(value) is type(option):
                return option
        raise _FieldError(path, f"expected one of {list(allowed)!r}, got {value!r}")

    return decode


def _sequence(container: Any, item: _Decoder) -> _Decoder:
    def decode(value: Any, path: str) -> Any:
        if not isinstance(value, list):
            raise _FieldError(path, f"expected an array, got {_json_type(value)}")
        return container(item(v, f"{path}[{i}]") for i, v in enumerate(value))

    return decode


def _fixed_tuple(items: list[_Decoder]) -> _Decoder:
    def decode(value: Any, path: str) -> Any:
        if not isinstance(value, list) or len(value) != len(items):
            raise _FieldError(path, f"expected an array of {len(items)} items, got {value!r:.60}")
        return tuple(
            d(v, f"{path}[{i}]") for i, (d, v) in enumerate(zip(items, value, strict=True))
        )

    return decode


def _mapping(key_type: Any, item: _Decoder) -> _Decoder:
    # JSON object keys are strings; int keys (written by json.dumps as "1") are restored.
    key_decoder = _int_key if key_type is int else _passthrough

    def decode(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _FieldError(path, f"expected an object, got {_json_type(value)}")
        return {key_decoder(k, path): item(v, f"{path}[{k!r}]") for k, v in value.items()}

    return decode


def _int_key(key: str, path: str) -> int:
    try:
        return int(key)
    except ValueError as exc:
        raise _FieldError(path, f"expected an integer key, got {key!r}") from exc


def _scalar(tp: type) -> _Decoder:
    """Check JSON scalars and rebuild the types JSON cannot carry (datetime, Enum, ...)."""
    name = tp.__qualname__
    if tp is bool:
        return _exact(bool, "boolean")
    if tp is int:

        def decode_int(value: Any, path: str) -> Any:
            if type(value) is not int:
                raise _FieldError(path, f"expected an integer, got {value!r:.60}")
            return value

        return decode_int
    if tp is float:

        def decode_float(value: Any, path: str) -> Any:
            if type(value) not in (int, float):
                raise _FieldError(path, f"expected a number, got {value!r:.60}")
            return float(value)

        return decode_float
    if tp is str:
        return _exact(str, "string")
    if tp is type(None):

        def decode_none(value: Any, path: str) -> Any:
            if value is not None:
                raise _FieldError(path, f"expected null, got {value!r:.60}")
            return None

        return decode_none
    if issubclass(tp, enum.Enum):

        def decode_enum(value: Any, path: str) -> Any:
            try:
                return tp(value)
            except (ValueError, TypeError) as exc:
                raise _FieldError(path, f"{value!r:.60} is not a valid {name}") from exc

        return decode_enum
    parse: Callable[[str], Any] | None = None
    if tp is dt.datetime:
        parse = dt.datetime.fromisoformat
    elif tp is dt.date:
        parse = dt.date.fromisoformat
    elif tp is dt.time:
        parse = dt.time.fromisoformat
    elif tp is uuid.UUID:
        parse = uuid.UUID
    elif tp is Decimal:
        parse = Decimal
    if parse is not None:
        parser = parse

        def decode_parsed(value: Any, path: str) -> Any:
            if not isinstance(value, str):
                raise _FieldError(path, f"expected a {name} string, got {_json_type(value)}")
            try:
                return parser(value)
            except (ValueError, ArithmeticError) as exc:
                raise _FieldError(path, f"invalid {name} {value!r:.60}: {exc}") from exc

        return decode_parsed
    return _passthrough  # an arbitrary class: hand over what JSON gave us


def _exact(tp: type, json_name: str) -> _Decoder:
    def decode(value: Any, path: str) -> Any:
        if type(value) is not tp:
            raise _FieldError(path, f"expected a {json_name}, got {value!r:.60}")
        return value

    return decode


#: what ``msgspec.to_builtins`` leaves to the JSON encoder when it turns a dataclass into
#: dicts and lists (``dataclasses.asdict`` deep-copies every value, most of an encode's time):
#: the encoder writes these (or refuses bytes) as it always did, so the bytes are the same
_WRITTEN_BY_THE_ENCODER = (
    dt.datetime,
    dt.date,
    dt.time,
    uuid.UUID,
    Decimal,
    bytes,
    bytearray,
    memoryview,
)


class DataclassJson:
    """JSON for one dataclass type, rebuilding nested dataclasses on the way in.

    The schema comes from the dataclass's type hints and is compiled once, here:
    nested dataclasses, ``list[...]``/``tuple[...]``/``dict[str, ...]``,
    ``Optional``/unions, ``Literal``, enums and ISO-8601 ``datetime``/``date``
    fields are rebuilt, scalars are type-checked. Missing fields are decode
    errors, and so are unknown fields unless ``ignore_unknown=True`` (then they
    are dropped, at every level): a schema change shows up at the first bad record.
    ``ignore_keys`` are dropped wherever they appear, whatever ``ignore_unknown``
    says (:class:`~streamjoin.faust_records.FaustRecord` drops Faust's ``__faust``).
    """

    def __init__(
        self, cls: type, *, ignore_unknown: bool = False, ignore_keys: Iterable[str] = ()
    ) -> None:
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ArgumentTypeError(f"DataclassJson needs a dataclass type, got {cls!r}")
        if isinstance(ignore_keys, str):  # a str is an iterable of one-letter keys
            raise ArgumentTypeError(f"ignore_keys must be a list of names, got {ignore_keys!r}")
        self.cls = cls
        self.name = f"json[{cls.__qualname__}]"
        self.ignore_unknown = ignore_unknown
        self.ignore_keys = frozenset(ignore_keys)
        compiler = _SchemaCompiler(ignore_unknown=ignore_unknown, ignore_keys=self.ignore_keys)
        self._decode = compiler.compile(cls)

    def dumps(self, obj: Any) -> bytes | None:
        """Encode an instance of the dataclass (or a plain dict of its fields)."""
        if obj is None:
            return None
        if type(obj) is self.cls:
            try:
                fields = msgspec.to_builtins(obj, builtin_types=_WRITTEN_BY_THE_ENCODER)
            except (TypeError, ValueError):  # a value it cannot write: the encoder words it
                fields = dataclasses.asdict(obj)
            return _json_dumps(self.name, fields)
        if isinstance(obj, self.cls):  # a subclass: its own fields too
            return _json_dumps(self.name, dataclasses.asdict(obj))
        if isinstance(obj, dict):
            return _json_dumps(self.name, obj)
        raise _encode_error(self.name, obj, f"expected {self.cls.__qualname__}, a dict or None")

    def loads(self, data: _Bytes | None) -> Any:
        """Decode into an instance of the dataclass."""
        if data is None:
            return None
        target = self.cls.__qualname__
        payload = _json_loads(self.name, data, target)
        try:
            return self._decode(payload, target)
        except _FieldError as exc:
            raise _decode_error(self.name, data, str(exc), target) from exc
        except RecursionError as exc:
            raise _decode_error(self.name, data, "nested too deeply", target) from exc

    def _options(self) -> tuple[object, ...]:
        return (self.cls, self.ignore_unknown, self.ignore_keys)

    def __eq__(self, other: object) -> bool:
        """Codecs of the same dataclass and options are the same codec (each declaration
        makes one)."""
        return isinstance(other, DataclassJson) and other._options() == self._options()

    def __hash__(self) -> int:
        return hash((DataclassJson, *self._options()))

    def __repr__(self) -> str:
        options = ", ignore_unknown=True" if self.ignore_unknown else ""
        if self.ignore_keys:
            options += f", ignore_keys={sorted(self.ignore_keys)!r}"
        return f"DataclassJson({self.cls.__qualname__}{options})"


# -- registry ------------------------------------------------------------------------------

RAW = RawCodec()
STR = StrCodec()
JSON = JsonCodec()

_REGISTRY: dict[str, Codec] = {c.name: c for c in (RAW, STR, JSON)}


def register_codec(codec: Codec, *, replace: bool = False) -> None:
    """Make ``codec`` available by its name to :func:`resolve_codec` (and ``app.topic``)."""
    if not isinstance(codec, Codec) or isinstance(codec, type):
        raise ArgumentTypeError(
            f"expected a codec instance with name, dumps and loads, got {codec!r}"
        )
    if not isinstance(codec.name, str) or not codec.name:
        raise ArgumentTypeError(f"codec name must be a non-empty str, got {codec.name!r}")
    if codec.name in _REGISTRY and not replace:
        raise ConfigurationError(
            f"a codec named {codec.name!r} is already registered ({_REGISTRY[codec.name]!r}); "
            "pass replace=True to override it"
        )
    _REGISTRY[codec.name] = codec


def registered_codec_names() -> list[str]:
    """Names :func:`resolve_codec` accepts, sorted."""
    return sorted(_REGISTRY)


def resolve_codec(spec: str | Codec | type | None, *, default: str = "raw") -> Codec:
    """The codec meant by a topic's ``key_serializer``/``value_serializer`` setting.

    Accepts a registered name, a codec instance, a dataclass, ``msgspec.Struct`` or
    pydantic model type (JSON into that type), ``bytes``/``str`` (the raw/str codecs),
    or ``None`` for ``default``.
    """
    if spec is None:
        spec = default
    if isinstance(spec, str):
        try:
            return _REGISTRY[spec]
        except KeyError:
            raise ConfigurationError(
                f"unknown codec {spec!r}; registered codecs: {', '.join(registered_codec_names())}"
            ) from None
    if isinstance(spec, type):
        if dataclasses.is_dataclass(spec):
            return DataclassJson(spec)
        if spec is bytes:
            return RAW
        if spec is str:
            return STR
        typed = record_codec(spec)
        if typed is not None:
            return typed
        raise ArgumentTypeError(
            f"cannot make a codec from class {spec.__qualname__}: expected a dataclass, "
            "a msgspec.Struct, a pydantic model, bytes, str, a codec name or a codec instance"
        )
    if isinstance(spec, Codec):
        return spec
    raise ArgumentTypeError(
        "expected a codec name, a codec instance or a record type (dataclass, msgspec.Struct, "
        f"pydantic model), got {type(spec).__qualname__}"
    )
