"""Global tables and the stream-global-table join, through the test driver; the local
copy's store batches against a brute-force model of "latest value per key"."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.errors import ConfigurationError, TableAccessError
from streamjoin.events import Event
from streamjoin.global_tables import GlobalTable
from streamjoin.state.global_rows import (
    GlobalRowsStore,
    MemoryRows,
    RowStore,
    batch_writes,
    start_positions,
    stored_positions,
)
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.testing.driver import TestDriver


def country_of(event: Event) -> Any:
    return event.value["user"]


def enrich(key: Any, click: Any, user: Any) -> dict[str, Any]:
    return {"click": click["n"], "country": None if user is None else user["country"]}


def join_app(how: str) -> tuple[streamjoin.App, GlobalTable]:
    app = streamjoin.App("global-join-unit")
    users = app.topic("users", key_serializer="str", partitions=4)
    clicks = app.topic("clicks", key_serializer="str", partitions=3)
    out = app.topic("enriched", key_serializer="str", partitions=3)
    table = app.global_table(users)
    app.join(clicks, table, key=country_of, how=how, output=out)(enrich)
    return app, table


@pytest.mark.parametrize("how", ["inner", "left"])
async def test_join_sees_rows_sent_before_each_event_in_send_order(how: str) -> None:
    """Random interleavings of rows (with deletes) and clicks: each click is joined with
    the row its user had when the click was sent (the driver's deterministic "current")."""
    rng = random.Random(7)
    app, _ = join_app(how)
    model: dict[str, dict[str, str]] = {}
    expected: list[tuple[str, dict[str, Any]]] = []
    async with TestDriver(app) as driver:
        for n in range(400):
            user = f"u{rng.randrange(12)}"
            if rng.random() < 0.4:
                value = None if rng.random() < 0.2 else {"country": rng.choice("ABCD")}
                await driver.put("users", key=user, value=value)
                if value is None:
                    model.pop(user, None)
                else:
                    model[user] = value
            else:
                click = f"c{rng.randrange(50)}"
                await driver.put("clicks", key=click, value={"n": n, "user": user})
                row = model.get(user)
                if row is not None or how == "left":
                    expected.append((click, enrich(click, {"n": n}, row)))
        await driver.drain()
        got = [(e.key, e.value) for e in driver.records("enriched")]
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    assert len(got) > 100


async def test_agent_reads_any_key_without_copartitioning() -> None:
    app = streamjoin.App("global-read-unit")
    rates = app.topic("rates", key_serializer="str", value_serializer="json", partitions=5)
    orders = app.topic("orders", key_serializer="str", value_serializer="json", partitions=2)
    table = app.global_table(rates, default=lambda: 1.0)
    seen: list[Any] = []

    @app.agent(orders)
    async def price(stream: Any) -> None:
        async for event in stream:
            seen.append(event.value["amount"] * table[event.value["currency"]])
            assert event.value["currency"] in table or event.value["currency"] == "XXX"

    async with TestDriver(app) as driver:
        for currency, rate in [("EUR", 2.0), ("GBP", 3.0), ("JPY", 0.5)]:
            await driver.put("rates", key=currency, value=rate)
        for currency in ("EUR", "GBP", "JPY", "XXX"):
            await driver.put("orders", key="o", value={"amount": 10, "currency": currency})
        await driver.drain()
        assert sorted(table.items()) == [("EUR", 2.0), ("GBP", 3.0), ("JPY", 0.5)]
    assert seen == [20.0, 30.0, 5.0, 10.0]


async def test_writes_through_the_table_are_refused() -> None:
    app = streamjoin.App("global-write-unit")
    users = app.topic("users", key_serializer="str")
    table = app.global_table(users)
    errors: list[BaseException] = []

    @app.agent(app.topic("events", key_serializer="str"))
    async def write(stream: Any) -> None:
        async for _ in stream:
            try:
                table["k"] = 1
            except TableAccessError as exc:
                errors.append(exc)
            try:
                del table["k"]
            except TableAccessError as exc:
                errors.append(exc)

    async with TestDriver(app) as driver:
        await driver.put("events", key="e", value=1)
        await driver.drain()
    assert len(errors) == 2 and "written through its topic 'users'" in str(errors[0])
    with pytest.raises(TableAccessError, match="while no worker runs"):
        table.get("k")


def test_declaration_errors() -> None:
    app = streamjoin.App("global-errors-unit")
    users, clicks = app.topic("users"), app.topic("clicks")
    table = app.global_table(users, name="users-g")
    with pytest.raises(ConfigurationError, match="needs key="):
        app.join(clicks, table)(enrich)
    with pytest.raises(ConfigurationError, match="inner or left"):
        app.join(clicks, table, key=country_of, how="outer")(enrich)
    with pytest.raises(ConfigurationError, match="key= picks the row of a global table"):
        app.join(clicks, users, window=10, key=country_of)(enrich)
    with pytest.raises(ConfigurationError, match="already declared"):
        app.global_table(users, name="users-g")
    with pytest.raises(ConfigurationError, match="store must be"):
        app.global_table(users, name="other", store="disk")  # type: ignore[arg-type]
    assert app.topology().global_tables == {"users-g": table}


# ---------------------------------------------------------------- the store batches

_records = st.lists(
    st.tuples(
        st.integers(0, 2),  # partition
        st.sampled_from([None, b"a", b"b", b"c", b"d"]),  # key
        st.one_of(st.none(), st.binary(min_size=1, max_size=3)),  # value (None deletes)
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_records, st.integers(1, 7), st.booleans())
def test_batches_equal_latest_value_per_key(
    records: list[Any], chunk: int, sorted_store: bool
) -> None:
    """Records of each partition applied in chunks of any size (partitions interleaved as
    a reader returns them) leave the model's rows and each partition's next offset."""
    store: RowStore = MemoryStorePartition() if sorted_store else MemoryRows()
    model: dict[bytes, bytes] = {}
    offsets: dict[int, int] = {}
    pending: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {}
    for partition, key, value in records:
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        pending.setdefault(partition, []).append((offset, key, value))
        if key is not None:
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        if len(pending[partition]) >= chunk:
            done = pending.pop(partition)
            store.write(batch_writes(done, partition, done[-1][0] + 1), None)
    for partition, done in pending.items():
        store.write(batch_writes(done, partition, done[-1][0] + 1), None)
    # (one key per partition in real topics; here the model's order is the send order,
    # which the chunks keep only within a partition: compare per key where unambiguous)
    rows = dict(GlobalRowsStore(store).rows())
    single = {k for k in model if len({p for p, kk, _ in records if kk == k}) == 1}
    assert {k: v for k, v in rows.items() if k in single} == {
        k: v for k, v in model.items() if k in single
    }
    assert stored_positions(store) == offsets


@given(
    st.dictionaries(st.integers(0, 3), st.integers(0, 100)),
    st.dictionaries(st.integers(0, 3), st.integers(0, 50)),
    st.dictionaries(st.integers(0, 3), st.integers(0, 120), min_size=1),
)
def test_start_positions(
    stored: dict[int, int], begins: dict[int, int], ends: dict[int, int]
) -> None:
    beginnings = {p: min(begins.get(p, 0), end) for p, end in ends.items()}
    starts, wipe = start_positions(stored, beginnings, ends)
    assert wipe == any(stored.get(p, 0) > end for p, end in ends.items())
    for p, end in ends.items():
        if wipe:
            assert starts[p] == beginnings[p]
        else:
            assert starts[p] == max(stored.get(p, 0), beginnings[p]) <= end
