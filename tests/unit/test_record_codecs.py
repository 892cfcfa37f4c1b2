"""Typed record codecs: msgspec Structs and pydantic models, resolved by type, round trips,
and errors that name the field."""

from __future__ import annotations

import contextlib
import enum
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.codecs import DataclassJson, resolve_codec
from streamjoin.errors import ArgumentTypeError, DecodeError, EncodeError
from streamjoin.record_codecs import PydanticJson, StructJson, record_codec

pydantic = pytest.importorskip("pydantic")  # the "pydantic" extra, in the test extra too


class Status(enum.Enum):
    NEW = "new"
    PAID = "paid"


class Line(msgspec.Struct):
    sku: str
    qty: Annotated[int, msgspec.Meta(ge=1)]
    price: float


class Order(msgspec.Struct):
    id: str
    lines: list[Line]
    status: Status
    created: datetime
    amount: Decimal = Decimal("0")
    ref: uuid.UUID | None = None
    tags: dict[str, int] = {}


class Strict(msgspec.Struct, forbid_unknown_fields=True):
    a: int


class Checked(msgspec.Struct):
    n: int

    def __post_init__(self) -> None:
        if self.n == 13:
            raise ValueError("13 is unlucky")
        if self.n == 7:
            raise RuntimeError("seven broke it")


class Key(msgspec.Struct, frozen=True):
    region: str
    user: int


@dataclass
class KeyAsDataclass:
    user: int
    region: str


class Account(pydantic.BaseModel):
    id: str
    balance: float
    opened: datetime
    owner_name: str = pydantic.Field(alias="ownerName")
    lines: list[dict[str, int]] = pydantic.Field(default_factory=list)

    @pydantic.field_validator("balance")
    @classmethod
    def not_negative(cls, value: float) -> float:
        if value < 0:
            raise ValueError("balance must not be negative")
        return value


class Forbidding(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    a: int


def _order() -> Order:
    return Order(
        id="o-1",
        lines=[Line("apple", 2, 0.5), Line("pear", 1, 1.25)],
        status=Status.PAID,
        created=datetime(2026, 11, 27, 12, 30, tzinfo=timezone.utc),
        amount=Decimal("2.25"),
        ref=uuid.UUID(int=7),
        tags={"x": 1},
    )


# -- resolving by type -----------------------------------------------------------------------


def test_a_struct_or_model_type_resolves_to_its_codec() -> None:
    codec = resolve_codec(Order)
    assert isinstance(codec, StructJson) and codec.cls is Order
    assert codec.name == "json[Order]"
    model = resolve_codec(Account)
    assert isinstance(model, PydanticJson) and model.cls is Account
    assert model.name == "json[Account]"
    assert record_codec(int) is None


def test_codecs_of_the_same_type_are_equal_so_a_topic_may_be_declared_twice() -> None:
    assert resolve_codec(Order) == resolve_codec(Order)
    assert hash(resolve_codec(Order)) == hash(StructJson(Order))
    assert resolve_codec(Order) != resolve_codec(Line)
    assert resolve_codec(Account) == PydanticJson(Account)
    assert resolve_codec(Account) != resolve_codec(Forbidding)


def test_constructors_refuse_other_types() -> None:
    with pytest.raises(ArgumentTypeError, match=r"needs a msgspec\.Struct type"):
        StructJson(Account)
    with pytest.raises(ArgumentTypeError, match="needs a pydantic model class"):
        PydanticJson(Order)


def test_a_pydantic_v1_model_is_named_as_such() -> None:
    from pydantic import v1

    class Old(v1.BaseModel):
        a: int

    with pytest.raises(ArgumentTypeError, match="pydantic v1 model"):
        resolve_codec(Old)


# -- msgspec Structs -------------------------------------------------------------------------


def test_struct_round_trips_nested_and_exotic_fields() -> None:
    codec = StructJson(Order)
    order = _order()
    data = codec.dumps(order)
    assert data is not None
    assert codec.loads(data) == order
    written = json.loads(data)
    assert written["created"] == "2026-11-27T12:30:00Z"
    assert written["amount"] == "2.25" and written["status"] == "paid"
    assert list(written) == sorted(written)  # fields sorted: one record, one byte string


def test_struct_writes_what_the_json_codec_writes_for_a_dataclass_with_the_same_fields() -> None:
    """The same key as a Struct or a dataclass lands in the same partition."""
    as_struct = StructJson(Key).dumps(Key(region="eu", user=42))
    assert as_struct == DataclassJson(KeyAsDataclass).dumps(KeyAsDataclass(42, "eu"))
    assert as_struct == b'{"region":"eu","user":42}'


def test_struct_none_and_dicts() -> None:
    codec = StructJson(Key)
    assert codec.dumps(None) is None and codec.loads(None) is None
    assert codec.dumps({"user": 1, "region": "us"}) == b'{"region":"us","user":1}'


def test_struct_refuses_other_objects_and_unencodable_values() -> None:
    codec = StructJson(Key)
    with pytest.raises(EncodeError, match=r"json\[Key\] codec could not encode Line"):
        codec.dumps(Line("a", 1, 1.0))
    with pytest.raises(EncodeError, match=r"json\[Key\] codec could not encode dict"):
        codec.dumps({"user": object()})


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"region":"eu","user":"42"}', "Key.user: Expected `int`, got `str`"),
        (b'{"region":"eu"}', "Key: Object missing required field `user`"),
        (b"[1, 2]", "Key: Expected `object`, got `array`"),
        (b"{", "Input data was truncated"),
        (b"\xff", "JSON is malformed"),
    ],
)
def test_struct_decode_errors_name_the_field(payload: bytes, expected: str) -> None:
    with pytest.raises(DecodeError) as failed:
        StructJson(Key).loads(payload)
    message = str(failed.value)
    assert message.startswith(f"json[Key] codec could not decode {len(payload)} bytes into Key")
    assert expected in message, message
    assert "payload starts" in message


def test_struct_errors_give_the_path_into_nested_values_and_check_constraints() -> None:
    data = StructJson(Order).dumps(_order())
    assert data is not None
    bad = data.replace(b'"qty":1', b'"qty":0')
    with pytest.raises(DecodeError, match=r"Order\.lines\[1\]\.qty: Expected `int` >= 1"):
        StructJson(Order).loads(bad)


def test_struct_unknown_fields_follow_the_struct_setting() -> None:
    assert StructJson(Key).loads(b'{"region":"eu","user":1,"extra":true}') == Key("eu", 1)
    with pytest.raises(DecodeError, match="Strict: Object contains unknown field `b`"):
        StructJson(Strict).loads(b'{"a":1,"b":2}')


def test_struct_post_init_failures_are_decode_errors() -> None:
    codec = StructJson(Checked)
    assert codec.loads(b'{"n":1}') == Checked(1)
    with pytest.raises(DecodeError, match="13 is unlucky"):
        codec.loads(b'{"n":13}')
    with pytest.raises(DecodeError, match=r"Checked\(\.\.\.\) raised RuntimeError: seven broke"):
        codec.loads(b'{"n":7}')


def test_struct_reads_any_bytes_like_object_but_not_text() -> None:
    codec = StructJson(Key)
    payload = b'{"region":"eu","user":1}'
    assert codec.loads(bytearray(payload)) == codec.loads(memoryview(payload)) == Key("eu", 1)
    with pytest.raises(ArgumentTypeError, match="expects bytes, got str"):
        codec.loads(payload.decode())  # type: ignore[arg-type]


texts = st.text(st.characters(blacklist_categories=("Cs",)))
lines = st.builds(
    Line, texts, st.integers(1, 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False)
)
orders = st.builds(
    Order,
    id=texts,
    lines=st.lists(lines, max_size=3),
    status=st.sampled_from(Status),
    created=st.datetimes(timezones=st.just(timezone.utc)),
    amount=st.decimals(allow_nan=False, allow_infinity=False),
    ref=st.none() | st.uuids(),
    tags=st.dictionaries(texts, st.integers(-(2**63), 2**63 - 1), max_size=3),
)


@settings(print_blob=True)
@given(orders)
def test_struct_round_trips_any_order(order: Order) -> None:
    codec = StructJson(Order)
    data = codec.dumps(order)
    assert data is not None
    assert codec.loads(data) == order


@settings(print_blob=True)
@given(st.binary(max_size=64))
@pytest.mark.parametrize(
    "codec", [StructJson(Order), StructJson(Strict), PydanticJson(Account)], ids=repr
)
def test_decoding_arbitrary_bytes_only_ever_raises_decode_error(codec: Any, data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        codec.loads(data)


# -- pydantic models -------------------------------------------------------------------------


def _account() -> Account:
    return Account(
        id="a-1",
        balance=10.5,
        opened=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        ownerName="Ada",
        lines=[{"a": 1}],
    )


def test_pydantic_round_trips_with_aliases() -> None:
    codec = PydanticJson(Account)
    data = codec.dumps(_account())
    assert data is not None
    assert json.loads(data)["ownerName"] == "Ada"
    assert codec.loads(data) == _account()
    assert codec.dumps(None) is None and codec.loads(None) is None
    assert codec.loads(bytearray(data)) == codec.loads(memoryview(data)) == _account()


def test_pydantic_errors_name_each_field_up_to_three() -> None:
    codec = PydanticJson(Account)
    with pytest.raises(DecodeError) as failed:
        codec.loads(b'{"id":"a","balance":-1,"opened":"2026-01-01T00:00:00Z","ownerName":"x"}')
    assert "Account.balance: Value error, balance must not be negative" in str(failed.value)
    with pytest.raises(DecodeError) as failed:
        codec.loads(b'{"lines":[{"a":"x"}], "balance": "no"}')
    message = str(failed.value)
    assert message.startswith("json[Account] codec could not decode")
    assert "Account.id: Field required" in message
    assert "Account.balance: Input should be a valid number" in message
    assert "and 2 more" in message  # opened, ownerName, lines[0].a: three listed


def test_pydantic_nested_paths_and_malformed_json() -> None:
    codec = PydanticJson(Account)
    payload = b'{"id":"a","balance":1,"opened":"2026-01-01T00:00:00Z","ownerName":"x",'
    with pytest.raises(DecodeError, match=r"Account\.lines\[0\]\.a: Input should be a valid int"):
        codec.loads(payload + b'"lines":[{"a":"x"}]}')
    with pytest.raises(DecodeError, match="Invalid JSON"):
        codec.loads(b"{")


def test_pydantic_unknown_fields_follow_the_model_setting() -> None:
    assert PydanticJson(Forbidding).loads(b'{"a":1}') == Forbidding(a=1)
    with pytest.raises(DecodeError, match=r"Forbidding\.b: Extra inputs are not permitted"):
        PydanticJson(Forbidding).loads(b'{"a":1,"b":2}')


def test_pydantic_refuses_other_objects() -> None:
    with pytest.raises(EncodeError, match="expected Account, a dict or None"):
        PydanticJson(Account).dumps(_order())
    assert PydanticJson(Forbidding).dumps({"a": 1}) == b'{"a":1}'


def test_the_query_endpoint_answers_structs_and_models_as_json_objects() -> None:
    from streamjoin.query.routing import jsonable

    assert jsonable(Key("eu", 1)) == {"region": "eu", "user": 1}
    assert jsonable(_order())["created"] == "2026-11-27T12:30:00Z"
    assert jsonable(_order())["lines"][0] == {"sku": "apple", "qty": 2, "price": 0.5}
    account = jsonable(_account())
    assert account["ownerName"] == "Ada" and account["opened"] == "2026-01-02T03:04:05Z"
    assert json.loads(json.dumps(account)) == account
