"""Faust's record format, read and written (pure).

A ``faust.Record`` is written as a JSON object of its fields plus a ``"__faust"`` key
holding the model's namespace (``{"__faust": {"ns": "myapp.models.Withdrawal"},
"account": "a1", "amount": 10.5}``; nested records carry one too). Faust itself uses
the namespace only where a topic has no declared type; a typed Faust topic reads the
fields and ignores it. :class:`FaustRecord` does the same with a dataclass,
``msgspec.Struct`` or pydantic model: it reads records with or without the key (so a
topic keeps working while its producers move from Faust to streamjoin), and writes
the key (unless ``write_metadata=False``) so Faust consumers, typed or not, read what
streamjoin writes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from streamjoin.codec_errors import Bytes, check_bytes, decode_error, encode_error
from streamjoin.codecs import DataclassJson
from streamjoin.errors import ArgumentTypeError, ConfigurationError, DecodeError
from streamjoin.record_codecs import PydanticJson, StructJson, record_codec

__all__ = ["BLESSED_KEY", "FaustRecord"]

#: the key Faust adds to every record it writes (Faust calls it the "blessed key")
BLESSED_KEY = "__faust"


def _without_metadata(value: Any) -> Any:
    """``value`` with Faust's key dropped from every object in it."""
    if type(value) is dict:
        return {k: _without_metadata(v) for k, v in value.items() if k != BLESSED_KEY}
    if type(value) is list:
        return [_without_metadata(v) for v in value]
    return value


class FaustRecord:
    """Faust's JSON record format for one record type (dataclass, Struct or pydantic model).

    ``namespace``: the ``ns`` written, by default ``<module>.<qualname>`` of ``cls``, as
    Faust names its models; give the Faust model's own (its module path, or its
    ``namespace=`` option) when Faust consumers read the topic without a declared type.
    ``write_metadata=False`` writes the fields alone, as Faust's
    ``include_metadata=False`` does. ``ignore_unknown=True`` (dataclasses) drops fields
    the dataclass does not declare instead of refusing the record; a Struct or model
    decides that itself (``forbid_unknown_fields``, ``extra``). Reading ignores the
    namespace, as a typed Faust topic does.
    """

    def __init__(
        self,
        cls: type,
        *,
        namespace: str | None = None,
        write_metadata: bool = True,
        ignore_unknown: bool = False,
    ) -> None:
        inner: DataclassJson | StructJson | PydanticJson | None
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            inner = DataclassJson(cls, ignore_unknown=ignore_unknown, ignore_keys=(BLESSED_KEY,))
            # (the dataclass codec drops the key at every level: always the direct path)
            direct, retry = True, False
        else:
            inner = record_codec(cls) if isinstance(cls, type) else None
            if inner is None:
                raise ArgumentTypeError(
                    "FaustRecord needs a dataclass, msgspec.Struct or pydantic model class, "
                    f"got {cls!r}"
                )
            direct, retry = self._reading_plan(inner, ignore_unknown)
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise ConfigurationError(f"namespace must be a non-empty str, got {namespace!r}")
        self.cls = cls
        self.namespace = namespace or f"{cls.__module__}.{cls.__qualname__}"
        self.write_metadata = write_metadata
        self.ignore_unknown = ignore_unknown
        self.name = f"faust[{cls.__qualname__}]"
        self._inner = inner
        #: decode the record as it is: the type ignores the key at the top level
        self._direct = direct
        #: ...and when that fails, again without the key (a nested type refused it)
        self._retry = retry
        self._prefix = b'{"__faust":{"ns":' + msgspec.json.encode(self.namespace) + b"}"

    @staticmethod
    def _reading_plan(inner: StructJson | PydanticJson, ignore_unknown: bool) -> tuple[bool, bool]:
        """(direct, retry): whether records decode as they are, and whether a failure is
        retried without the key. A type that refuses unknown fields refuses the key too."""
        if isinstance(inner, StructJson):
            if inner.cls.__struct_config__.array_like:  # type: ignore[attr-defined]
                raise ConfigurationError(
                    f"FaustRecord({inner.cls.__qualname__}): an array_like Struct is written "
                    "as a JSON array; a Faust record is a JSON object"
                )
            refuses = inner.forbids_unknown_fields
            setting = "forbid_unknown_fields=True"
        else:
            refuses = inner.extra != "ignore"  # allow would keep it as an extra field
            setting = f"extra={inner.extra!r}"
        if ignore_unknown and refuses:
            raise ConfigurationError(
                f"FaustRecord({inner.cls.__qualname__}, ignore_unknown=True): the type itself "
                f"says {setting}; change that setting instead"
            )
        return (False, False) if refuses else (True, True)

    def dumps(self, obj: Any) -> bytes | None:
        """The record's JSON object with ``"__faust": {"ns": ...}`` first."""
        body = self._inner.dumps(obj)
        if body is None or not self.write_metadata:
            return body
        if body[:1] != b"{":
            raise encode_error(self.name, obj, "a Faust record is a JSON object")
        return self._prefix + (b"}" if body == b"{}" else b"," + body[1:])

    def loads(self, data: Bytes | None) -> Any:
        """Decode a record with or without Faust's key into ``cls``."""
        if data is None:
            return None
        if self._direct:
            try:
                return self._inner.loads(data)
            except DecodeError:
                if not self._retry:
                    raise
        return self._loads_without_metadata(data)

    def _loads_without_metadata(self, data: Bytes) -> Any:
        inner = self._inner
        if isinstance(inner, DataclassJson):  # never: it drops the key itself
            return inner.loads(data)
        try:
            payload = msgspec.json.decode(check_bytes(self.name, data))
        except (ValueError, RecursionError) as exc:  # (DecodeError, and UnicodeDecodeError
            # for invalid UTF-8 inside a JSON string: msgspec raises that one as it is)
            raise decode_error(self.name, data, str(exc), self.cls.__qualname__) from exc
        return inner.loads_from(msgspec.json.encode(_without_metadata(payload)), data)

    def _options(self) -> tuple[object, ...]:
        return (self.cls, self.namespace, self.write_metadata, self.ignore_unknown)

    def __eq__(self, other: object) -> bool:
        """Codecs of the same type and options are the same codec."""
        return isinstance(other, FaustRecord) and other._options() == self._options()

    def __hash__(self) -> int:
        return hash((FaustRecord, *self._options()))

    def __repr__(self) -> str:
        return f"FaustRecord({self.cls.__qualname__}, namespace={self.namespace!r})"
