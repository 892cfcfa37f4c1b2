"""The pure decisions of interactive queries: routing table, key parsing, where to answer,
and the JSON bodies."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from streamjoin.codecs import resolve_codec
from streamjoin.errors import QueryKeyError, QueryUnavailable, UnknownTableError
from streamjoin.partitioner import partition_for_key
from streamjoin.query.routing import (
    Action,
    LocalState,
    MemberRoute,
    RoutingTable,
    decide,
    error_body,
    jsonable,
    parse_flag,
    parse_key,
    parse_window_range,
    partition_of,
    require_table,
    value_body,
    windows_body,
)

SOURCES = {"counts": ("events",), "totals": ("orders", "payments")}
CHANGELOGS = {"counts": "app-counts-changelog", "totals": "app-totals-changelog"}


def _table() -> RoutingTable:
    return RoutingTable.build(
        7,
        [
            MemberRoute("a:1", {"events": [0, 1], "orders": [0]}, {"app-counts-changelog": [2]}),
            MemberRoute("b:2", {"events": [2], "payments": [1]}, {"app-counts-changelog": [0, 1]}),
            MemberRoute(None, {"events": [3]}, {"app-counts-changelog": [3]}),
            MemberRoute("c:3", {}, {"app-counts-changelog": [0]}),
        ],
        SOURCES,
        CHANGELOGS,
    )


def test_the_routing_table_names_owners_and_standbys_per_table_partition() -> None:
    table = _table()
    first = table.locate("counts", 0)
    assert (first.partition, first.owner, first.standbys) == (0, "a:1", ("b:2", "c:3"))
    assert table.locate("counts", 2).owner == "b:2"
    assert table.locate("counts", 2).standbys == ("a:1",)
    # a member advertising no host cannot be routed to: its partition has no owner
    assert table.locate("counts", 3).owner is None
    # any source of the table's co-partition group decides the owner
    assert table.locate("totals", 0).owner == "a:1"
    assert table.locate("totals", 1).owner == "b:2"
    assert table.locate("totals", 5).owner is None
    assert table.locate("counts", 0).generation == 7


def _decide(**changes: object) -> object:
    args: dict[str, object] = {
        "table": "counts",
        "partition": 2,
        "local": LocalState(),
        "rebalancing": False,
        "routing": _table(),
        "self_host": "a:1",
        "forwarded": False,
        "redirect": False,
        "allow_stale": False,
    }
    args.update(changes)
    return decide(**args)  # type: ignore[arg-type]


def test_a_read_is_answered_locally_only_by_the_running_active_owner() -> None:
    assert _decide(local=LocalState(active=True)).action is Action.LOCAL  # type: ignore[attr-defined]
    # even when forwarded here: the receiver of a forward answers if it owns the partition
    local = _decide(local=LocalState(active=True), forwarded=True)
    assert local.action is Action.LOCAL  # type: ignore[attr-defined]


def test_other_reads_are_forwarded_or_redirected_to_the_owner() -> None:
    forward = _decide()
    assert (forward.action, forward.target) == (Action.FORWARD, "b:2")  # type: ignore[attr-defined]
    redirect = _decide(redirect=True)
    assert (redirect.action, redirect.target) == (Action.REDIRECT, "b:2")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"rebalancing": True}, "rebalancing"),
        ({"rebalancing": True, "local": LocalState(active=True)}, "rebalancing"),
        ({"local": LocalState(restoring=True)}, "restoring"),
        ({"forwarded": True}, "forwarded here, but this worker is not the active owner"),
        ({"routing": None}, "not known yet"),
        ({"partition": 3}, "no active owner"),
        ({"partition": 0}, "assigned to this worker but not running"),
        # a standby without a measured lag does not answer stale reads
        ({"local": LocalState(standby=True), "allow_stale": True, "forwarded": True}, "forwarded"),
    ],
)
def test_no_answer_is_a_503_naming_why(changes: dict[str, object], reason: str) -> None:
    decision = _decide(**changes)
    assert decision.action is Action.UNAVAILABLE  # type: ignore[attr-defined]
    error = decision.unavailable()  # type: ignore[attr-defined]
    assert isinstance(error, QueryUnavailable) and reason in str(error)
    assert error.retry_after > 0


def test_a_standby_answers_only_when_stale_reads_are_allowed() -> None:
    standby = LocalState(standby=True, lag=12)
    assert _decide(local=standby, allow_stale=True).action is Action.STALE  # type: ignore[attr-defined]
    assert _decide(local=standby).action is Action.FORWARD  # type: ignore[attr-defined]
    # allowed stale, but nothing here: the owner answers (fresh)
    assert _decide(allow_stale=True).action is Action.FORWARD  # type: ignore[attr-defined]


@dataclass
class Key:
    region: str
    user: int


@pytest.mark.parametrize(
    ("codec", "text", "expected"),
    [
        ("str", "user-1", b"user-1"),
        ("raw", "user-1", b"user-1"),
        ("json", '{"b": 1, "a": 2}', b'{"a":2,"b":1}'),  # the codec's canonical form
        ("json", "42", b"42"),
        ("json", "plain words", b'"plain words"'),
        (Key, '{"region": "eu", "user": 3}', b'{"region":"eu","user":3}'),
    ],
)
def test_parse_key_gives_the_bytes_a_write_of_that_key_uses(
    codec: object, text: str, expected: bytes
) -> None:
    resolved = resolve_codec(codec)  # type: ignore[arg-type]
    assert parse_key(text, resolved) == expected
    assert partition_of(parse_key(text, resolved), 6) == partition_for_key(expected, 6)


def test_a_key_the_codec_cannot_parse_is_a_400_naming_the_codec() -> None:
    with pytest.raises(QueryKeyError, match=r"key codec 'json\[Key\]'") as caught:
        parse_key('{"region": "eu"}', resolve_codec(Key))
    assert caught.value.status == 400
    with pytest.raises(QueryKeyError, match="json"):
        parse_key("not json", resolve_codec(Key))


def test_flags_and_window_ranges_are_checked() -> None:
    assert parse_flag(None, "x") is False
    assert parse_flag("1", "x") is True and parse_flag("0", "x") is False
    with pytest.raises(QueryKeyError, match=r"\?allow_stale= takes 1 or 0"):
        parse_flag("maybe", "allow_stale")
    assert parse_window_range(None, None) == (0, (1 << 63) - 1)
    assert parse_window_range("10", "20") == (10, 20)
    with pytest.raises(QueryKeyError, match=r"\?from= must be an int"):
        parse_window_range("soon", None)
    with pytest.raises(QueryKeyError, match="before"):
        parse_window_range("20", "10")


def test_an_unknown_table_names_the_known_ones() -> None:
    require_table("counts", ["counts", "totals"])
    with pytest.raises(UnknownTableError, match="no table 'nope'; known tables: counts, totals"):
        require_table("nope", ["totals", "counts"])


def test_bodies_say_who_served_and_how_stale() -> None:
    fresh = json.loads(value_body("counts", "u1", 3, 12, "a:1", None))
    assert fresh == {
        "table": "counts",
        "key": "u1",
        "partition": 3,
        "served_by": "a:1",
        "stale": False,
        "lag": None,
        "value": 12,
    }
    stale = json.loads(windows_body("w", "u1", 0, [(0, 60_000, 5)], "b:2", 4))
    assert stale["stale"] is True and stale["lag"] == 4
    assert stale["windows"] == [{"start": 0, "end": 60_000, "value": 5}]
    error = json.loads(error_body(QueryUnavailable("moving", 2.0)))
    assert error == {
        "error": "QueryUnavailable",
        "message": "moving",
        "status": 503,
        "retry_after": 2.0,
    }


def test_integers_beyond_64_bits_are_answered_too() -> None:
    assert json.loads(value_body("t", "k", 0, 2**70, None, None))["value"] == 2**70


def test_values_become_json() -> None:
    assert jsonable(Key("eu", 1)) == {"region": "eu", "user": 1}
    assert jsonable(b"text") == "text"
    assert jsonable(b"\xff") == {"base64": "/w=="}
    assert jsonable({1: (1, 2)}) == {"1": [1, 2]}
