"""Codecs: round trips, null records, every error path, and the name registry."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import shutil
import tracemalloc
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Literal, Optional

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from streamjoin import codecs
from streamjoin.codecs import (
    JSON,
    RAW,
    STR,
    Codec,
    DataclassJson,
    register_codec,
    registered_codec_names,
    resolve_codec,
)
from streamjoin.errors import CodecError, DecodeError, EncodeError
from streamjoin.native import native_function

# -- fixtures and schema ---------------------------------------------------------------------


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registrations made by a test do not leak into the others."""
    monkeypatch.setattr(codecs, "_REGISTRY", dict(codecs._REGISTRY))
    yield


class Status(enum.Enum):
    NEW = "new"
    PAID = "paid"


@dataclass
class Address:
    street: str
    city: str
    zip: Optional[str] = None  # noqa: UP045 - Optional[...] is part of what is under test


@dataclass
class Line:
    sku: str
    qty: int
    price: float


@dataclass
class Order:
    id: str
    lines: list[Line]
    status: Status
    created: datetime
    ship_to: Optional[Address] = None  # noqa: UP045
    bill_to: Address | None = None
    tags: dict[str, int] = field(default_factory=dict)
    dims: tuple[int, ...] = ()
    note: str = ""


@dataclass
class Tree:
    value: int
    children: list[Tree] = field(default_factory=list)


@dataclass
class Exotic:
    by_id: dict[int, Line]
    pair: tuple[str, int]
    kind: Literal["a", "b"]
    ids: set[uuid.UUID]
    amount: Decimal
    day: date
    either: int | str
    anything: Any = None


@dataclass
class Positive:
    n: int

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError("n must be positive")


@dataclass
class WithDerived:
    a: int
    doubled: int = field(init=False)

    def __post_init__(self) -> None:
        self.doubled = self.a * 2


# -- strategies ------------------------------------------------------------------------------

finite_floats = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | finite_floats | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=25,
)
addresses = st.builds(Address, st.text(), st.text(), st.none() | st.text())
orders = st.builds(
    Order,
    id=st.text(),
    lines=st.lists(st.builds(Line, st.text(), st.integers(), finite_floats), max_size=4),
    status=st.sampled_from(Status),
    created=st.datetimes(timezones=st.none() | st.just(timezone.utc)),
    ship_to=st.none() | addresses,
    bill_to=st.none() | addresses,
    tags=st.dictionaries(st.text(), st.integers(), max_size=3),
    dims=st.lists(st.integers(), max_size=3).map(tuple),
    note=st.text(),
)


def _sample_order() -> Order:
    return Order(
        "o-1",
        [Line("a", 2, 1.5)],
        Status.NEW,
        datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        ship_to=Address("1 Main St", "Oslo"),
    )


# -- RAW -------------------------------------------------------------------------------------


def test_raw_passes_bytes_through_and_encodes_str_as_utf8() -> None:
    assert RAW.name == "raw"
    assert RAW.dumps(b"\x00\xff") == b"\x00\xff"
    assert RAW.dumps("héllo") == "héllo".encode()
    assert RAW.dumps(bytearray(b"ab")) == b"ab"
    assert RAW.dumps(memoryview(b"ab")) == b"ab"
    assert RAW.loads(b"\x00\xff") == b"\x00\xff"
    assert type(RAW.loads(bytearray(b"ab"))) is bytes


def test_raw_keeps_none_for_null_keys_and_tombstones() -> None:
    assert RAW.dumps(None) is None
    assert RAW.loads(None) is None


@given(st.binary())
def test_raw_round_trips_any_bytes(data: bytes) -> None:
    assert RAW.loads(RAW.dumps(data)) == data


def test_raw_refuses_other_types() -> None:
    with pytest.raises(EncodeError, match=r"^raw codec could not encode int: expected bytes, str"):
        RAW.dumps(42)


def test_raw_refuses_unencodable_text() -> None:
    with pytest.raises(EncodeError, match=r"^raw codec could not encode str: .*surrogate"):
        RAW.dumps("\ud800")


def test_loads_of_a_non_bytes_object_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="raw codec loads\\(\\) expects bytes, got str"):
        RAW.loads("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="json codec loads\\(\\) expects bytes, got int"):
        JSON.loads(1)  # type: ignore[arg-type]


# -- STR -------------------------------------------------------------------------------------


@given(st.text())
def test_str_round_trips_text(text: str) -> None:
    assert STR.loads(STR.dumps(text)) == text


def test_str_none_and_type_errors() -> None:
    assert STR.name == "str"
    assert STR.dumps(None) is None
    assert STR.loads(None) is None
    with pytest.raises(EncodeError, match=r"^str codec could not encode bytes: expected str"):
        STR.dumps(b"abc")


def test_str_invalid_utf8_is_a_decode_error() -> None:
    with pytest.raises(DecodeError) as info:
        STR.loads(b"ok\xffno")
    assert str(info.value).startswith("str codec could not decode 5 bytes into str: 'utf-8' codec")
    assert str(info.value).endswith("payload starts b'ok\\xffno'")


# -- JSON ------------------------------------------------------------------------------------


@settings(print_blob=True)
@given(json_values)
def test_json_round_trips_json_values(value: Any) -> None:
    assert JSON.loads(JSON.dumps(value)) == value


def test_json_is_compact_utf8() -> None:
    assert JSON.name == "json"
    assert JSON.dumps({"a": [1, 2], "é": None}) == '{"a":[1,2],"é":null}'.encode()


def test_json_none_is_a_null_record_not_the_json_literal() -> None:
    assert JSON.dumps(None) is None
    assert JSON.loads(None) is None
    # A payload that *is* the JSON literal still decodes (another producer may write it).
    assert JSON.loads(b"null") is None


def test_json_encodes_common_python_types() -> None:
    when = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    ident = uuid.UUID(int=1)
    encoded = JSON.dumps(
        {
            "when": when,
            "day": date(2024, 5, 6),
            "status": Status.PAID,
            "id": ident,
            "amount": Decimal("1.10"),
            "set": {3},
            "line": Line("s", 1, 2.5),
        }
    )
    assert encoded is not None
    assert json.loads(encoded) == {
        "when": "2024-05-06T07:08:09+00:00",
        "day": "2024-05-06",
        "status": "paid",
        "id": str(ident),
        "amount": "1.10",
        "set": [3],
        "line": {"sku": "s", "qty": 1, "price": 2.5},
    }


def test_json_garbage_is_a_decode_error_naming_codec_size_cause_and_payload() -> None:
    with pytest.raises(DecodeError) as info:
        JSON.loads(b"not json at all!!")
    assert str(info.value) == (
        "json codec could not decode 17 bytes: Expecting value: line 1 column 1 (char 0); "
        "payload starts b'not json at all!!'"
    )


def test_json_long_payloads_are_truncated_in_errors() -> None:
    with pytest.raises(DecodeError, match=r"payload starts b'\\xff\\x00x{30}'\.\.\.$"):
        JSON.loads(b"\xff\x00" + b"x" * 100)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\x00",  # not UTF-8
        '{"a": 1}'.encode("utf-16"),  # json.loads(bytes) would accept this; Kafka peers would not
        b"",
        b"{",
        b"[" * 100_000,  # RecursionError inside the json module
        b"1" * 5000,  # int() digit limit (ValueError)
    ],
)
def test_json_decode_failures_are_decode_errors(payload: bytes) -> None:
    with pytest.raises(DecodeError, match=rf"^json codec could not decode {len(payload)} bytes: "):
        JSON.loads(payload)


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        (float("nan"), "Out of range float values are not JSON compliant"),
        (object(), "Object of type object is not JSON serializable"),
        ({"s": "\udc80"}, "surrogate"),
    ],
)
def test_json_encode_failures_are_encode_errors(value: Any, cause: str) -> None:
    with pytest.raises(EncodeError, match=rf"^json codec could not encode \w+: .*{cause}"):
        JSON.dumps(value)


def test_json_circular_structures_are_encode_errors() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(EncodeError, match="Circular reference"):
        JSON.dumps(loop)


@settings(print_blob=True)
@given(st.binary(max_size=64))
@pytest.mark.parametrize("codec", [JSON, STR, RAW, DataclassJson(Order)], ids=repr)
def test_decoding_arbitrary_bytes_only_ever_raises_decode_error(codec: Codec, data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        codec.loads(data)


def test_codec_errors_are_value_errors() -> None:
    assert issubclass(EncodeError, CodecError)
    assert issubclass(DecodeError, CodecError)
    assert issubclass(CodecError, ValueError)


# -- DataclassJson ---------------------------------------------------------------------------


@settings(print_blob=True)
@given(orders)
def test_dataclass_json_round_trips_nested_dataclasses(order: Order) -> None:
    codec = DataclassJson(Order)
    assert codec.loads(codec.dumps(order)) == order


@settings(print_blob=True)
@given(orders)
def test_dataclass_json_writes_the_bytes_of_its_fields_deep_copied_first(order: Order) -> None:
    """Encoding reads the fields without ``dataclasses.asdict``'s deep copy: the bytes are
    the same (keys are partitioned, and stored results compared, by them)."""
    codec = DataclassJson(Order)
    assert codec.dumps(order) == codecs._json_dumps(codec.name, dataclasses.asdict(order))


def test_dataclass_json_writes_the_same_bytes_for_exotic_and_recursive_values() -> None:
    exotic = Exotic(
        {7: Line("a", 1, 1e-7)},
        ("x", 1),
        "b",
        {uuid.UUID(int=5)},
        Decimal("0.10"),
        date(2020, 2, 29),
        "text",
        {"free": [Line("b", 2, 2.5)]},
    )
    tree = Tree(1, [Tree(2, [Tree(3)]), Tree(4)])
    for codec, value in ((DataclassJson(Exotic), exotic), (DataclassJson(Tree), tree)):
        assert codec.dumps(value) == codecs._json_dumps(codec.name, dataclasses.asdict(value))
    # what the encoder cannot write is refused with its words, as before
    for bad in (object(), b"bytes", float("nan")):
        with pytest.raises(EncodeError, match=r"json\[Exotic\] codec could not encode"):
            DataclassJson(Exotic).dumps(dataclasses.replace(exotic, anything=bad))


def test_dataclass_json_rebuilds_nested_types() -> None:
    codec = DataclassJson(Order)
    created = datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=timezone.utc)
    order = Order(
        "o-1",
        [Line("a", 2, 1.5)],
        Status.NEW,
        created,
        ship_to=Address("1 Main St", "Oslo"),
        dims=(1, 2),
    )
    data = codec.dumps(order)
    assert data is not None
    payload = json.loads(data)
    assert payload["created"] == "2024-01-02T03:04:05.600000+00:00"
    assert payload["status"] == "new"
    decoded = codec.loads(data)
    assert decoded == order
    assert isinstance(decoded.lines[0], Line)
    assert isinstance(decoded.ship_to, Address)
    assert decoded.bill_to is None
    assert decoded.created == created
    assert decoded.status is Status.NEW
    assert decoded.dims == (1, 2)


def test_dataclass_json_ints_are_accepted_for_float_fields() -> None:
    line = DataclassJson(Line).loads(b'{"sku":"a","qty":1,"price":3}')
    assert line == Line("a", 1, 3.0)
    assert type(line.price) is float


def test_dataclass_json_exotic_field_types() -> None:
    codec = DataclassJson(Exotic)
    value = Exotic(
        by_id={7: Line("a", 1, 1.0)},
        pair=("x", 1),
        kind="b",
        ids={uuid.UUID(int=5)},
        amount=Decimal("0.10"),
        day=date(2020, 2, 29),
        either="text",
        anything={"free": ["form"]},
    )
    assert codec.loads(codec.dumps(value)) == value
    assert codec.loads(codec.dumps(Exotic({}, ("y", 2), "a", set(), Decimal(1), date.min, 3))) == (
        Exotic({}, ("y", 2), "a", set(), Decimal(1), date.min, 3)
    )


def test_dataclass_json_recursive_dataclass() -> None:
    codec = DataclassJson(Tree)
    tree = Tree(1, [Tree(2, [Tree(3)]), Tree(4)])
    decoded = codec.loads(codec.dumps(tree))
    assert decoded == tree
    assert isinstance(decoded.children[0].children[0], Tree)


def test_dataclass_json_init_false_fields_are_written_and_recomputed() -> None:
    codec = DataclassJson(WithDerived)
    assert codec.dumps(WithDerived(2)) == b'{"a":2,"doubled":4}'
    assert codec.loads(b'{"a":2,"doubled":999}').doubled == 4
    assert codec.loads(b'{"a":3}').doubled == 6


def test_dataclass_json_accepts_plain_dicts_and_none() -> None:
    codec = DataclassJson(Line)
    assert codec.dumps({"sku": "a", "qty": 1, "price": 2.0}) == b'{"price":2.0,"qty":1,"sku":"a"}'
    assert codec.dumps(None) is None
    assert codec.loads(None) is None


def test_dataclass_json_refuses_other_objects() -> None:
    with pytest.raises(
        EncodeError, match=r"^json\[Line\] codec could not encode Address: expected Line, a dict"
    ):
        DataclassJson(Line).dumps(Address("s", "c"))
    with pytest.raises(EncodeError, match=r"^json\[Line\] codec could not encode list"):
        DataclassJson(Line).dumps([1])


def test_dataclass_json_unknown_fields_are_named() -> None:
    with pytest.raises(DecodeError) as info:
        DataclassJson(Line).loads(b'{"sku":"a","qty":1,"price":2,"colour":"red","size":9}')
    message = str(info.value)
    assert message.startswith(
        "json[Line] codec could not decode 53 bytes into Line: "
        "Line: unknown field(s): 'colour', 'size'; payload starts b'"
    )


def test_dataclass_json_ignore_unknown_drops_unknown_fields_at_every_level() -> None:
    codec = DataclassJson(Order, ignore_unknown=True)
    payload = json.loads(DataclassJson(Order).dumps(_sample_order()) or b"")
    payload["extra"] = 1
    payload["ship_to"]["floor"] = 3
    assert codec.loads(json.dumps(payload).encode()) == _sample_order()
    with pytest.raises(DecodeError, match=r"Order: unknown field\(s\): 'extra'"):
        DataclassJson(Order).loads(json.dumps(payload).encode())
    with pytest.raises(DecodeError, match="missing required field"):  # still checked
        codec.loads(b'{"extra": 1}')


def test_dataclass_json_ignore_keys_are_dropped_wherever_they_appear() -> None:
    codec = DataclassJson(Address, ignore_keys=["meta"])
    assert codec.loads(b'{"street":"s","city":"c","meta":{}}') == Address("s", "c")
    with pytest.raises(DecodeError, match=r"Address: unknown field\(s\): 'other'"):
        codec.loads(b'{"street":"s","city":"c","meta":{},"other":1}')
    with pytest.raises(TypeError, match="ignore_keys must be a list of names"):
        DataclassJson(Address, ignore_keys="meta")


def test_dataclass_json_options_are_part_of_the_codec() -> None:
    assert DataclassJson(Address) == DataclassJson(Address)
    assert DataclassJson(Address) != DataclassJson(Address, ignore_unknown=True)
    assert hash(DataclassJson(Address, ignore_keys=["a"])) == hash(
        DataclassJson(Address, ignore_keys=("a",))
    )
    assert repr(DataclassJson(Address, ignore_unknown=True, ignore_keys=["m"])) == (
        "DataclassJson(Address, ignore_unknown=True, ignore_keys=['m'])"
    )


def test_dataclass_json_missing_required_fields_are_named() -> None:
    with pytest.raises(DecodeError, match=r"Line: missing required field\(s\): 'price', 'qty';"):
        DataclassJson(Line).loads(b'{"sku":"a"}')


def test_dataclass_json_errors_give_the_path_into_nested_values() -> None:
    codec = DataclassJson(Order)
    base = '{"id":"o","status":"new","created":"2024-01-01T00:00:00","lines":%s}'
    cases = {
        '[{"sku":"a","qty":1}]': r"Order\.lines\[0\]: missing required field\(s\) of Line: 'price'",
        '[{"sku":"a","qty":"1","price":1}]': r"Order\.lines\[0\]\.qty: expected an integer, got",
        '[{"sku":"a","qty":true,"price":1}]': r"Order\.lines\[0\]\.qty: expected an integer",
        '{"sku":"a"}': r"Order\.lines: expected an array, got object",
        "[7]": r"Order\.lines\[0\]: expected an object of Line, got int",
    }
    for lines, expected in cases.items():
        with pytest.raises(DecodeError, match=expected):
            codec.loads((base % lines).encode())


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"[]", r"Order: expected an object, got array"),
        (b'"x"', r"Order: expected an object, got string"),
        (
            b'{"id":"o","lines":[],"status":"lost","created":"2024-01-01"}',
            r"Order\.status: 'lost' is not a valid Status",
        ),
        (
            b'{"id":"o","lines":[],"status":"new","created":"yesterday"}',
            r"Order\.created: invalid datetime 'yesterday'",
        ),
        (
            b'{"id":"o","lines":[],"status":"new","created":1700000000}',
            r"Order\.created: expected a datetime string, got int",
        ),
        (
            b'{"id":"o","lines":[],"status":"new","created":"2024-01-01","ship_to":{"street":"s"}}',
            r"Order\.ship_to: missing required field\(s\) of Address: 'city'",
        ),
        (
            b'{"id":"o","lines":[],"status":"new","created":"2024-01-01","tags":{"a":"b"}}',
            r"Order\.tags\['a'\]: expected an integer, got 'b'",
        ),
    ],
)
def test_dataclass_json_schema_mismatches(payload: bytes, expected: str) -> None:
    with pytest.raises(DecodeError, match=rf"^json\[Order\] codec could not decode .* {expected}"):
        DataclassJson(Order).loads(payload)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"{}", r"Exotic: missing required field\(s\): 'amount', 'by_id', 'day', 'either', "),
        (b'{"x":1}', r"Exotic: unknown field\(s\): 'x'"),
        (
            b'{"by_id":{"one":null},"pair":["a",1],"kind":"a","ids":[],"amount":"1",'
            b'"day":"2020-01-01","either":1}',
            r"Exotic\.by_id: expected an integer key, got 'one'",
        ),
        (
            b'{"by_id":{},"pair":["a",1,2],"kind":"a","ids":[],"amount":"1",'
            b'"day":"2020-01-01","either":1}',
            r"Exotic\.pair: expected an array of 2 items",
        ),
        (
            b'{"by_id":{},"pair":["a",1],"kind":"c","ids":[],"amount":"1",'
            b'"day":"2020-01-01","either":1}',
            r"Exotic\.kind: expected one of \['a', 'b'\], got 'c'",
        ),
        (
            b'{"by_id":{},"pair":["a",1],"kind":"a","ids":["nope"],"amount":"1",'
            b'"day":"2020-01-01","either":1}',
            r"Exotic\.ids\[0\]: invalid UUID 'nope'",
        ),
        (
            b'{"by_id":{},"pair":["a",1],"kind":"a","ids":[],"amount":"lots",'
            b'"day":"2020-01-01","either":1}',
            r"Exotic\.amount: invalid Decimal 'lots'",
        ),
        (
            b'{"by_id":{},"pair":["a",1],"kind":"a","ids":[],"amount":"1",'
            b'"day":"2020-01-01","either":1.5}',
            r"Exotic\.either: no type of the union fits: expected an integer, got 1\.5; "
            r"expected a string, got 1\.5",
        ),
    ],
)
def test_dataclass_json_exotic_mismatches(payload: bytes, expected: str) -> None:
    with pytest.raises(DecodeError, match=expected):
        DataclassJson(Exotic).loads(payload)


def test_dataclass_json_post_init_failures_are_decode_errors() -> None:
    with pytest.raises(
        DecodeError, match=r"Positive: Positive\(\.\.\.\) raised ValueError: n must be positive"
    ):
        DataclassJson(Positive).loads(b'{"n":-1}')


def test_dataclass_json_garbage_and_deep_nesting_are_decode_errors() -> None:
    with pytest.raises(
        DecodeError, match=r"^json\[Tree\] codec could not decode 3 bytes into Tree"
    ):
        DataclassJson(Tree).loads(b"\x00\x01\x02")
    deep = b'{"value":1,"children":[' * 3000 + b'{"value":1}' + b"]}" * 3000
    with pytest.raises(DecodeError, match=r"^json\[Tree\] codec could not decode"):
        DataclassJson(Tree).loads(deep)


def test_dataclass_json_needs_a_dataclass_type() -> None:
    with pytest.raises(TypeError, match="DataclassJson needs a dataclass type, got <class 'int'>"):
        DataclassJson(int)
    with pytest.raises(TypeError, match="needs a dataclass type"):
        DataclassJson(Line("a", 1, 1.0))  # type: ignore[arg-type]


def test_dataclass_json_unresolvable_hints_fail_at_declaration() -> None:
    @dataclass
    class Local:
        other: Missing  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(TypeError, match=r"cannot read the type hints of dataclass .*Local"):
        DataclassJson(Local)


# -- registry --------------------------------------------------------------------------------


class Upper:
    """A user codec: ASCII text stored upper-cased."""

    name = "upper"

    def dumps(self, obj: Any) -> bytes | None:
        return None if obj is None else str(obj).upper().encode("ascii")

    def loads(self, data: bytes) -> Any:
        return data.decode("ascii")


def test_builtins_are_registered() -> None:
    assert registered_codec_names() == ["json", "raw", "str"]
    assert resolve_codec("raw") is RAW
    assert resolve_codec("str") is STR
    assert resolve_codec("json") is JSON


def test_resolve_codec_none_uses_the_default() -> None:
    assert resolve_codec(None) is RAW
    assert resolve_codec(None, default="json") is JSON
    with pytest.raises(ValueError, match="unknown codec 'nope'"):
        resolve_codec(None, default="nope")


def test_resolve_codec_unknown_name_lists_registered_names() -> None:
    with pytest.raises(ValueError) as info:
        resolve_codec("avro")
    assert str(info.value) == "unknown codec 'avro'; registered codecs: json, raw, str"


def test_resolve_codec_instances_types_and_shortcuts() -> None:
    upper = Upper()
    assert resolve_codec(upper) is upper
    codec = resolve_codec(Order)
    assert isinstance(codec, DataclassJson)
    assert codec.cls is Order
    assert codec.name == "json[Order]"
    assert resolve_codec(bytes) is RAW
    assert resolve_codec(str) is STR


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (int, "cannot make a codec from class int"),
        (Upper, "cannot make a codec from class Upper"),  # the class, not an instance
        (3, "expected a codec name, a codec instance or a record type .*, got int"),
    ],
)
def test_resolve_codec_rejects_other_specs(spec: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        resolve_codec(spec)


@pytest.mark.usefixtures("isolated_registry")
def test_register_codec_makes_it_resolvable_by_name() -> None:
    upper = Upper()
    register_codec(upper)
    assert resolve_codec("upper") is upper
    assert "upper" in registered_codec_names()
    assert upper.dumps("abc") == b"ABC"


@pytest.mark.usefixtures("isolated_registry")
def test_register_codec_duplicate_names_need_replace() -> None:
    register_codec(Upper())
    with pytest.raises(ValueError, match="a codec named 'upper' is already registered"):
        register_codec(Upper())
    with pytest.raises(ValueError, match="pass replace=True"):
        register_codec(type("FakeJson", (Upper,), {"name": "json"})())
    replacement = Upper()
    register_codec(replacement, replace=True)
    assert resolve_codec("upper") is replacement


@pytest.mark.usefixtures("isolated_registry")
def test_register_dataclass_codec_under_its_name() -> None:
    register_codec(DataclassJson(Line))
    assert isinstance(resolve_codec("json[Line]"), DataclassJson)


@pytest.mark.usefixtures("isolated_registry")
@pytest.mark.parametrize(
    ("candidate", "message"),
    [
        (object(), "expected a codec instance with name, dumps and loads"),
        (Upper, "expected a codec instance"),
        (type("Nameless", (Upper,), {"name": ""})(), "codec name must be a non-empty str"),
        (type("NumName", (Upper,), {"name": 5})(), "codec name must be a non-empty str"),
    ],
)
def test_register_codec_rejects_non_codecs(candidate: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        register_codec(candidate)
    assert registered_codec_names() == ["json", "raw", "str"]


def test_isolated_registry_fixture_does_not_leak() -> None:
    assert "upper" not in registered_codec_names()


def test_json_bytes_do_not_depend_on_insertion_order() -> None:
    """Keys encoded as JSON must partition the same whatever order the dict was built in."""
    from streamjoin.codecs import JSON

    assert JSON.dumps({"b": 1, "a": 2}) == JSON.dumps({"a": 2, "b": 1}) == b'{"a":2,"b":1}'


# -- the msgspec fast paths give what the standard library gives ----------------------------

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def _stdlib_bytes(obj: object) -> bytes:
    return json.dumps(
        obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
    ).encode()


@settings(max_examples=400, deadline=None)
@given(_json_values)
def test_json_encodes_exactly_as_the_standard_library(obj: object) -> None:
    """Key bytes decide partitions: the fast path must not change a single byte."""
    assume(obj is not None)  # (None is a null record, not b"null")
    codec = codecs.JsonCodec()
    try:
        expected = _stdlib_bytes(obj)
    except UnicodeEncodeError:  # lone surrogates: refused either way
        with pytest.raises(EncodeError):
            codec.dumps(obj)
        return
    assert codec.dumps(obj) == expected


class _Label(str):
    pass


@pytest.mark.parametrize(
    "obj",
    [
        {_Label("b"): 1, "a": 2},  # a str subclass key: left to the encoder
        {1: "x", 2: None},  # int keys: the encoder writes them as strings
        {True: 1},
        {"a": 1.5, "b": 1e-05},  # a float repr writes with an exponent: left to the encoder
        [1, "x", None, 2.5, 1e16],
        # floats at the edges of the range msgspec writes as repr does
        {"a": 1e-4, "b": 9.999999999999999e-05, "c": -1e-4, "d": -0.0, "e": 0.0},
        {"a": 9999999999999998.0, "b": 1e16, "c": -9999999999999998.0, "d": 5e-324},
        [0.1, 2.5, -1234567.125, 1e-4, 9.999999999999999e-05, 1e16, 9999999999999998.0],
    ],
)
def test_json_dicts_and_lists_outside_the_fast_path_encode_as_the_standard_library(
    obj: object,
) -> None:
    assert codecs.JsonCodec().dumps(obj) == _stdlib_bytes(obj)


class _Count(int):
    pass


_odd_scalars = st.sampled_from(
    [_Label("x"), _Count(3), 1e16, -1e16, 1e-5, -1e-5, 5e-324, float("nan"), float("inf"), b"b"]
)
_plain_candidates = st.recursive(
    _json_scalars | _odd_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text() | st.integers() | st.builds(_Label, st.text()), inner, max_size=4
        )
        | st.tuples(inner)
    ),
    max_leaves=8,
)


@settings(max_examples=500, deadline=None)
@given(_plain_candidates)
def test_the_compiled_and_pure_plain_json_checks_agree(obj: object) -> None:
    """Which values go to msgspec: the compiled check (native/) and its pure twin."""
    compiled = native_function("plain_json")
    expected = codecs.pure_plain_json(obj)
    if compiled is not None:
        assert compiled(obj) is expected
    assert codecs.plain_json(obj) is expected


@pytest.mark.parametrize(
    ("obj", "plain"),
    [
        ({"a": 1, "b": "x", "c": None, "d": True, "e": 2.5, "f": 0.0, "g": -1e-4}, True),
        ([1, "x", None, False, 9999999999999998.0], True),
        ({}, True),
        ([], True),
        ({"a": 1e16}, False),
        ({"a": 1e-5}, False),
        ({"a": float("nan")}, False),
        ({1: "x"}, False),
        ({_Label("a"): 1}, False),
        ({"a": _Count(1)}, False),
        ({"a": [1]}, False),
        ([{"a": 1}], False),
        ((1, 2), False),
        ("text", False),
    ],
)
def test_plain_json_is_a_flat_dict_or_list_of_scalars_msgspec_writes_alike(
    obj: object, plain: bool
) -> None:
    assert codecs.pure_plain_json(obj) is plain
    assert codecs.plain_json(obj) is plain


def test_the_compiled_plain_json_check_is_in_use_where_bootstrap_can_build_it() -> None:
    if os.environ.get("STREAMJOIN_PURE_PYTHON") == "1" or shutil.which("cargo") is None:
        assert codecs.plain_json is codecs.pure_plain_json
        return
    assert codecs.plain_json is not codecs.pure_plain_json, (
        "cargo is on PATH but streamjoin_native has no plain_json (run scripts/bootstrap.sh)"
    )


def test_json_encoded_values_are_sized_to_fit() -> None:
    """Table values wait for the next flush, sent records for their acknowledgement: the
    bytes must not keep a larger buffer (orjson's kept about 4 KB each)."""
    codec = codecs.JsonCodec()
    assert codec.dumps({"event_id": 1, "tier": "gold"}) == b'{"event_id":1,"tier":"gold"}'
    tracemalloc.start()
    try:
        kept = [codec.dumps({"event_id": i, "tier": "gold"}) for i in range(1_000)]
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(kept) == 1_000
    assert size < 1_000 * 200  # (orjson's bytes: about 4 MB)


@settings(max_examples=400, deadline=None)
@given(_json_values)
def test_json_decodes_exactly_as_the_standard_library(obj: object) -> None:
    try:
        data = _stdlib_bytes(obj)
    except UnicodeEncodeError:
        return
    decoded = codecs.JsonCodec().loads(data)
    assert decoded == json.loads(data)
    assert repr(decoded) == repr(json.loads(data))  # int stays int, -0.0 stays -0.0


@pytest.mark.parametrize(
    "data",
    [
        b"NaN",
        b"[1e400]",
        b'"\\ud800"',
        b"12345678901234567890123",
        b"-99999999999999999999",
        b"-9223372036854775809",
        b'{"id": "x", "n": [1, 2, 18446744073709551616], "t": 1700000000123}',
        b'{"big": 1234567890123456789012, "s": "' + b"0" * 40 + b'"}',
        b'{"id": 7, "big": 18446744073709551616}',
        b'{"id": 7, "small": -9223372036854775809, "ok": true}',
        b"[1, 18446744073709551616]",
        b'{"f": 0.12345678901234567890123, "n": 1}',
        b"1.00000000000000000001",
        b"1e999999999999",
        b"Infinity",
        b'{"a": 1, "a": 2}',
        b'"\\u00e9\\t\\/"',
        b" \t\r\n[] ",
    ],
)
def test_json_the_fast_parser_refuses_or_could_read_differently_decodes_as_the_standard_library(
    data: bytes,
) -> None:
    assert repr(codecs.JsonCodec().loads(data)) == repr(json.loads(data))
