"""Interactive queries through the real broker: three counting workers serve every key.

The counter app (tests/integration/apps/counter.py) counts events per key in table
``counts`` with one standby replica; each worker runs its web server on a free port and
advertises it as its query address. The tests read the group's description to learn
each member's address and partitions, and check the answers against the true counts.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import pytest

from streamjoin.errors import KeyNotFound, QueryUnavailable, UnknownTableError
from streamjoin.partitioner import partition_for_key
from streamjoin.query import TableClient
from streamjoin.runtime.group_info import GroupInfo
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
    assert counters.stop("w3", signal.SIGTERM) == 0

    # one rebalance later (cooperative: the revocation plus its follow-up), every read
    # through either remaining worker is answered by the new owner, with the same count
    after = await wait_for_group(
        kafka_bootstrap, group, lambda i: sizes(i, source) == [3, 3], counters
    )
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
