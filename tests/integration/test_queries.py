"""Interactive queries through the real broker: three counting workers serve every key.

The counter app (tests/integration/apps/counter.py) counts events per key in table
``counts`` with one standby replica; each worker runs its web server on a free port and
advertises it as its query address. The tests read the group's description to learn
each member's address and partitions, and check the answers against the true counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

import streamjoin
from streamjoin.errors import KeyNotFound, QueryUnavailable, StartupError, UnknownTableError
from streamjoin.partitioner import partition_for_key
from streamjoin.query import TableClient
from streamjoin.runtime.group.group_info import GroupInfo
from streamjoin.runtime.ops.web import WebServer
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.runtime.transport.consumer import Fetcher
from streamjoin.runtime.transport.producer import KafkaSender
from streamjoin.state.windows import TumblingWindows
from tests.integration.support import (
    Workers,
    committed_offsets,
    produce,
    sizes,
    wait_for_group,
)

PARTITIONS = 6
WEB = ["--web-port", "0"]


def _keys(n: int) -> list[str]:
    return [f"user-{i}" for i in range(n)]


async def _wait_committed(bootstrap: str, group: str, topic: str, total: int) -> None:
    deadline = time.monotonic() + 90
    done = 0
    while time.monotonic() < deadline:
        done = sum(await committed_offsets(bootstrap, group, topic, PARTITIONS))
        if done >= total:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"only {done} of {total} offsets committed")


def _owners(info: GroupInfo, source: str) -> dict[int, str]:
    return {p: m.host for m in info.members for p in m.active.get(source, []) if m.host}


def _standbys(info: GroupInfo, changelog: str) -> dict[int, str]:
    return {p: m.host for m in info.members for p in m.standby.get(changelog, []) if m.host}


async def _get(client: TableClient, table: str, key: str, **kw: object) -> dict[str, object]:
    return await asyncio.to_thread(client.get, table, key, **kw)  # type: ignore[arg-type]


async def _watch(
    hosts: list[str],
    keys: list[str],
    truth: Counter[str],
    stop: asyncio.Event,
    seen: Counter[int],
    wrong: list[tuple[str, object]],
) -> None:
    """Read every key through every host in turn until ``stop``; count the statuses and
    keep any 200 whose value is not the true count."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while not stop.is_set():
            for host in hosts:
                for key in keys:
                    try:
                        async with session.get(f"http://{host}/tables/counts/{key}") as response:
                            seen[response.status] += 1
                            if response.status == 200:
                                value = (await response.json())["value"]
                                if value != truth[key]:
                                    wrong.append((key, value))
                            elif response.status != 503:
                                wrong.append((key, response.status))
                    except aiohttp.ClientError:
                        seen[0] += 1  # a worker stopping mid-answer: not a wrong value
            await asyncio.sleep(0.05)


async def _start_three(counters: Workers, kafka_bootstrap: str) -> GroupInfo:
    counters.env["SJT_STANDBYS"] = "1"
    for name in ("w1", "w2", "w3"):
        counters.start(name, extra=WEB)
    source = counters.env["SJT_SOURCE"]
    return await wait_for_group(
        kafka_bootstrap,
        counters.env["SJT_APP_ID"],
        lambda i: sizes(i, source) == [2, 2, 2] and all(m.host for m in i.members),
        counters,
    )


async def test_every_key_reads_the_owners_count_through_any_worker(
    kafka_bootstrap: str, counters: Workers
) -> None:
    env = counters.env
    group, source = env["SJT_APP_ID"], env["SJT_SOURCE"]
    keys = _keys(30)
    events = [(keys[i % len(keys)], f"e{i}") for i in range(600)]
    truth = Counter(k for k, _ in events)
    info = await _start_three(counters, kafka_bootstrap)
    await produce(kafka_bootstrap, source, events)
    await _wait_committed(kafka_bootstrap, group, source, len(events))
    owners = _owners(info, source)
    hosts = sorted({m.host for m in info.members if m.host})
    assert len(hosts) == 3 and all(h.startswith("127.0.0.1:") for h in hosts), hosts

    for host in hosts:
        forwarding = TableClient([host], retry_for=15)
        redirected = TableClient([host], retry_for=15, redirect=True)
        for key in keys:
            partition = partition_for_key(key.encode(), PARTITIONS)
            for client in (forwarding, redirected):
                answer = await _get(client, "counts", key)
                assert answer["value"] == truth[key], (host, key, answer)
                assert answer["partition"] == partition
                assert answer["served_by"] == owners[partition], (host, key, answer)
                assert answer["stale"] is False and answer["lag"] is None

    client = TableClient(hosts)
    with pytest.raises(KeyNotFound, match="not in table 'counts'"):
        await _get(client, "counts", "nobody")
    with pytest.raises(UnknownTableError, match="known tables: counts"):
        await _get(client, "nope", "user-1")


async def test_standby_reads_with_allow_stale_report_their_lag(
    kafka_bootstrap: str, counters: Workers
) -> None:
    env = counters.env
    group, source = env["SJT_APP_ID"], env["SJT_SOURCE"]
    changelog = f"{group}-counts-changelog"
    keys = _keys(12)
    events = [(keys[i % len(keys)], f"e{i}") for i in range(240)]
    truth = Counter(k for k, _ in events)
    info = await _start_three(counters, kafka_bootstrap)
    await produce(kafka_bootstrap, source, events)
    await _wait_committed(kafka_bootstrap, group, source, len(events))
    standbys = _standbys(info, changelog)
    assert len(standbys) == PARTITIONS, info

    # standby lags are measured every few seconds: wait until each standby has one
    deadline = time.monotonic() + 30
    answers: dict[str, dict[str, object]] = {}
    while time.monotonic() < deadline and len(answers) < len(keys):
        for key in keys:
            host = standbys[partition_for_key(key.encode(), PARTITIONS)]
            answer = await _get(TableClient([host]), "counts", key, allow_stale=True)
            if answer["stale"]:
                answers[key] = answer
        await asyncio.sleep(0.5)
    assert len(answers) == len(keys), f"standbys answered only {sorted(answers)}"
    for key, answer in answers.items():
        lag = answer["lag"]
        assert isinstance(lag, int) and lag >= 0, answer
        assert answer["served_by"] == standbys[answer["partition"]]  # type: ignore[index]
        # a standby is behind by at most its lag: caught up, it holds the owner's count
        value = answer["value"]
        assert isinstance(value, int) and value <= truth[key]
        if lag == 0:
            assert value == truth[key], answer
    # without allow_stale the same standby forwards to the owner: fresh
    key = keys[0]
    host = standbys[partition_for_key(key.encode(), PARTITIONS)]
    fresh = await _get(TableClient([host]), "counts", key)
    assert fresh["stale"] is False and fresh["served_by"] != host


async def test_reads_route_to_the_new_owner_after_a_member_leaves(
    kafka_bootstrap: str, counters: Workers
) -> None:
    env = counters.env
    group, source = env["SJT_APP_ID"], env["SJT_SOURCE"]
    keys = _keys(24)
    events = [(keys[i % len(keys)], f"e{i}") for i in range(480)]
    truth = Counter(k for k, _ in events)
    info = await _start_three(counters, kafka_bootstrap)
    await produce(kafka_bootstrap, source, events)
    await _wait_committed(kafka_bootstrap, group, source, len(events))
    leaving = next(m for m in info.members if m.instance_id == "w3")
    staying = sorted(m.host for m in info.members if m.host and m.instance_id != "w3")
    # Reads keep coming through the staying workers while w3 leaves and its partitions move
    # (restored from their standbys): every answer must be the true count or a 503.
    watching = asyncio.Event()
    seen: Counter[int] = Counter()
    wrong: list[tuple[str, object]] = []
    watcher = asyncio.create_task(_watch(staying, keys, truth, watching, seen, wrong))
    await asyncio.sleep(1.0)
    assert await asyncio.to_thread(counters.stop, "w3", signal.SIGTERM) == 0

    # one rebalance later (cooperative: the revocation plus its follow-up), every read
    # through either remaining worker is answered by the new owner, with the same count
    after = await wait_for_group(
        kafka_bootstrap, group, lambda i: sizes(i, source) == [3, 3], counters
    )
    await asyncio.sleep(2.0)
    watching.set()
    await watcher
    assert not wrong, f"wrong answers while a member left: {wrong[:5]}"
    assert seen[200] > 0, seen
    owners = _owners(after, source)
    remaining = sorted(set(owners.values()))
    assert leaving.host not in remaining
    started = time.monotonic()
    for host in remaining:
        client = TableClient([host], retry_for=20)
        for key in keys:
            try:
                answer = await _get(client, "counts", key)
            except QueryUnavailable as exc:
                raise AssertionError(f"{host} {key}: {exc}\n{counters.logs()}") from exc
            assert answer["value"] == truth[key], (host, key, answer)
            assert answer["served_by"] == owners[answer["partition"]]  # type: ignore[index]
    assert time.monotonic() - started < 30


# ------------------------------------------------------------------ one embedded worker


@dataclass(frozen=True)
class UserKey:
    user: str


def query_app(app_id: str, bootstrap: str, source_name: str, state_dir: Path) -> streamjoin.App:
    """Counts per key, in total and per minute; a bearer token guards the queries."""
    app = streamjoin.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        commit_interval=0.2,
        state_dir=state_dir,
        web_port=0,
        query_token="s3cret",
    )
    source = app.topic(source_name, key_serializer="str", value_serializer="str", partitions=3)
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)
    per_minute = app.table(
        "per_minute",
        default=int,
        key_serializer="str",
        copartitioned_with=source,
        window=TumblingWindows(size_ms=60_000, retention_ms=3_600_000),
    )
    app.table("profiles", key_serializer=UserKey, copartitioned_with=source)

    @app.agent(source, name="count")
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1
            per_minute[event.key] += 1

    return app


async def test_windows_tokens_bad_keys_and_the_cli_through_one_worker(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    source = unique_topic("events")
    app = query_app(unique_topic("qry"), kafka_bootstrap, source, tmp_path / "state")
    events = [(f"k{i % 5}", f"e{i}") for i in range(50)]
    truth = Counter(k for k, _ in events)
    async with app:
        assert app.web_url is not None and app.web_url.startswith("http://127.0.0.1:")
        host = app.web_url.removeprefix("http://").rstrip("/")
        await produce(kafka_bootstrap, source, events)
        client = TableClient([host], token="s3cret", retry_for=20)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if (await _get(client, "counts", "k4"))["value"] == truth["k4"]:
                    break
            except KeyNotFound:
                pass
            await asyncio.sleep(0.3)
        for key, n in truth.items():
            assert (await _get(client, "counts", key))["value"] == n
            answer = await _get(client, "per_minute", key, from_ms=0)
            windows = answer["windows"]
            assert isinstance(windows, list) and windows
            assert sum(w["value"] for w in windows) == n
            assert all(w["end"] - w["start"] == 60_000 for w in windows)
        with pytest.raises(KeyNotFound, match="no windows"):
            await _get(client, "per_minute", "k1", from_ms=0, to_ms=1)

        # app.locate: this worker owns every partition
        location = app.locate("counts", "k1")
        assert location.owner == host
        assert location.partition == partition_for_key(b"k1", 3)

        async with aiohttp.ClientSession() as session:
            url = f"http://{host}/tables/counts/k1"
            async with session.get(url) as response:
                assert response.status == 401
                assert "Bearer" in (await response.json())["message"]
            bearer = {"Authorization": "Bearer s3cret"}
            async with session.get(url, headers={"Authorization": "Bearer wrong"}) as response:
                assert response.status == 401
            bad = f"http://{host}/tables/profiles/not-a-user"
            async with session.get(bad, headers=bearer) as response:
                assert response.status == 400
                body = await response.json()
                assert "json[UserKey]" in body["message"], body
            async with session.get(f"http://{host}/tables/x/k1", headers=bearer) as response:
                assert response.status == 404
                assert "counts, per_minute, profiles" in (await response.json())["message"]
            # no write endpoints
            async with session.put(url, headers=bearer, data=b"1") as response:
                assert response.status == 405

        cli = [sys.executable, "-m", "streamjoin.cli", "table", "get", "--remote", host]
        env = {**os.environ, "STREAMJOIN_QUERY_TOKEN": "s3cret"}
        done = await asyncio.to_thread(
            subprocess.run, [*cli, "counts", "k2"], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == truth["k2"]
        assert f"served by {host}" in done.stderr
        missing = await asyncio.to_thread(
            subprocess.run, [*cli, "counts", "nobody"], capture_output=True, text=True, env=env
        )
        assert missing.returncode == 1 and "not in table 'counts'" in missing.stderr


async def test_a_start_that_fails_after_the_web_server_started_closes_it(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The web server now starts before the group is joined; a failure after it (here: the
    consumer's start) must not leave its port open, nor the started producer to the garbage
    collector (which printed "Unclosed AIOKafkaProducer" when the test run ended)."""
    app = query_app(unique_topic("qry"), kafka_bootstrap, unique_topic("events"), tmp_path)
    started: list[WebServer] = []
    original = WebServer.start
    senders: list[KafkaSender] = []
    original_sender_start = KafkaSender.on_start

    async def recording_sender(self: KafkaSender) -> None:
        await original_sender_start(self)
        senders.append(self)

    async def recording(self: WebServer) -> None:
        await original(self)
        started.append(self)

    async def failing(self: Fetcher) -> None:
        raise StartupError("the consumer cannot start (test)")

    monkeypatch.setattr(WebServer, "start", recording)
    monkeypatch.setattr(Fetcher, "start", failing)
    monkeypatch.setattr(KafkaSender, "on_start", recording_sender)
    with pytest.raises(StartupError, match="cannot start"):
        await app.start()
    [server] = started
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    [sender] = senders
    assert sender._producer is None  # stopped (its on_stop drops the client)
