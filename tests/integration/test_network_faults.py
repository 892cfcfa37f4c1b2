"""Network faults between a worker and its broker, counted record by record.

The broker is this module's own, behind a TCP fault proxy
(:mod:`streamjoin.testing.fault_proxy`): it advertises the proxy's port, so every
connection a worker opens goes through it, while the test's producers and checkers use the
broker's INTERNAL listener and see a healthy network. Each test runs two workers of
tests/integration/apps/ledger_join.py side by side, one exactly-once and one at-least-once,
each on topics of its own with a producer that remembers what the broker acknowledged (a
counting table and the ad join), and injects one fault between the workers and the broker:

- a black hole (a network partition) longer than the workers' session timeout, then healed;
- every connection reset, again and again, while the workers process;
- a slow network: 200 ms latency each way and a bandwidth limit;
- half-open connections: the broker's side of every connection closed while the worker's
  side stays open and unanswered.

The workers must recover by themselves (none may exit), commit within ``RECOVERY_BOUND``
seconds every input written before the fault, and in the end the outputs are counted
against the inputs read back (see :func:`tests.integration.support.outcome_of` and the
cluster tests' :func:`~tests.integration.test_cluster_faults.assert_counted`): no
acknowledged input without its output; exactly-once: no duplicate, counts 1..n, tables
exact, every expected join once; at-least-once: duplicates counted, tables at least right.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamjoin.local_kafka import LocalKafka
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from streamjoin.testing.fault_proxy import BrokerProxies, broker_behind_proxy
from tests.integration.ledger_runs import GUARANTEES, LedgerRun, new_ledger
from tests.integration.support import wait_for_group

PARTITIONS = 4
#: the workers' group session timeout: the broker's minimum, so a cut outlives it quickly
SESSION_TIMEOUT_MS = 6_000
#: seconds of traffic before the fault, and after it is over
BEFORE, AFTER = 3.0, 3.0
#: seconds a worker has, from the end of the fault, to commit every input written before it
RECOVERY_BOUND = 45.0
#: the worker's log level (SJT_LOGLEVEL=debug to diagnose a failure)
LOGLEVEL = os.environ.get("SJT_LOGLEVEL", "info")


@dataclass(frozen=True)
class ProxiedBroker:
    kafka: LocalKafka
    proxies: BrokerProxies

    @property
    def proxied(self) -> str:
        """Where the workers connect: every connection through a fault proxy."""
        return self.kafka.bootstrap_servers

    @property
    def bootstrap_servers(self) -> str:
        """Where the test's own clients connect: the INTERNAL listener, never proxied."""
        return self.kafka.internal_bootstrap_servers


@pytest.fixture(scope="module")
def proxied_broker_module() -> Iterator[ProxiedBroker]:
    with broker_behind_proxy(
        heap="512m", progress=lambda line: print(f"[streamjoin] {line}", flush=True)
    ) as (kafka, proxies):
        yield ProxiedBroker(kafka, proxies)


@pytest.fixture
def broker(proxied_broker_module: ProxiedBroker) -> Iterator[ProxiedBroker]:
    """The module's proxied broker, its network healed after each test."""
    yield proxied_broker_module
    proxied_broker_module.proxies.heal()


@contextlib.asynccontextmanager
async def proxied_run(
    broker: ProxiedBroker, unique_topic: Callable[..., str], tmp_path: Path
) -> AsyncIterator[LedgerRun]:
    """One worker per guarantee on topics of their own, connected through the proxy; their
    traffic and every check go to the broker directly."""
    ledgers = []
    for guarantee in GUARANTEES:
        ledger = new_ledger(broker.proxied, unique_topic, tmp_path / guarantee, guarantee)
        ledger.env["SJT_SESSION_TIMEOUT_MS"] = str(SESSION_TIMEOUT_MS)
        ledger.traffic.bootstrap = broker.bootstrap_servers
        ledgers.append(ledger)
    run = LedgerRun(broker.bootstrap_servers, ledgers)
    try:
        for ledger in ledgers:
            specs = [TopicSpec(t, PARTITIONS) for t, compacted in ledger.topics() if not compacted]
            await ensure_topics(broker.bootstrap_servers, specs)
            ledger.workers.start("w", extra=["--loglevel", LOGLEVEL])
        for ledger in ledgers:
            await wait_for_group(
                broker.bootstrap_servers,
                ledger.app_id,
                lambda i: len(i.members) == 1,
                ledger.workers,
                90,
            )
        yield run
    finally:
        broker.proxies.heal()
        for ledger in ledgers:
            ledger.traffic.stop()
            if ledger.producing is not None and not ledger.producing.done():
                ledger.producing.cancel()
            ledger.workers.close()


async def test_a_worker_cut_off_longer_than_its_session_timeout_recovers(
    broker: ProxiedBroker, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    async with proxied_run(broker, unique_topic, tmp_path) as run:
        await run.traffic_for(BEFORE)
        run.fault_begins()
        broker.proxies.blackhole()
        await run.traffic_for(SESSION_TIMEOUT_MS / 1000 * 1.5)
        broker.proxies.heal()
        await run.recovers("a 9 s black hole", RECOVERY_BOUND)
        await run.traffic_for(AFTER)
        await run.check()
    for ledger in run.ledgers:  # what the log said: the silence, once, and no traceback
        log = ledger.workers.log_of("w")
        assert "answered no heartbeat in 6s (session timeout)" in log, log[-6000:]
        assert "Traceback" not in log, log[-6000:]


async def test_connections_reset_again_and_again_lose_nothing(
    broker: ProxiedBroker, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    async with proxied_run(broker, unique_topic, tmp_path) as run:
        await run.traffic_for(BEFORE)
        run.fault_begins()
        resets_before = broker.proxies.stats().resets
        for _ in range(8):
            broker.proxies.reset()
            await run.traffic_for(0.75)
        assert broker.proxies.stats().resets > resets_before
        await run.recovers("8 resets of every connection", RECOVERY_BOUND)
        await run.traffic_for(AFTER)
        await run.check()


async def test_a_slow_network_slows_the_worker_down_and_loses_nothing(
    broker: ProxiedBroker, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    async with proxied_run(broker, unique_topic, tmp_path) as run:
        await run.traffic_for(BEFORE)
        run.fault_begins()
        broker.proxies.latency(200, jitter_ms=50)
        broker.proxies.bandwidth(100_000)
        before = broker.proxies.stats()
        await run.traffic_for(4.0)
        # still slow: the workers keep up through it
        await run.recovers("200 ms latency and 100 kB/s", RECOVERY_BOUND)
        during = broker.proxies.stats()
        assert during.bytes_downstream > before.bytes_downstream  # (it went through the proxy)
        assert during.resets == before.resets  # slow, never cut
        broker.proxies.heal()
        await run.traffic_for(AFTER)
        await run.check()


async def test_half_open_connections_are_given_up_and_replaced(
    broker: ProxiedBroker, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    async with proxied_run(broker, unique_topic, tmp_path) as run:
        await run.traffic_for(BEFORE)
        run.fault_begins()
        broker.proxies.half_open()
        started = time.monotonic()
        await run.recovers("half-open connections", RECOVERY_BOUND)
        run.notes.append(f"half-open: recovered {time.monotonic() - started:.0f} s after")
        await run.traffic_for(AFTER)
        await run.check()
    for ledger in run.ledgers:
        log = ledger.workers.log_of("w")
        assert "answered no heartbeat in 6s (session timeout)" in log, log[-6000:]
        assert "Traceback" not in log, log[-6000:]
