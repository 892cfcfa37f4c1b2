"""Faust's record format: what Faust producers write is read into dataclasses, Structs and
pydantic models, and what FaustRecord writes carries Faust's namespace."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamjoin.codecs import DataclassJson, resolve_codec
from streamjoin.errors import ArgumentTypeError, ConfigurationError, DecodeError, EncodeError
from streamjoin.faust_records import FaustRecord

pydantic = pytest.importorskip("pydantic")  # the "pydantic" extra, in the test extra too

#: as a Faust producer writes a ``Withdrawal(faust.Record)`` holding a nested ``Place``
#: record (Faust's JSON: default separators, fields in declaration order, each record's
#: namespace last)
FAUST_WITHDRAWAL = (
    b'{"user": "ada", "country": "NO", "amount": 10.5, "date": "2026-11-27T12:00:00+00:00", '
    b'"place": {"city": "Oslo", "__faust": {"ns": "withdrawals.Place"}}, '
    b'"__faust": {"ns": "withdrawals.Withdrawal"}}'
)
WHEN = datetime(2026, 11, 27, 12, tzinfo=timezone.utc)


@dataclass
class DcPlace:
    city: str


@dataclass
class DcWithdrawal:
    user: str
    country: str
    amount: float
    date: datetime
    place: DcPlace | None = None


class SPlace(msgspec.Struct):
    city: str


class SWithdrawal(msgspec.Struct):
    user: str
    country: str
    amount: float
    date: datetime
    place: SPlace | None = None


class StrictPlace(msgspec.Struct, forbid_unknown_fields=True):
    city: str


class StrictWithdrawal(msgspec.Struct, forbid_unknown_fields=True):
    user: str
    country: str
    amount: float
    date: datetime
    place: StrictPlace | None = None


class LoosePlace(msgspec.Struct):
    city: str


class NestedStrict(msgspec.Struct):
    """Ignores unknown fields itself; its nested record does not."""

    user: str
    country: str
    amount: float
    date: datetime
    place: StrictPlace | None = None


class PPlace(pydantic.BaseModel):
    city: str


class PWithdrawal(pydantic.BaseModel):
    user: str
    country: str
    amount: float
    date: datetime
    place: PPlace | None = None


class PStrictWithdrawal(PWithdrawal):
    model_config = pydantic.ConfigDict(extra="forbid")


class PAllowWithdrawal(PWithdrawal):
    model_config = pydantic.ConfigDict(extra="allow")


class Empty(msgspec.Struct):
    pass


READERS: list[tuple[type, Any]] = [
    (DcWithdrawal, DcWithdrawal("ada", "NO", 10.5, WHEN, DcPlace("Oslo"))),
    (SWithdrawal, SWithdrawal("ada", "NO", 10.5, WHEN, SPlace("Oslo"))),
    (StrictWithdrawal, StrictWithdrawal("ada", "NO", 10.5, WHEN, StrictPlace("Oslo"))),
    (NestedStrict, NestedStrict("ada", "NO", 10.5, WHEN, StrictPlace("Oslo"))),
    (
        PWithdrawal,
        PWithdrawal(user="ada", country="NO", amount=10.5, date=WHEN, place=PPlace(city="Oslo")),
    ),
    (
        PStrictWithdrawal,
        PStrictWithdrawal(
            user="ada", country="NO", amount=10.5, date=WHEN, place=PPlace(city="Oslo")
        ),
    ),
    (
        PAllowWithdrawal,
        PAllowWithdrawal(
            user="ada", country="NO", amount=10.5, date=WHEN, place=PPlace(city="Oslo")
        ),
    ),
]


@pytest.mark.parametrize(("cls", "expected"), READERS, ids=lambda v: getattr(v, "__name__", ""))
def test_reads_what_a_faust_producer_writes(cls: type, expected: Any) -> None:
    got = FaustRecord(cls).loads(FAUST_WITHDRAWAL)
    assert got == expected
    assert "__faust" not in (getattr(got, "model_extra", None) or {})


@pytest.mark.parametrize(("cls", "expected"), READERS, ids=lambda v: getattr(v, "__name__", ""))
def test_reads_records_without_the_namespace_too(cls: type, expected: Any) -> None:
    plain = json.dumps(
        {
            "user": "ada",
            "country": "NO",
            "amount": 10.5,
            "date": WHEN.isoformat(),
            "place": {"city": "Oslo"},
        }
    ).encode()
    assert FaustRecord(cls).loads(plain) == expected


@pytest.mark.parametrize(("cls", "expected"), READERS, ids=lambda v: getattr(v, "__name__", ""))
def test_writes_the_namespace_first_and_reads_its_own_records(cls: type, expected: Any) -> None:
    codec = FaustRecord(cls, namespace="withdrawals.Withdrawal")
    data = codec.dumps(expected)
    assert data is not None and data.startswith(b'{"__faust":{"ns":"withdrawals.Withdrawal"},')
    written = json.loads(data)
    assert written["__faust"] == {"ns": "withdrawals.Withdrawal"}
    assert written["user"] == "ada" and written["place"]["city"] == "Oslo"
    assert codec.loads(data) == expected


def test_the_default_namespace_is_module_and_qualname_as_faust_names_models() -> None:
    codec = FaustRecord(SWithdrawal)
    assert codec.namespace == f"{__name__}.SWithdrawal"
    assert codec.name == "faust[SWithdrawal]"
    data = codec.dumps(SWithdrawal("a", "b", 1.0, WHEN))
    assert data is not None
    assert json.loads(data)["__faust"] == {"ns": f"{__name__}.SWithdrawal"}


def test_write_metadata_false_writes_the_fields_alone() -> None:
    codec = FaustRecord(SPlace, write_metadata=False)
    assert codec.dumps(SPlace("Oslo")) == b'{"city":"Oslo"}'
    assert codec.dumps(None) is None and codec.loads(None) is None


def test_an_empty_record_is_still_an_object() -> None:
    codec = FaustRecord(Empty, namespace="e.Empty")
    assert codec.dumps(Empty()) == b'{"__faust":{"ns":"e.Empty"}}'
    assert codec.loads(b'{"__faust":{"ns":"e.Empty"}}') == Empty()


def test_the_namespace_is_json_escaped() -> None:
    codec = FaustRecord(Empty, namespace='a"b')
    data = codec.dumps(Empty())
    assert data is not None and json.loads(data) == {"__faust": {"ns": 'a"b'}}


def test_a_record_that_does_not_fit_names_the_field_after_the_retry() -> None:
    bad = FAUST_WITHDRAWAL.replace(b'"amount": 10.5', b'"amount": "lots"')
    for cls in (SWithdrawal, StrictWithdrawal, NestedStrict):
        with pytest.raises(DecodeError, match=rf"{cls.__name__}\.amount: Expected `float`"):
            FaustRecord(cls).loads(bad)
    with pytest.raises(DecodeError, match=r"DcWithdrawal\.amount: expected a number"):
        FaustRecord(DcWithdrawal).loads(bad)
    with pytest.raises(DecodeError, match=r"PStrictWithdrawal\.amount: Input should be"):
        FaustRecord(PStrictWithdrawal).loads(bad)
    with pytest.raises(DecodeError) as failed:
        FaustRecord(StrictWithdrawal).loads(bad)
    assert str(failed.value).startswith(
        f"json[StrictWithdrawal] codec could not decode {len(bad)} bytes"
    )


def test_unknown_fields_other_than_the_namespace() -> None:
    extra = FAUST_WITHDRAWAL.replace(b'"user": "ada"', b'"user": "ada", "branch": 3')
    with pytest.raises(DecodeError, match=r"DcWithdrawal: unknown field\(s\): 'branch'"):
        FaustRecord(DcWithdrawal).loads(extra)
    assert FaustRecord(DcWithdrawal, ignore_unknown=True).loads(extra) == READERS[0][1]
    assert FaustRecord(SWithdrawal).loads(extra) == READERS[1][1]  # msgspec's default
    with pytest.raises(DecodeError, match="unknown field `branch`"):
        FaustRecord(StrictWithdrawal).loads(extra)


def test_ignore_unknown_against_a_type_that_forbids_them_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="forbid_unknown_fields=True; change that"):
        FaustRecord(StrictWithdrawal, ignore_unknown=True)
    with pytest.raises(ConfigurationError, match="extra='forbid'"):
        FaustRecord(PStrictWithdrawal, ignore_unknown=True)
    assert FaustRecord(SWithdrawal, ignore_unknown=True).loads(FAUST_WITHDRAWAL) == READERS[1][1]


class AsArray(msgspec.Struct, array_like=True):
    a: int


def test_bad_arguments() -> None:
    with pytest.raises(ArgumentTypeError, match="FaustRecord needs a dataclass"):
        FaustRecord(int)
    with pytest.raises(ConfigurationError, match="array_like Struct is written as a JSON array"):
        FaustRecord(AsArray)
    with pytest.raises(ConfigurationError, match="namespace must be a non-empty str"):
        FaustRecord(SPlace, namespace="")
    with pytest.raises(ArgumentTypeError, match="expects bytes, got str"):
        FaustRecord(StrictWithdrawal).loads('{"a": 1}')  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match=r"json\[SPlace\] codec could not encode int"):
        FaustRecord(SPlace).dumps(3)


def test_equal_options_make_equal_codecs() -> None:
    assert FaustRecord(SPlace) == FaustRecord(SPlace)
    assert hash(FaustRecord(SPlace)) == hash(FaustRecord(SPlace))
    assert FaustRecord(SPlace) != FaustRecord(SPlace, namespace="other.Place")
    assert FaustRecord(SPlace) != FaustRecord(SPlace, write_metadata=False)
    codec = FaustRecord(DcPlace, namespace="p.Place")
    assert resolve_codec(codec) is codec
    assert repr(codec) == "FaustRecord(DcPlace, namespace='p.Place')"


def test_the_dataclass_codec_alone_still_refuses_faust_records() -> None:
    """What issue 35 found porting Faust's examples; FaustRecord is the fix."""
    with pytest.raises(DecodeError, match=r"DcWithdrawal: unknown field\(s\): '__faust'"):
        DataclassJson(DcWithdrawal).loads(FAUST_WITHDRAWAL)


@settings(print_blob=True)
@given(st.binary(max_size=64))
@example(b'"\x80"')  # invalid UTF-8 in a string: msgspec raises UnicodeDecodeError
@pytest.mark.parametrize(
    "codec",
    [
        FaustRecord(DcWithdrawal),
        FaustRecord(SWithdrawal),
        FaustRecord(StrictWithdrawal),
        FaustRecord(PStrictWithdrawal),
    ],
    ids=repr,
)
def test_decoding_arbitrary_bytes_only_ever_raises_decode_error(codec: Any, data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        codec.loads(data)
