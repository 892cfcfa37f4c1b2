"""A set table's manager (operations sent through its topic, applied by the key's owner)
and set global tables: the operation encoding and its application (pure, against
Python's ``set``), then both through the test driver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.codecs import resolve_codec
from streamjoin.errors import (
    AgentFailed,
    ConfigurationError,
    DecodeError,
    EncodeError,
    TableAccessError,
)
from streamjoin.global_tables import SetGlobalTable
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.set_tables import MemberSet
from streamjoin.state.sets import (
    OPERATIONS,
    SetCodec,
    apply_operation,
    decode_operation,
    encode_operation,
)
from streamjoin.testing.driver import TestDriver

APP_ID = "set-manager-unit"
MANAGER_TOPIC = f"{APP_ID}-members-setmanager"

# ------------------------------------------------------------------ pure: operations

members_bytes = st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b""]), max_size=4)
an_operation = st.tuples(st.sampled_from(sorted(OPERATIONS.values())), members_bytes)
#: the operations that set members' presence (all but the toggle)
idempotent_operation = st.tuples(
    st.sampled_from(["update", "difference_update", "intersection_update"]), members_bytes
)


def model_apply(model: set[bytes], operation: str, operands: list[bytes]) -> None:
    getattr(model, operation)(set(operands))


@settings(max_examples=200, deadline=None)
@given(an_operation)
def test_an_operation_round_trips_through_its_encoding(op: tuple[str, list[bytes]]) -> None:
    operation, members = op
    assert decode_operation(encode_operation(operation, members)) == (
        operation,
        sorted(set(members)),
    )


@settings(max_examples=200, deadline=None)
@given(members_bytes, st.lists(an_operation, max_size=12))
def test_applying_operations_matches_python_sets(
    start: list[bytes], ops: list[tuple[str, list[bytes]]]
) -> None:
    members = tuple(sorted(set(start)))
    model = set(start)
    for operation, operands in ops:
        members = apply_operation(members, operation, operands)
        model_apply(model, operation, operands)
        assert members == tuple(sorted(model))  # ascending, no repeats: as stored


@settings(max_examples=200, deadline=None)
@given(
    st.lists(idempotent_operation, max_size=10),
    st.lists(idempotent_operation, min_size=1, max_size=10),
)
def test_replaying_a_suffix_of_presence_operations_changes_nothing(
    committed: list[tuple[str, list[bytes]]], replayed: list[tuple[str, list[bytes]]]
) -> None:
    """What a crash under at-least-once does: the operations after the last commit are
    applied again, in the same order."""
    members: tuple[bytes, ...] = ()
    for operation, operands in committed + replayed:
        members = apply_operation(members, operation, operands)
    once = members
    for operation, operands in replayed:
        members = apply_operation(members, operation, operands)
    assert members == once


def test_a_toggle_replayed_is_not_idempotent() -> None:
    """Why the docs say symmetric_difference_update is exact only under exactly-once."""
    once = apply_operation((), "symmetric_difference_update", [b"a"])
    assert apply_operation(once, "symmetric_difference_update", [b"a"]) != once


def test_bad_operations_fail_clearly() -> None:
    with pytest.raises(EncodeError, match="unknown set operation 'pop'"):
        encode_operation("pop", [])
    with pytest.raises(EncodeError, match="unknown set operation 'pop'"):
        apply_operation((), "pop", [])
    with pytest.raises(DecodeError, match="not a set manager operation"):
        decode_operation(b"?")
    with pytest.raises(DecodeError, match="not a set table value"):
        decode_operation(b"a" + b"junk")
    assert decode_operation(encode_operation("intersection_update", [])) == (
        "intersection_update",
        [],
    )


# ------------------------------------------------------------------ the manager, driven


def manager_app(partitions: int = 4) -> tuple[streamjoin.App, Any, SetGlobalTable]:
    """Events ``[operation, target key, member]`` on ``requests``, keyed by anything: the
    agent sends the operation through the manager, whatever the target's partition."""
    app = streamjoin.App(APP_ID)
    requests = app.topic(
        "requests", key_serializer="str", value_serializer="json", partitions=partitions
    )
    members = app.set_table("members", key_serializer="str", value_serializer="str", manager=True)
    everywhere = app.set_global_table(members)

    @app.agent(requests, name="requests")
    async def send_operations(stream: Stream) -> None:
        manager = members.manager
        async for event in stream:
            operation, key, argument = event.value
            if operation in ("add", "discard"):
                await getattr(manager, operation)(key, argument)
            elif operation == "clear":
                await manager.clear(key)
            else:
                await getattr(manager, operation)(key, argument)

    return app, members, everywhere


def model_after(script: list[tuple[str, str, Any]]) -> dict[str, list[str]]:
    model: dict[str, set[str]] = {}
    for operation, key, argument in script:
        members = model.setdefault(key, set())
        if operation == "add":
            members.add(argument)
        elif operation == "discard":
            members.discard(argument)
        elif operation == "clear":
            members.clear()
        else:
            getattr(members, operation)(argument)
    return {key: sorted(members) for key, members in model.items() if members}


keys = st.sampled_from(["k0", "k1", "k2", "k3", "k4", "k5"])
strs = st.sampled_from(["a", "b", "c"])
scripts = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["add", "discard"]), keys, strs),
        st.tuples(st.just("clear"), keys, st.none()),
        st.tuples(
            st.sampled_from(
                [
                    "update",
                    "difference_update",
                    "intersection_update",
                    "symmetric_difference_update",
                ]
            ),
            keys,
            st.lists(strs, max_size=3),
        ),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(scripts)
def test_manager_operations_from_any_partition_make_the_model_sets(
    script: list[tuple[str, str, Any]],
) -> None:
    """One sender's partition sends operations on keys of every partition; every key's set
    (the owner's table, and the set global table every worker reads) equals Python's sets
    after the same operations in order."""
    expected = model_after(script)

    async def run() -> None:
        app, members, everywhere = manager_app()
        async with TestDriver(app) as driver:
            for request in script:
                await driver.put("requests", key="sender", value=list(request))
            await driver.drain()
            await driver.drain()  # (the manager's agent applies what the first one sent)
            found = {key: sorted(view) for key, view in members.items()}
            assert found == expected
            assert {key: sorted(row) for key, row in everywhere.items()} == expected
            for key in ["k0", "k1", "k2", "k3", "k4", "k5"]:
                assert sorted(everywhere[key]) == expected.get(key, [])

    asyncio.run(run())


async def test_operations_cross_partitions_and_are_applied_by_the_owner() -> None:
    app, members, everywhere = manager_app(partitions=4)
    sender = "s"
    target = next(
        key
        for key in (f"k{i}" for i in range(50))
        if partition_for_key(key.encode(), 4) != partition_for_key(sender.encode(), 4)
    )
    async with TestDriver(app) as driver:
        await driver.put("requests", key=sender, value=["update", target, ["x", "y", "z"]])
        await driver.put("requests", key=sender, value=["discard", target, "y"])
        await driver.drain()
        await driver.drain()
        sent = driver.raw_records(MANAGER_TOPIC)
        assert {r.partition for r in sent} == {partition_for_key(target.encode(), 4)}
        assert [decode_operation(r.value or b"") for r in sent] == [
            ("update", [b"x", b"y", b"z"]),
            ("difference_update", [b"y"]),
        ]
        assert sorted(members[target]) == ["x", "z"]
        row = everywhere[target]
        assert isinstance(row, MemberSet) and "x" in row and "y" not in row and 3 not in row
        assert everywhere.get("nobody") is None and len(everywhere["nobody"]) == 0
        assert "nobody" not in everywhere and target in everywhere
        with pytest.raises(TableAccessError, match="read-only: change the sets through"):
            everywhere[target] = ["q"]
        with pytest.raises(EncodeError, match="collection of members, not a str"):
            await members.manager.update(target, "abc")
        # the set table's flushes (a drain's, a commit's) feed the set global table
        await driver.put("requests", key=sender, value=["add", target, "w"])
        await driver.drain()
        await driver.put("requests", key=sender, value=["discard", target, "x"])
        await driver.drain()
        await driver.commit()
        assert sorted(everywhere[target]) == ["w", "z"]


def test_the_manager_is_declared_with_the_table() -> None:
    app, members, everywhere = manager_app()
    manager_topic = app.topics[MANAGER_TOPIC]
    assert (manager_topic.key_codec.name, manager_topic.value_codec.name) == ("raw", "raw")
    assert app.agents["members.setmanager"].topic is manager_topic
    assert MANAGER_TOPIC in members.writers
    assert everywhere.source is members.changelog and everywhere.name == "members-global"
    assert isinstance(everywhere.value_codec, SetCodec)


def test_declaration_errors() -> None:
    app = streamjoin.App(APP_ID)
    plain = app.set_table("plain", key_serializer="str")
    with pytest.raises(ConfigurationError, match="has no manager: declare it with"):
        _ = plain.manager
    counts = app.table("counts")
    with pytest.raises(ConfigurationError, match="takes a set table"):
        app.set_global_table(counts)  # type: ignore[arg-type]
    app.set_global_table(plain)
    with pytest.raises(ConfigurationError, match="already declared"):
        app.set_global_table(plain)
    with pytest.raises(ConfigurationError, match="its value codec must be a SetCodec"):
        SetGlobalTable("x", plain.changelog, resolve_codec("str"), resolve_codec("str"))


async def test_a_record_that_is_not_an_operation_stops_the_manager_agent_clearly() -> None:
    app, _, _ = manager_app(partitions=1)
    with pytest.raises(AgentFailed, match="not a set manager operation"):
        async with TestDriver(app) as driver:
            await driver.put_raw(MANAGER_TOPIC, b"k", b"?junk")
            await driver.drain()
    app, _, _ = manager_app(partitions=1)
    with pytest.raises(AgentFailed, match=r"has no value: not a set operation"):
        async with TestDriver(app) as driver:
            await driver.put_raw(MANAGER_TOPIC, b"k", None)
            await driver.drain()
