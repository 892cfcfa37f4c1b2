"""The foreign-key join's final rows (the pure part of its backfill) against a brute-force
replay and against the workers' own logic in the test driver; the backfill refuses a history."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.codecs import JSON, STR
from streamjoin.partitioner import partition_for_key
from streamjoin.spark.foreign_key_rows import ForeignKeyRows, TableRecord
from streamjoin.testing.driver import TestDriver

OUT_PARTITIONS = 3


def enrich(key: str, order: Any, customer: Any) -> Any:
    if order["n"] % 5 == 0:
        return None  # the join function may drop a row
    return {"n": order["n"], "customer": None if customer is None else customer["name"]}


def orders_app(how: str) -> streamjoin.App:
    app = streamjoin.App("fk-backfill-unit")
    orders = app.topic("orders", key_serializer="str", partitions=3)
    customers = app.topic("customers", key_serializer="str", partitions=2)
    out = app.topic("enriched", key_serializer="str", partitions=OUT_PARTITIONS)
    app.join(
        app.topic_table(orders),
        app.topic_table(customers),
        foreign_key=lambda order: order["customer"],
        how=how,
        output=out,
        name="enriched",
    )(enrich)
    return app


def rows_of(app: streamjoin.App) -> ForeignKeyRows:
    return ForeignKeyRows.for_join(app.config, app.topology().joins["enriched"], OUT_PARTITIONS)


#: (side, key, value or None): a history of both tables, in the order each table applied it
Change = tuple[str, str, Any]

changes = st.lists(
    st.one_of(
        st.tuples(
            st.just("orders"),
            st.sampled_from(["o1", "o2", "o3", "o4"]),
            st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {
                        "customer": st.one_of(st.none(), st.sampled_from(["c1", "c2", "c3"])),
                        "n": st.integers(0, 20),
                    }
                ),
            ),
        ),
        st.tuples(
            st.just("customers"),
            st.sampled_from(["c1", "c2", "c3"]),
            st.one_of(st.none(), st.fixed_dictionaries({"name": st.sampled_from(["a", "b"])})),
        ),
    ),
    max_size=40,
)


def as_records(history: list[Change], side: str) -> list[TableRecord]:
    return [
        (key.encode(), None if value is None else json.dumps(value).encode(), (0, i), 1000 + i)
        for i, (s, key, value) in enumerate(history)
        if s == side
    ]


def brute_force(history: list[Change], how: str) -> dict[str, tuple[int, Any, int]]:
    """Replay both tables, then join every left row: key -> (partition, result, timestamp)."""
    tables: dict[str, dict[str, tuple[Any, int]]] = {"orders": {}, "customers": {}}
    for i, (side, key, value) in enumerate(history):
        if value is None:
            tables[side].pop(key, None)
        else:
            tables[side][key] = (value, 1000 + i)
    out = {}
    for key, (order, ts) in tables["orders"].items():
        found = tables["customers"].get(order["customer"]) if order["customer"] else None
        if found is None and how == "inner":
            continue
        joined = enrich(key, order, None if found is None else found[0])
        if joined is not None:
            when = ts if found is None else max(ts, found[1])
            out[key] = (partition_for_key(key.encode(), OUT_PARTITIONS), joined, when)
    return out


def decoded(outputs: Any) -> dict[str, tuple[int, Any, int]]:
    found: dict[str, tuple[int, Any, int]] = {}
    for o in outputs:
        key = STR.loads(o.key)
        assert key not in found, f"two rows for {key!r}"
        found[key] = (o.partition, JSON.loads(o.value), o.timestamp_ms)
    return found


@pytest.mark.parametrize("how", ["inner", "left"])
@settings(max_examples=150, deadline=None)
@given(history=changes)
def test_final_rows_equal_a_replay_of_both_tables(how: str, history: list[Change]) -> None:
    rows = rows_of(orders_app(how))
    got = rows.final_join(as_records(history, "orders"), as_records(history, "customers"))
    assert decoded(got) == brute_force(history, how)


def test_the_latest_record_of_a_key_is_the_last_by_order_not_by_arrival() -> None:
    rows = rows_of(orders_app("left"))
    left: list[TableRecord] = [
        (b"o1", json.dumps({"customer": None, "n": 2}).encode(), (1, 9), 5),
        (b"o1", json.dumps({"customer": None, "n": 1}).encode(), (1, 3), 7),
        (b"o2", json.dumps({"customer": None, "n": 1}).encode(), (0, 1), 1),
        (b"o2", None, (0, 2), 2),  # a tombstone deletes the row
    ]
    assert decoded(rows.final_join(left, [])) == {
        "o1": (partition_for_key(b"o1", OUT_PARTITIONS), {"n": 2, "customer": None}, 5)
    }


@pytest.mark.parametrize("how", ["inner", "left"])
async def test_final_rows_equal_the_workers_result_table(how: str) -> None:
    """Random changes through the test driver (the workers' subscription/response logic):
    the output's last value per key is the final rows."""
    rng = random.Random(11 if how == "inner" else 12)
    history: list[Change] = []
    for _ in range(120):
        if rng.random() < 0.6:
            order = None
            if rng.random() > 0.15:
                customer = rng.choice([None, "c1", "c2", "c3", "c4"])
                order = {"customer": customer, "n": rng.randrange(20)}
            history.append(("orders", f"o{rng.randrange(8)}", order))
        else:
            customer_row = None if rng.random() < 0.2 else {"name": rng.choice("abc")}
            history.append(("customers", f"c{rng.randrange(1, 5)}", customer_row))
    history += [("customers", "c1", {"name": "z"}), ("orders", "o9", {"customer": "c1", "n": 1})]
    app = orders_app(how)
    last: dict[str, Any] = {}
    async with TestDriver(app) as driver:
        for side, key, value in history:
            await driver.put(side, key=key, value=value)
            await driver.drain()
        for event in driver.records("enriched"):
            last[event.key] = event.value
    worker = {k: v for k, v in last.items() if v is not None}
    got = rows_of(app).final_join(as_records(history, "orders"), as_records(history, "customers"))
    assert {k: v[1] for k, v in decoded(got).items()} == worker
    assert worker  # the history leaves rows


def test_the_backfill_refuses_the_change_history_and_a_start_time() -> None:
    from streamjoin.errors import ConfigurationError
    from streamjoin.spark import FileSink, FileSource, backfill

    app = orders_app("inner")
    sink = FileSink("out")
    with pytest.raises(ConfigurationError, match="only its final rows can be backfilled"):
        backfill(app, "enriched", source=FileSource(["nowhere.json"]), output=sink)
    with pytest.raises(ConfigurationError, match="close_windows_at_end"):
        backfill(
            app,
            "enriched",
            source=FileSource(["nowhere.json"]),
            output=sink,
            final_only=True,
            close_windows_at_end=True,
        )
    with pytest.raises(ConfigurationError, match="a start time does not apply"):
        backfill(
            app,
            "enriched",
            source=FileSource(["nowhere.json"], start_timestamp_ms=5),
            output=sink,
            final_only=True,
        )


def test_a_failing_foreign_key_names_the_join_and_the_key() -> None:
    from streamjoin.errors import JoinError

    rows = rows_of(orders_app("inner"))
    with pytest.raises(JoinError, match=r"join 'enriched': foreign_key failed.*o1"):
        rows.left_row(b"o1", json.dumps({"n": 1}).encode(), 1)


@pytest.mark.spark
def test_a_spark_backfill_from_files_writes_the_final_rows(tmp_path: Any) -> None:
    """Files without offsets: the latest record per key by timestamp; the rows as written
    by the job equal the brute-force join."""
    from streamjoin.spark import FileSink, FileSource, backfill
    from streamjoin.spark.testing import shared_test_session

    rng = random.Random(7)
    history: list[Change] = []
    for _ in range(300):
        if rng.random() < 0.6:
            order = (
                None
                if rng.random() < 0.1
                else {
                    "customer": rng.choice([None, "c1", "c2", "c3"]),
                    "n": rng.randrange(20),
                }
            )
            history.append(("orders", f"o{rng.randrange(30)}", order))
        else:
            customer = None if rng.random() < 0.2 else {"name": rng.choice("ab")}
            history.append(("customers", f"c{rng.randrange(1, 4)}", customer))
    source = tmp_path / "history.json"
    source.write_text(
        "".join(
            json.dumps(
                {
                    "topic": side,
                    "key": key,
                    "value": None if value is None else json.dumps(value),
                    "timestamp": 1000 + i,
                }
            )
            + "\n"
            for i, (side, key, value) in enumerate(history)
        )
    )
    out = tmp_path / "final"
    result = backfill(
        orders_app("left"),
        "enriched",
        source=FileSource([str(source)]),
        output=FileSink(str(out), format="json"),
        final_only=True,
        spark=shared_test_session(),
    )
    written = [json.loads(line) for f in out.glob("*.json") for line in f.read_text().splitlines()]
    got = {w["key"]: (w["partition"], json.loads(w["value"]), w["timestamp"]) for w in written}
    assert len(written) == len(got) == result.outputs
    assert result.records_read == len(history)
    assert got == brute_force(history, "left")
