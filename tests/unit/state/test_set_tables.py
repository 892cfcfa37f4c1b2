"""Set tables: the stored encoding (pure), and the set view through the test driver against
Python's ``set`` as the model, including a restore from the changelog it wrote."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.codecs import resolve_codec
from streamjoin.errors import AgentFailed, DecodeError, EncodeError, TableAccessError
from streamjoin.query.routing import value_body
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.set_tables import SetTable, SetView
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.sets import FORMAT, SetCodec, decode_members, encode_members
from streamjoin.testing.driver import TestDriver

APP_ID = "sets-unit"
CHANGELOG = f"{APP_ID}-members-changelog"

# ------------------------------------------------------------------ the encoding (pure)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=12), max_size=20))
def test_encoding_is_deterministic_and_round_trips(members: list[bytes]) -> None:
    encoded = encode_members(members)
    if not members:
        assert encoded is None  # an empty set is a delete
        return
    assert encoded is not None
    assert encoded == encode_members(reversed(members))  # order never matters
    assert decode_members(encoded) == sorted(set(members))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b'"a json value"', "not a set table value"),
        (FORMAT + b"\x00\x00", "truncated: 3 bytes, no member count"),
        (FORMAT + b"\x00\x00\x00\x02\x00\x00\x00\x01", "2 members need 13 bytes"),
        (FORMAT + b"\x00\x00\x00\x01\x00\x00\x00\x05abc", "lengths add up to 14"),
        (FORMAT + b"\x00\x00\x00\x01\x00\x00\x00\x01abc", "lengths add up to 10"),
    ],
)
def test_a_value_that_is_not_a_set_fails_clearly(data: bytes, problem: str) -> None:
    with pytest.raises(DecodeError, match=problem):
        decode_members(data)


def test_the_codec_takes_collections_of_members_only() -> None:
    codec = SetCodec(resolve_codec("json"))
    assert codec.name == "set[json]"
    assert codec.loads(codec.dumps(["b", "a", "b"]) or b"") == ["a", "b"]
    for not_a_collection in ("ab", b"ab", 3):
        with pytest.raises(EncodeError, match="collection of members"):
            codec.dumps(not_a_collection)


def test_the_query_endpoint_shows_a_set_as_a_json_list() -> None:
    codec = SetCodec(resolve_codec("json"))
    value = codec.loads(codec.dumps([3, {"x": 1}, "a"]) or b"")
    body = json.loads(value_body("members", "k", 0, value, None, None))
    assert body["value"] == ["a", 3, {"x": 1}]  # (in the order of the encoded members)


# ------------------------------------------------------------------ the set view


def set_app() -> tuple[streamjoin.App, SetTable, list[Any]]:
    """An agent applying ``[operation, argument]`` events to ``members[event.key]``;
    what ``remove`` and ``pop`` raise or return goes to ``answers``."""
    app = streamjoin.App(APP_ID)
    ops = app.topic("ops", key_serializer="str", value_serializer="json", partitions=2)
    members = app.set_table("members", key_serializer="str", copartitioned_with=ops)
    answers: list[Any] = []

    @app.agent(ops, name="apply")
    async def apply(stream: Stream) -> None:
        async for event in stream:
            operation, argument = event.value
            view = members[event.key]
            try:
                answers.append(apply_operation(view, operation, argument))
            except KeyError:
                answers.append("KeyError")

    return app, members, answers


def apply_operation(view: Any, operation: str, argument: Any) -> Any:
    """One operation on a set: the same code runs on a SetView and on the model set."""
    if operation == "add":
        view.add(argument)
    elif operation == "discard":
        view.discard(argument)
    elif operation == "remove":
        view.remove(argument)
    elif operation == "update":
        view.update(argument, [argument[0]] if argument else [])
    elif operation == "difference_update":
        view.difference_update(argument)
    elif operation == "intersection_update":
        view.intersection_update(argument)
    elif operation == "symmetric_difference_update":
        view ^= set(argument)
    elif operation == "ior":
        view |= set(argument)
    elif operation == "isub":
        view -= set(argument)
    elif operation == "clear":
        view.clear()
    elif operation == "contains":
        return argument in view
    elif operation == "len":
        return len(view)
    return None


member_values = st.one_of(st.integers(0, 5), st.sampled_from(["a", "b", "c"]))
one_member = st.sampled_from(["add", "discard", "remove", "contains"])
many_members = st.sampled_from(
    [
        "update",
        "difference_update",
        "intersection_update",
        "symmetric_difference_update",
        "ior",
        "isub",
    ]
)
operations = st.lists(
    st.one_of(
        st.tuples(st.sampled_from("xyz"), one_member, member_values),
        st.tuples(st.sampled_from("xyz"), many_members, st.lists(member_values, max_size=4)),
        st.tuples(st.sampled_from("xyz"), st.sampled_from(["clear", "len"]), st.none()),
        st.just(("flush", "", None)),
    ),
    max_size=30,
)


def restored(records: list[Any]) -> dict[bytes, bytes]:
    """What a restore from these changelog records leaves in an empty store."""
    store = MemoryStorePartition(table="members", partition=0)
    for record in records:
        store.write({record.key: record.value}, record.offset)
    return dict(store.items())


@settings(max_examples=150, deadline=None)
@given(operations)
def test_set_view_matches_python_sets_and_a_restore_matches_the_model(
    script: list[tuple[str, str, Any]],
) -> None:
    model: dict[str, set[Any]] = {}
    expected_answers: list[Any] = []
    for key, operation, argument in script:
        if operation == "flush":
            continue
        try:
            expected_answers.append(
                apply_operation(model.setdefault(key, set()), operation, argument)
            )
        except KeyError:
            expected_answers.append("KeyError")
    final = {key: members for key, members in model.items() if members}

    async def run() -> None:
        app, table, answers = set_app()
        codec = SetCodec(resolve_codec("json"))
        async with TestDriver(app) as driver:
            flushes = 0
            for key, operation, argument in script:
                if operation == "flush":
                    await driver.drain()
                    flushes += 1
                    continue
                await driver.put("ops", key=key, value=[operation, argument])
            await driver.drain()
            assert answers == expected_answers
            seen = {key: sorted(view, key=json.dumps) for key, view in table.items()}
            assert seen == {k: sorted(v, key=json.dumps) for k, v in final.items()}
            for key in "xyz":  # a missing key reads as an empty set, and is not "in" the table
                assert (len(table[key]) > 0) == (key in table) == (key in final)
            records = driver.raw_records(CHANGELOG)
            # coalesced: at most one record per key per flush
            assert len(records) <= 3 * (flushes + 1)
            after_restore = {
                key_bytes.decode(): sorted(codec.loads(raw), key=json.dumps)
                for partition in (0, 1)
                for key_bytes, raw in restored(
                    [r for r in records if r.partition == partition]
                ).items()
            }
            assert after_restore == {k: sorted(v, key=json.dumps) for k, v in final.items()}

    asyncio.run(run())


async def test_many_changes_to_a_key_in_one_batch_are_one_changelog_record() -> None:
    app, table, _ = set_app()
    async with TestDriver(app) as driver:
        for member in range(20):
            await driver.put("ops", key="x", value=["add", member])
        await driver.put("ops", key="x", value=["discard", 0])
        await driver.drain()
        records = driver.raw_records(CHANGELOG)
        assert [r.key for r in records] == [b"x"]
        assert SetCodec(resolve_codec("json")).loads(records[0].value) == sorted(
            range(1, 20), key=lambda m: str(m).encode()
        )
        await driver.put("ops", key="x", value=["clear", None])
        await driver.drain()
        assert [(r.key, r.value) for r in driver.raw_records(CHANGELOG)][1:] == [(b"x", None)]
        assert "x" not in table and len(table["x"]) == 0


async def test_replacing_and_deleting_a_whole_set() -> None:
    app = streamjoin.App(APP_ID)
    ops = app.topic("ops", key_serializer="str", value_serializer="json", partitions=1)
    members = app.set_table("members", key_serializer="str", copartitioned_with=ops)

    @app.agent(ops, name="replace")
    async def replace(stream: Stream) -> None:
        async for event in stream:
            members[event.key] = event.value
            assert members[event.key] == set(event.value)

    async with TestDriver(app) as driver:
        await driver.put("ops", key="x", value=["a", "b", "a"])
        await driver.put("ops", key="y", value=["c"])
        await driver.put("ops", key="y", value=[])
        await driver.drain()
        assert isinstance(members.get("x"), SetView)
        assert sorted(members["x"]) == ["a", "b"]
        assert members.get("y") is None and "y" not in members
        with pytest.raises(TableAccessError, match="only be written from an agent"):
            members["x"].add("c")
        with pytest.raises(TableAccessError, match="only be written from an agent"):
            members["x"] = ["c"]


async def test_remove_of_a_missing_member_raises_key_error_in_the_agent() -> None:
    app = streamjoin.App(APP_ID)
    ops = app.topic("ops", key_serializer="str", value_serializer="json", partitions=1)
    members = app.set_table("members", key_serializer="str", copartitioned_with=ops)

    @app.agent(ops, name="remove")
    async def remove(stream: Stream) -> None:
        async for event in stream:
            members[event.key].remove(event.value)

    with pytest.raises(AgentFailed, match="KeyError"):
        async with TestDriver(app) as driver:
            await driver.put("ops", key="x", value="absent")
            await driver.drain()


def test_set_table_is_declared_like_a_table() -> None:
    app = streamjoin.App(APP_ID)
    ops = app.topic("ops", key_serializer="str", partitions=3)
    members = app.set_table(
        "members", key_serializer="str", value_serializer="str", copartitioned_with=ops
    )
    assert app.tables["members"] is members
    assert members.member_codec.name == "str" and members.value_codec.name == "set[str]"
    changelog = app.topics[CHANGELOG]
    assert changelog.partitions == 3 and changelog.config["cleanup.policy"] == "compact"
    assert ("ops", CHANGELOG) in app.copartition_groups
    with pytest.raises(streamjoin.errors.ConfigurationError, match="declared twice"):
        app.set_table("members")


async def test_the_documented_recipe_for_faust_set_manager_changes_sets_of_other_keys() -> None:
    """docs/tables.md's replacement for Faust's ``table.manager``: an agent sends set
    operations for any key to a topic co-partitioned with the table; its agent applies them."""
    app = streamjoin.App(APP_ID)
    joins = app.topic("joins", key_serializer="str", value_serializer="json", partitions=4)
    set_ops = app.topic("room-member-ops", key_serializer="str", value_serializer="json")
    members = app.set_table(
        "members", key_serializer="str", value_serializer="str", copartitioned_with=[joins, set_ops]
    )

    @app.agent(joins, name="route")
    async def route(stream: Stream) -> None:
        async for event in stream:  # keyed by user; the set is keyed by room
            await set_ops.send(key=event.value["room"], value=[event.value["op"], event.key])

    @app.agent(set_ops, name="apply-set-ops")
    async def apply_set_ops(stream: Stream) -> None:
        async for event in stream:
            operation, member = event.value
            getattr(members[event.key], operation)(member)

    async with TestDriver(app) as driver:
        for user, room, op in [("ann", "r1", "add"), ("bob", "r1", "add"), ("cid", "r2", "add")]:
            await driver.put("joins", key=user, value={"room": room, "op": op})
        await driver.put("joins", key="ann", value={"room": "r1", "op": "discard"})
        await driver.drain()
        assert set_ops.partitions == 4
        assert {room: sorted(view) for room, view in members.items()} == {
            "r1": ["bob"],
            "r2": ["cid"],
        }
        assert "bob" in members["r1"] and "ann" not in members["r1"]
        assert 5 not in members["r1"]  # (not a str: in no set of str members, no error)
