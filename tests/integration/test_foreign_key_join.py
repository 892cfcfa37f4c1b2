"""The foreign-key join on the real broker: orders (3 partitions) joined to customers (2) by
``order["customer"]``, with foreign-key changes, null foreign keys and deletes on both
sides, one worker killed with SIGKILL mid-run and restarted; its output must end equal to
the brute-force join of the final tables, row for row."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import Workers, committed_offsets, end_offsets, sleep_alive

ORDERS, CUSTOMERS = 3, 2  # partitions: the two tables are not co-partitioned

APP = '''
"""Orders joined to their customers by a foreign key (written by test_foreign_key_join.py)."""
import os
import time

import streamjoin

app = streamjoin.App(
    os.environ["SJT_APP_ID"],
    broker=os.environ["SJT_BROKER"],
    processing_guarantee=os.environ["SJT_GUARANTEE"],
    commit_interval=0.2,
)
orders = app.topic(os.environ["SJT_ORDERS"], key_serializer="str", partitions=3)
customers = app.topic(os.environ["SJT_CUSTOMERS"], key_serializer="str", partitions=2)
out = app.topic(os.environ["SJT_OUTPUT"], key_serializer="str", partitions=3)


def customer_of(order):
    time.sleep(0.003)  # some work: a kill lands mid-run
    return order["customer"]


@app.join(
    app.topic_table(orders),
    app.topic_table(customers),
    foreign_key=customer_of,
    how=os.environ["SJT_HOW"],
    output=out,
    name="enriched",
)
def enrich(key, order, customer):
    return {"order": order, "customer": customer}
'''

Row = dict[str, Any]


class Tables:
    """The inputs as written: each key's latest row (what the workers' tables end with)."""

    def __init__(self) -> None:
        self.orders: dict[str, Row] = {}
        self.customers: dict[str, Row] = {}
        self.records: dict[str, list[tuple[str, Row | None]]] = {"orders": [], "customers": []}
        self.log: list[tuple[str, Row | None]] = []

    def write(self, side: str, key: str, row: Row | None) -> None:
        table = self.orders if side == "orders" else self.customers
        if row is None:
            table.pop(key, None)
        else:
            table[key] = row
        self.records[side].append((key, row))
        self.log.append((key, row))

    def history_of(self, keys: list[str]) -> dict[str, list[Row | None]]:
        """Every write of these orders, and of the customers they named, in order."""
        wanted = set(keys)
        for key in keys:
            wanted |= {row["customer"] for k, row in self.log if k == key and row is not None}
        return {k: [row for kk, row in self.log if kk == k] for k in sorted(wanted - {None})}

    def take(self) -> dict[str, list[tuple[str, Row | None]]]:
        taken, self.records = self.records, {"orders": [], "customers": []}
        return taken

    def joined(self, how: str) -> dict[str, Row]:
        """The brute-force join of the tables as they are now."""
        out = {}
        for key, order in self.orders.items():
            fk = order["customer"]
            customer = None if fk is None else self.customers.get(fk)
            if customer is not None or how == "left":
                out[key] = {"order": order, "customer": customer}
        return out


def round_of_changes(tables: Tables, rng: random.Random, version: int, size: int) -> None:
    """``size`` random writes: orders created, moved to another (or a missing, or no)
    customer, deleted; customers created, updated, deleted."""
    for _ in range(size):
        if rng.random() < 0.7:
            key = f"o{rng.randrange(150)}"
            if key in tables.orders and rng.random() < 0.15:
                tables.write("orders", key, None)
            else:
                fk = None if rng.random() < 0.05 else f"c{rng.randrange(24)}"
                tables.write("orders", key, {"customer": fk, "v": version})
        else:
            key = f"c{rng.randrange(24)}"
            if key in tables.customers and rng.random() < 0.25:
                tables.write("customers", key, None)
            else:
                tables.write("customers", key, {"name": f"{key}-v{version}"})


async def produce_rows(
    bootstrap: str, env: dict[str, str], tables: Tables, *, pause_every_20: float = 0.0
) -> None:
    """Send the writes made since the last call (None: a tombstone), in order; with
    ``pause_every_20``, a pause of that many seconds after every 20 (acknowledged) writes."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        sent = 0
        for side, records in tables.take().items():
            topic = env["SJT_ORDERS" if side == "orders" else "SJT_CUSTOMERS"]
            for key, row in records:
                value = None if row is None else json.dumps(row).encode()
                await producer.send(topic, value, key=key.encode())
                sent += 1
                if pause_every_20 and sent % 20 == 0:
                    await producer.flush()
                    await asyncio.sleep(pause_every_20)
        await producer.flush()
    finally:
        await producer.stop()


async def output_state(bootstrap: str, topic: str) -> tuple[dict[str, Row], int]:
    """The output read to its end (``read_committed``): each key's last value (a None
    value deletes it), and how many records repeat their key's previous value (the join
    sends a row only when it changed: a repeat is a replayed send)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    await consumer.start()
    last: dict[str, Row | None] = {}
    repeats = 0
    try:
        tps = [TopicPartition(topic, p) for p in range(ORDERS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            batch = await consumer.getmany(timeout_ms=500)
            if not batch:
                break  # (a partition ending in a transaction marker)
            for records in batch.values():
                for r in records:
                    key = r.key.decode()
                    value = None if r.value is None else json.loads(r.value)
                    repeats += key in last and last[key] == value
                    last[key] = value
    finally:
        await consumer.stop()
    return {k: v for k, v in last.items() if v is not None}, repeats


async def inputs_committed(bootstrap: str, workers: Workers, timeout: float = 90.0) -> None:
    """Until the group has committed both input topics to their ends (their producer is
    not transactional: exact ends); fails at once if the worker exits."""
    env = workers.env
    topics = [(env["SJT_ORDERS"], ORDERS), (env["SJT_CUSTOMERS"], CUSTOMERS)]
    ends = {t: await end_offsets(bootstrap, t, n) for t, n in topics}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = workers.procs["w1"].poll()
        assert code is None, f"the worker exited with {code}:\n{workers.log_of('w1')[-6000:]}"
        committed = {
            t: await committed_offsets(bootstrap, env["SJT_APP_ID"], t, n) for t, n in topics
        }
        if all(c >= e for t, _ in topics for c, e in zip(committed[t], ends[t], strict=True)):
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"inputs never committed to {ends}\n{workers.log_of('w1')[-6000:]}")


async def kill_mid_run(bootstrap: str, workers: Workers, committed_before: int) -> int:
    """SIGKILL the worker as soon as it has committed some of the orders past
    ``committed_before`` (its foreign-key function works 3 ms an order: it is mid-run then); the
    orders committed then."""
    env = workers.env
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        committed = await committed_offsets(bootstrap, env["SJT_APP_ID"], env["SJT_ORDERS"], ORDERS)
        if sum(committed) > committed_before:
            workers.stop("w1", signal.SIGKILL)
            return sum(committed)
        await sleep_alive(workers, "w1", 0.05)
    raise AssertionError(f"the worker committed no new order\n{workers.log_of('w1')[-6000:]}")


def differences(got: dict[str, Row], want: dict[str, Row]) -> dict[str, int]:
    return {
        "missing": len(want.keys() - got.keys()),
        "extra": len(got.keys() - want.keys()),
        "wrong": sum(got[k] != want[k] for k in want.keys() & got.keys()),
    }


@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_orders_joined_to_customers_end_equal_to_the_brute_force_join_through_a_kill_9(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    guarantee: str,
    how: str,
) -> None:
    (tmp_path / "fk_orders_app.py").write_text(APP)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "SJT_APP_ID": unique_topic("fk"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_GUARANTEE": guarantee,
        "SJT_HOW": how,
        "SJT_ORDERS": unique_topic("orders"),
        "SJT_CUSTOMERS": unique_topic("customers"),
        "SJT_OUTPUT": unique_topic("enriched"),
    }
    await ensure_topics(
        kafka_bootstrap,
        [
            TopicSpec(env["SJT_ORDERS"], ORDERS, 1),
            TopicSpec(env["SJT_CUSTOMERS"], CUSTOMERS, 1),
            TopicSpec(env["SJT_OUTPUT"], ORDERS, 1),
        ],
    )
    rng = random.Random(34)
    tables = Tables()
    for i in range(20):
        tables.write("customers", f"c{i}", {"name": f"c{i}-v0"})
    round_of_changes(tables, rng, 1, 400)
    await produce_rows(kafka_bootstrap, env, tables)

    workers = Workers("fk_orders_app:app", env, tmp_path)
    try:
        workers.start("w1")
        await inputs_committed(kafka_bootstrap, workers)
        before = sum(await end_offsets(kafka_bootstrap, env["SJT_ORDERS"], ORDERS))
        # more changes, and the worker killed while it works through them (they are sent
        # over 3 s, so the kill lands while orders are still coming)
        round_of_changes(tables, rng, 2, 600)
        producing = asyncio.ensure_future(
            produce_rows(kafka_bootstrap, env, tables, pause_every_20=0.1)
        )
        at_kill = await kill_mid_run(kafka_bootstrap, workers, before)
        await producing
        assert at_kill < sum(await end_offsets(kafka_bootstrap, env["SJT_ORDERS"], ORDERS)), (
            "the worker had read every order before the kill: the kill tested nothing"
        )
        round_of_changes(tables, rng, 3, 400)
        await produce_rows(kafka_bootstrap, env, tables)
        workers.start("w1")
        await inputs_committed(kafka_bootstrap, workers)
        want = tables.joined(how)
        # the internal topics settle after the inputs: read until the output agrees
        deadline = time.monotonic() + 30
        while True:
            got, repeats = await output_state(kafka_bootstrap, env["SJT_OUTPUT"])
            if got == want or time.monotonic() > deadline:
                break
            await sleep_alive(workers, "w1", 0.5)
        assert workers.stop("w1") == 0
        got, repeats = await output_state(kafka_bootstrap, env["SJT_OUTPUT"])
    finally:
        workers.close()
    extra = {k: got[k] for k in got.keys() - want.keys()}
    wrong = {k: (got[k], want[k]) for k in want.keys() & got.keys() if got[k] != want[k]}
    assert differences(got, want) == {"missing": 0, "extra": 0, "wrong": 0}, (
        f"missing {sorted(want.keys() - got.keys())[:5]}, extra {list(extra.items())[:5]}, "
        f"wrong {list(wrong.items())[:5]}; history {tables.history_of([*extra, *wrong][:2])}"
    )
    assert len(want) > 50  # (the test joins something)
    if guarantee == "exactly_once":
        assert repeats == 0, f"{repeats} replayed sends reached read_committed readers"
