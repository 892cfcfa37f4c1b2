"""Web views and health probes through the real broker: two ``streamjoin worker`` processes
of the counter app with views (tests/integration/apps/viewer.py), a query token set.

The second worker joins after the first counted every key, so the partitions it takes
are restored from their changelog: its ``/health/ready`` answers 503 (with reasons) from
the moment its web server runs until it is in the group with those partitions handed
over and restored, then 200. Then every key's page is asked through both workers and
answered by the key's owner (as the group's description names it) with the true count.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import aiohttp

from streamjoin.local_kafka import free_port
from streamjoin.partitioner import partition_for_key
from tests.integration.support import (
    Workers,
    produce,
    sizes,
    wait_all_committed,
    wait_for_group,
)

PARTITIONS = 4
TOKEN = "view-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _until_ready(
    session: aiohttp.ClientSession, port: int, workers: Workers
) -> list[tuple[int, list[str]]]:
    """Every answer of ``/health/ready`` (no token) until the first 200; refused
    connections (the process still starting) are not answers."""
    seen: list[tuple[int, list[str]]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            async with session.get(f"http://127.0.0.1:{port}/health/ready") as response:
                body = await response.json()
                seen.append((response.status, body["reasons"]))
                if response.status == 200:
                    return seen
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"never ready; answers: {seen[-3:]}\n{workers.logs()}")


async def _page(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    """A page's answer; a 503 (the routing table being described after a rebalance) is
    asked again after its Retry-After, for a while."""
    deadline = time.monotonic() + 20
    while True:
        async with session.get(url, headers=AUTH) as response:
            body = await response.json()
            if response.status != 503 or time.monotonic() > deadline:
                return response.status, body
            await asyncio.sleep(float(response.headers.get("Retry-After", "1")))


async def test_pages_are_answered_by_the_key_owner_and_ready_waits_for_the_restore(
    kafka_bootstrap: str, counters: Workers
) -> None:
    env = counters.env
    counters.app_spec = "tests.integration.apps.viewer:app"
    env["STREAMJOIN_QUERY_TOKEN"] = TOKEN
    source, group = env["SJT_SOURCE"], env["SJT_APP_ID"]
    ports = {"w1": free_port()}
    ports["w2"] = free_port(exclude=frozenset(ports.values()))
    truth: Counter[str] = Counter({f"user-{i}": i + 1 for i in range(12)})
    counters.start("w1", extra=["--web-port", str(ports["w1"])])
    await wait_for_group(kafka_bootstrap, group, lambda i: sizes(i, source) == [4], counters)
    await produce(kafka_bootstrap, source, [(k, "x") for k, n in truth.items() for _ in range(n)])
    await wait_all_committed(kafka_bootstrap, counters, "w1", partitions=PARTITIONS)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        counters.start("w2", extra=["--web-port", str(ports["w2"])])
        answers = await _until_ready(session, ports["w2"], counters)
        *before, (status, reasons) = answers
        assert status == 200 and reasons == []
        assert before and all(s == 503 and r for s, r in before), answers
        assert "not in the group yet (joining)" in before[0][1]
        info = await wait_for_group(
            kafka_bootstrap,
            group,
            lambda i: sizes(i, source) == [2, 2] and all(m.host for m in i.members),
            counters,
        )
        for name in ports:
            await _until_ready(session, ports[name], counters)

        # w2 processed none of the events (all committed before it joined): its pages'
        # counts come from the changelog it restored before it said it was ready
        owners = {p: m.host for m in info.members for p in m.active.get(source, [])}
        for key, count in truth.items():
            owner = owners[partition_for_key(key.encode(), PARTITIONS)]
            for port in ports.values():
                status, body = await _page(session, f"http://127.0.0.1:{port}/count/{key}")
                assert status == 200, body
                assert body == {"word": key, "count": count, "served_by": owner}

        url = f"http://127.0.0.1:{ports['w1']}"
        async with session.get(f"{url}/count/user-1") as response:  # no token
            assert response.status == 401
        async with session.get(f"{url}/hello") as response:  # public
            assert response.status == 200 and group in await response.text()
        async with session.get(f"{url}/health/live") as response:
            assert response.status == 200 and await response.json() == {"live": True}
