"""Global tables on the real broker: two workers each answer every key from their own
copy (no forwarding), the stream-global-table join enriches every event (inner and left,
counting missing, duplicated and wrong rows), and a worker killed with SIGKILL resumes
its copy from the stored positions (not from offset 0) and stays exact.

One test per guarantee (~6 s each; the workers start once):
tests/integration/apps/global_enricher.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer

import streamjoin
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import Workers, produce, read_all, wait_for_group

USER_PARTITIONS = 3
PARTITIONS = 4
USERS = 600
WEB = ["--web-port", "0"]
RESTORE_LINE = re.compile(r"restoring global tables users: (\d+) records to read")


@pytest.fixture
def enrichers(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Workers]:
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("global"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_USERS": unique_topic("users"),
        "SJT_CLICKS": unique_topic("clicks"),
        "SJT_INNER": unique_topic("inner"),
        "SJT_LEFT": unique_topic("left"),
        "SJT_PARTITIONS": str(PARTITIONS),
        "SJT_USER_PARTITIONS": str(USER_PARTITIONS),
        "PYTHONUNBUFFERED": "1",
    }
    group = Workers("tests.integration.apps.global_enricher:app", env, tmp_path)
    yield group
    group.close()


def _country(i: int, version: int) -> str:
    return f"c{(i * 7 + version) % 11}"


async def _produce_users(bootstrap: str, topic: str, rows: Mapping[str, str | None]) -> None:
    """One record per user: its country, or a tombstone (None)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for user, country in rows.items():
            value = None if country is None else json.dumps({"country": country}).encode()
            await producer.send(topic, value, key=user.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def _hosts(workers: Workers, bootstrap: str, names: set[str]) -> dict[str, str]:
    info = await wait_for_group(
        bootstrap,
        workers.env["SJT_APP_ID"],
        lambda i: {m.instance_id for m in i.members} == names and all(m.host for m in i.members),
        workers,
    )
    return {workers.name_of(m): str(m.host) for m in info.members}


async def _wait_log(workers: Workers, name: str, pattern: str, count: int = 1) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = workers.log_of(name)
        if text.count(pattern) >= count:
            return text
        await asyncio.sleep(0.2)
    raise AssertionError(f"{name}: no {pattern!r}\n{workers.logs()}")


async def _read_every_key(host: str, truth: dict[str, str | None]) -> Counter[str]:
    """Ask ``host`` for every user: counts of right answers, wrong ones, and answers
    served by another worker (a forward)."""
    seen: Counter[str] = Counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for user, country in truth.items():
            async with session.get(f"http://{host}/tables/users/{user}") as response:
                if response.status == 404:
                    seen["right" if country is None else "missing"] += 1
                    continue
                body: dict[str, Any] = await response.json()
                if response.status != 200:
                    seen[f"status {response.status}"] += 1
                    continue
                seen["right" if body["value"] == {"country": country} else "wrong"] += 1
                if body["served_by"] != host or not body.get("global"):
                    seen["forwarded"] += 1
    return seen


def _check_join(
    outputs: list[tuple[str, str, dict[str, bytes]]],
    clicks: dict[str, str],
    truth: dict[str, str | None],
    inner: bool,
) -> Counter[str]:
    """Missing, duplicated and wrong rows of one join's output (each click is expected
    once, with its user's country; an inner join drops clicks of unknown users)."""
    expected = {
        click: {"user": user, "country": truth.get(user)}
        for click, user in clicks.items()
        if not inner or truth.get(user) is not None
    }
    got = Counter(key for key, _, _ in outputs)
    counts: Counter[str] = Counter()
    for key, value, _ in outputs:
        if key not in expected or json.loads(value) != expected[key]:
            counts["wrong"] += 1
    counts["missing"] = sum(1 for click in expected if got[click] == 0)
    counts["duplicated"] = sum(n - 1 for n in got.values() if n > 1)
    counts["expected"] = len(expected)
    return counts


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_global_table_queries_join_and_kill_restart(
    kafka_bootstrap: str, enrichers: Workers, guarantee: str
) -> None:
    env = enrichers.env
    env["SJT_GUARANTEE"] = guarantee
    truth: dict[str, str | None] = {f"u{i}": _country(i, 0) for i in range(USERS)}
    for i in range(0, USERS, 10):
        truth[f"u{i}"] = None  # deleted after being written
    first = {f"u{i}": _country(i, 0) for i in range(USERS)}
    await ensure_topics(kafka_bootstrap, [TopicSpec(env["SJT_USERS"], USER_PARTITIONS)])
    await _produce_users(kafka_bootstrap, env["SJT_USERS"], first)
    await _produce_users(
        kafka_bootstrap, env["SJT_USERS"], {u: None for u, c in truth.items() if c is None}
    )
    for name in ("a", "b"):
        enrichers.start(name, extra=WEB)
    hosts = await _hosts(enrichers, kafka_bootstrap, {"a", "b"})
    for name in ("a", "b"):
        text = await _wait_log(enrichers, name, "restored global tables users")
        restore = RESTORE_LINE.search(text)
        assert restore is not None and int(restore.group(1)) == USERS + USERS // 10

    # 1. both workers answer every key from their own copy, and report the restore
    for name, host in hosts.items():
        seen = await _read_every_key(host, truth)
        assert seen == Counter(right=USERS), (name, seen)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{host}/status.json") as response,
        ):
            status = (await response.json())["global_tables"]["users"]
        assert status["restored"] and status["restore_total"] == USERS + USERS // 10, status

    # 2. the joins: clicks name known, deleted and never-seen users
    clicks = {f"k{n}": f"u{(n * 13) % (USERS + 50)}" for n in range(1500)}
    await produce(
        kafka_bootstrap,
        env["SJT_CLICKS"],
        [(click, json.dumps({"user": user})) for click, user in clicks.items()],
    )
    await _check_joins(kafka_bootstrap, env, clicks, truth)

    # 3. kill -9 worker a; the table changes while it is down; its restart reads only
    # the new records (from its stored positions) and answers exactly
    enrichers.stop("a", signal.SIGKILL)
    changed = {f"u{i}": _country(i, 1) for i in range(1, USERS, 7)}
    added = {f"u{i}": _country(i, 2) for i in range(USERS, USERS + 40)}
    await _produce_users(kafka_bootstrap, env["SJT_USERS"], {**changed, **added})
    truth.update(changed)
    truth.update(added)
    enrichers.start("a", extra=WEB)
    text = await _wait_log(enrichers, "a", "restored global tables users", count=2)
    restores = RESTORE_LINE.findall(text)
    assert [int(n) for n in restores] == [USERS + USERS // 10, len(changed) + len(added)]
    before = hosts
    deadline = time.monotonic() + 20
    while True:  # b follows in the background: give it a moment to read the changes
        # (a restores its global table before it joins the group: until its rejoin, the
        # group may still show the address of the a that was killed)
        hosts = await _hosts(enrichers, kafka_bootstrap, {"a", "b"})
        if hosts["a"] == before["a"]:
            assert time.monotonic() < deadline, f"a still advertises {hosts['a']}"
            await asyncio.sleep(0.5)
            continue
        answers = {name: await _read_every_key(host, truth) for name, host in hosts.items()}
        if all(s == Counter(right=len(truth)) for s in answers.values()):
            break
        assert time.monotonic() < deadline, answers
        await asyncio.sleep(0.5)
    # both copies are current: clicks now meet the new rows, on either worker
    later = {f"k{n}": f"u{(n * 17) % (USERS + 50)}" for n in range(1500, 2500)}
    await produce(
        kafka_bootstrap,
        env["SJT_CLICKS"],
        [(click, json.dumps({"user": user})) for click, user in later.items()],
    )
    await _check_joins(kafka_bootstrap, env, later, truth)
    assert enrichers.stop_all() == {"a": 0, "b": 0}


async def _check_joins(
    bootstrap: str, env: dict[str, str], clicks: dict[str, str], truth: dict[str, str | None]
) -> None:
    """Both joins' outputs for ``clicks`` (other keys in the topics are ignored): no
    missing, duplicated or wrong row."""
    isolation = "read_committed" if env["SJT_GUARANTEE"] == "exactly_once" else "read_uncommitted"
    for topic, inner in ((env["SJT_INNER"], True), (env["SJT_LEFT"], False)):
        expected = _check_join([], clicks, truth, inner)["expected"]
        outputs = [
            out
            for out in await read_all(bootstrap, topic, expected, isolation_level=isolation)
            if out[0] in clicks
        ]
        counts = _check_join(outputs, clicks, truth, inner)
        assert counts == Counter(expected=expected), (topic, counts)


@pytest.mark.spark
async def test_spark_bootstrapped_copy_is_resumed_not_reread(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The Spark bootstrap writes the copy a worker opens: the worker reads only the rows
    produced after it, and serves the bootstrapped ones (deletes included)."""
    from streamjoin.spark.global_bootstrap import bootstrap_global_table
    from streamjoin.spark.sources import KafkaSource
    from streamjoin.spark.testing import shared_test_session

    state_dir = tmp_path / "state"
    app = streamjoin.App(
        unique_topic("gboot"), broker=f"kafka://{kafka_bootstrap}", state_dir=state_dir
    )
    users = app.topic(
        unique_topic("users"), key_serializer="str", value_serializer="json", partitions=3
    )
    table = app.global_table(users, name="users")
    await ensure_topics(kafka_bootstrap, [TopicSpec(users.name, USER_PARTITIONS)])
    truth: dict[str, str | None] = {f"u{i}": _country(i, 0) for i in range(200)}
    await _produce_users(kafka_bootstrap, users.name, truth)
    deleted = {f"u{i}": None for i in range(0, 200, 9)}
    await _produce_users(kafka_bootstrap, users.name, deleted)
    truth.update(deleted)

    spark = await asyncio.to_thread(shared_test_session)
    result = await asyncio.to_thread(
        bootstrap_global_table, app, "users", source=KafkaSource(kafka_bootstrap), spark=spark
    )
    assert result.keys == sum(1 for c in truth.values() if c is not None)
    assert sum(result.positions.values()) == 200 + len(deleted)
    later = {f"u{i}": _country(i, 3) for i in range(195, 215)}
    await _produce_users(kafka_bootstrap, users.name, later)
    truth.update(later)

    async with app:
        worker = app._worker
        assert worker is not None and worker.global_tables is not None
        assert worker.global_tables.progress["users"].restore_total == len(later)
        for user, country in truth.items():
            assert table.get(user) == (None if country is None else {"country": country})
