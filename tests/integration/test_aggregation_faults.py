"""Final results of session and sliding aggregations (``emit="close"``) through the real
broker, under a worker killed with SIGKILL and under a rebalance, counted against a
brute-force model built from the pure cores' all-at-once functions
(:func:`~streamjoin.state.sessions.sessions_of`, :func:`~streamjoin.state.sliding.windows_of`).

At-least-once: no final result missing, none for a window the model lacks; replayed
records may count twice in a window still open, so ``n`` and ``sum`` are at least the
model's and ``min``/``max`` (unchanged by a replay) equal to it. Exactly-once (read with
read_committed): none missing, none duplicated, each equal to the model's.

The app is tests/integration/apps/aggregator.py (both aggregations on one source). Event
times increase with every record, so no record is late; after the traffic, one far-future
"tick" per partition moves every partition's stream time past every window's close time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from streamjoin.state.sessions import sessions_of
from streamjoin.state.sliding import windows_of
from streamjoin.state.windows import SessionWindows, Window
from tests.integration.apps.aggregator import WINDOWS
from tests.integration.support import Workers, read_all, wait_for_group

PARTITIONS = 4
KEYS = 12
EVENTS = 720
#: events of one burst: a key's events are KEYS * STEP_MS = 120 ms apart within a burst
#: (one session), and PAUSE_MS apart between bursts (sessions end)
BURST = 120
BASE_MS = 1_700_000_000_000
STEP_MS = 10
PAUSE_MS = 1_000
TICK_MS = BASE_MS + 3_600_000

Event = tuple[str, int, int]  # key, event time, amount
WindowOf = tuple[str, int, int]  # key, start, end
Result = dict[str, int]  # n, sum, min, max


def traffic() -> list[Event]:
    return [
        (f"k{i % KEYS}", BASE_MS + i * STEP_MS + PAUSE_MS * (i // BURST), i) for i in range(EVENTS)
    ]


def model(kind: str, events: list[Event]) -> dict[WindowOf, Result]:
    """Brute force: every (key, window) of the traffic and its aggregate."""
    out: dict[WindowOf, Result] = {}
    for key in {k for k, _, _ in events}:
        mine = [(ts, amount) for k, ts, amount in events if k == key]
        stamps = [ts for ts, _ in mine]
        spec = WINDOWS[kind]
        windows: list[Window] = (
            sessions_of(spec, stamps)
            if isinstance(spec, SessionWindows)
            else windows_of(spec, stamps)
        )
        for start, end in windows:
            held = [amount for ts, amount in mine if start <= ts < end]
            out[(key, start, end)] = {
                "n": len(held),
                "sum": sum(held),
                "min": min(held),
                "max": max(held),
            }
    return out


@pytest.fixture
def aggregators(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Workers]:
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("aggf"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_SOURCE": unique_topic("events"),
        **{f"SJT_{kind.upper()}": unique_topic(kind) for kind in WINDOWS},
        "SJT_PARTITIONS": str(PARTITIONS),
        "PYTHONUNBUFFERED": "1",
    }
    workers = Workers("tests.integration.apps.aggregator:app", env, tmp_path)
    yield workers
    workers.close()


async def produce_events(
    bootstrap: str, topic: str, events: list[Event], partition: int | None = None
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for key, ts, amount in events:
            value = json.dumps({"amount": amount}).encode()
            await producer.send(
                topic, value, key=key.encode(), timestamp_ms=ts, partition=partition
            )
        await producer.flush()
    finally:
        await producer.stop()


async def ticks(workers: Workers, bootstrap: str) -> None:
    """One far-future event per partition: every window of the traffic closes."""
    for p in range(PARTITIONS):
        await produce_events(bootstrap, workers.env["SJT_SOURCE"], [(f"tick{p}", TICK_MS, 0)], p)


async def results_of(
    workers: Workers, bootstrap: str, kind: str, expected: int, *, committed: bool
) -> list[tuple[WindowOf, Result]]:
    topic = workers.env[f"SJT_{kind.upper()}"]
    records = await read_all(
        bootstrap,
        topic,
        expected,
        timeout=60,
        isolation_level="read_committed" if committed else "read_uncommitted",
    )
    out = []
    for key, raw, headers in records:
        value: dict[str, Any] = json.loads(raw)
        window = (key, value["start"], value["end"])
        assert (int(headers["window-start"]), int(headers["window-end"])) == window[1:]
        out.append((window, value["value"]))
    return out


def check(
    kind: str,
    results: list[tuple[WindowOf, Result]],
    expected: dict[WindowOf, Result],
    *,
    exactly_once: bool,
) -> None:
    sent = Counter(window for window, _ in results)
    missing = sorted(set(expected) - set(sent))
    assert not missing, f"{kind}: {len(missing)} final results missing, e.g. {missing[:5]}"
    extra = sorted(set(sent) - set(expected))
    assert not extra, f"{kind}: final results of windows the model lacks: {extra[:5]}"
    if exactly_once:
        repeated = {w: n for w, n in sent.items() if n > 1}
        assert not repeated, f"{kind}: final results repeated: {list(repeated.items())[:5]}"
        wrong = [(w, v, expected[w]) for w, v in results if v != expected[w]]
    else:
        wrong = [
            (w, v, expected[w])
            for w, v in results
            if (v["min"], v["max"]) != (expected[w]["min"], expected[w]["max"])
            or v["n"] < expected[w]["n"]
            or v["sum"] < expected[w]["sum"]
        ]
    assert not wrong, f"{kind}: final values differ from the model: {wrong[:5]}"


async def check_all(workers: Workers, bootstrap: str, *, exactly_once: bool) -> None:
    events = traffic()
    for kind in WINDOWS:
        expected = model(kind, events)
        results = await results_of(workers, bootstrap, kind, len(expected), committed=exactly_once)
        check(kind, results, expected, exactly_once=exactly_once)


async def wait_for_members(workers: Workers, bootstrap: str, members: int) -> None:
    group, source = workers.env["SJT_APP_ID"], workers.env["SJT_SOURCE"]
    await wait_for_group(
        bootstrap,
        group,
        lambda i: (
            len(i.members) == members
            and sum(len(m.active.get(source, [])) for m in i.members) == PARTITIONS
        ),
        workers,
        timeout=60,
    )


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_final_aggregates_survive_a_killed_worker(
    kafka_bootstrap: str, aggregators: Workers, guarantee: str
) -> None:
    """Two workers; one is killed (SIGKILL) once final results flow, with sessions and
    sliding windows open and results in flight, and started again (under exactly-once
    with a fresh state dir: its state comes back from the changelogs alone)."""
    aggregators.env["SJT_GUARANTEE"] = guarantee
    exactly_once = guarantee == "exactly_once"
    for name in ("w1", "w2"):
        aggregators.start(name)
    await wait_for_members(aggregators, kafka_bootstrap, 2)
    events = traffic()
    half = len(events) // 2
    source = aggregators.env["SJT_SOURCE"]
    await produce_events(kafka_bootstrap, source, events[:half])
    await read_all(kafka_bootstrap, aggregators.env["SJT_SESSIONS"], 1, timeout=60)
    await asyncio.to_thread(aggregators.stop, "w2", signal.SIGKILL)
    # (same instance id; a new name is a new, empty state dir)
    aggregators.start("w2-fresh" if exactly_once else "w2", instance_id="w2")
    await produce_events(kafka_bootstrap, source, events[half:])
    await ticks(aggregators, kafka_bootstrap)
    await check_all(aggregators, kafka_bootstrap, exactly_once=exactly_once)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_final_aggregates_survive_a_rebalance(
    kafka_bootstrap: str, aggregators: Workers, guarantee: str
) -> None:
    """One worker takes every partition; a second one joins midway (partitions move with
    their open windows, kept records and close markers), then the first one leaves."""
    aggregators.env["SJT_GUARANTEE"] = guarantee
    aggregators.start("w1")
    await wait_for_members(aggregators, kafka_bootstrap, 1)
    events = traffic()
    third = len(events) // 3
    source = aggregators.env["SJT_SOURCE"]
    await produce_events(kafka_bootstrap, source, events[:third])
    aggregators.start("w2")
    await wait_for_members(aggregators, kafka_bootstrap, 2)
    await produce_events(kafka_bootstrap, source, events[third : 2 * third])
    await asyncio.to_thread(aggregators.stop, "w1")  # a clean stop: its partitions move
    await wait_for_members(aggregators, kafka_bootstrap, 1)
    await produce_events(kafka_bootstrap, source, events[2 * third :])
    await ticks(aggregators, kafka_bootstrap)
    await check_all(aggregators, kafka_bootstrap, exactly_once=guarantee == "exactly_once")
