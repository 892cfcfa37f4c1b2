"""Final window results (``emit="close"``) through the real broker, counted against a
brute-force model: tumbling and hopping windows, worker processes killed with SIGKILL
and partitions moved by a rebalance. At-least-once: no final result missing; exactly-once
(read with read_committed): none missing, none duplicated, each equal to the model's.

The app is tests/integration/apps/closer.py. Event times increase with every record, so
no event is late; after the traffic, one far-future "tick" per partition moves every
partition's stream time past the close time of every window of the traffic.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from streamjoin.state.windows import HoppingWindows, TumblingWindows
from tests.integration.support import Workers, read_all, wait_for_group

PARTITIONS = 4
KEYS = 12
EVENTS = 1_200
#: event time of the first event, and between two events (1 200 events: 12 s of event time)
BASE_MS = 1_700_000_000_000
STEP_MS = 10
TICK_MS = BASE_MS + 3_600_000

Window = tuple[str, int, int]  # key, start, end


@pytest.fixture
def closers(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Workers]:
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("close"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_SOURCE": unique_topic("events"),
        "SJT_FINALS": unique_topic("finals"),
        "SJT_PARTITIONS": str(PARTITIONS),
        "PYTHONUNBUFFERED": "1",
    }
    workers = Workers("tests.integration.apps.closer:app", env, tmp_path)
    yield workers
    workers.close()


def traffic() -> list[tuple[str, int]]:
    """(key, event time) of every event, event times increasing."""
    return [(f"k{i % KEYS}", BASE_MS + i * STEP_MS) for i in range(EVENTS)]


def model(window: str, events: list[tuple[str, int]]) -> Counter[Window]:
    """Brute force: the count of every (key, window) of the traffic (all close: see ticks)."""
    spec = (
        HoppingWindows(size_ms=2_000, step_ms=1_000)
        if window == "hopping"
        else TumblingWindows(size_ms=1_000)
    )
    counts: Counter[Window] = Counter()
    for key, ts in events:
        for start, end in spec.windows_for(ts):
            counts[(key, start, end)] += 1
    return counts


async def produce_timed(
    bootstrap: str, topic: str, records: list[tuple[str, int, int | None]]
) -> None:
    """(key, event time, partition or None for the key's) records, in order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for key, ts, partition in records:
            await producer.send(topic, b"e", key=key.encode(), timestamp_ms=ts, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


async def ticks(workers: Workers, bootstrap: str) -> None:
    """One far-future event per partition: every window of the traffic closes."""
    source = workers.env["SJT_SOURCE"]
    await produce_timed(bootstrap, source, [(f"tick{p}", TICK_MS, p) for p in range(PARTITIONS)])


async def finals_read(
    workers: Workers, bootstrap: str, expected: int, *, committed: bool
) -> list[tuple[Window, int]]:
    records = await read_all(
        bootstrap,
        workers.env["SJT_FINALS"],
        expected,
        timeout=90,
        isolation_level="read_committed" if committed else "read_uncommitted",
    )
    out = []
    for key, value, headers in records:
        window = (key, int(headers["window-start"]), int(headers["window-end"]))
        out.append((window, json.loads(value)))
    return out


def check(
    results: list[tuple[Window, int]], expected: Counter[Window], *, exactly_once: bool
) -> None:
    windows = Counter(window for window, _ in results)
    missing = set(expected) - set(windows)
    assert not missing, f"{len(missing)} final results missing, e.g. {sorted(missing)[:5]}"
    assert set(windows) == set(expected), sorted(set(windows) - set(expected))[:5]
    if exactly_once:
        duplicated = {w: n for w, n in windows.items() if n > 1}
        assert not duplicated, f"final results repeated: {list(duplicated.items())[:5]}"
        wrong = {w: v for w, v in results if v != expected[w]}
        assert not wrong, f"final values differ from the model: {list(wrong.items())[:5]}"
    else:
        # replayed events may count twice in a window still open, never less than once
        assert all(v >= expected[w] for w, v in results)


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
        timeout=90,
    )


@pytest.mark.parametrize(
    ("guarantee", "window"),
    [("exactly_once", "tumbling"), ("at_least_once", "hopping"), ("exactly_once", "hopping")],
)
async def test_final_results_survive_a_killed_worker(
    kafka_bootstrap: str, closers: Workers, guarantee: str, window: str
) -> None:
    """Two workers; one is killed (SIGKILL) after results began to flow, with windows open
    and results in flight, and started again."""
    closers.env.update({"SJT_GUARANTEE": guarantee, "SJT_WINDOW": window})
    exactly_once = guarantee == "exactly_once"
    for name in ("w1", "w2"):
        closers.start(name)
    await wait_for_members(closers, kafka_bootstrap, 2)
    events = traffic()
    half = len(events) // 2
    source = closers.env["SJT_SOURCE"]
    await produce_timed(kafka_bootstrap, source, [(k, ts, None) for k, ts in events[:half]])
    await read_all(kafka_bootstrap, closers.env["SJT_FINALS"], 1, timeout=60)
    await asyncio.to_thread(closers.stop, "w2", signal.SIGKILL)
    closers.start("w2")
    await produce_timed(kafka_bootstrap, source, [(k, ts, None) for k, ts in events[half:]])
    await ticks(closers, kafka_bootstrap)
    expected = model(window, events)
    results = await finals_read(closers, kafka_bootstrap, len(expected), committed=exactly_once)
    check(results, expected, exactly_once=exactly_once)


async def test_final_results_survive_a_rebalance(kafka_bootstrap: str, closers: Workers) -> None:
    """One worker takes every partition; a second one joins midway (partitions move, with
    their windows open and their pending closes), then the first one leaves."""
    closers.env.update({"SJT_GUARANTEE": "exactly_once", "SJT_WINDOW": "tumbling"})
    closers.start("w1")
    await wait_for_members(closers, kafka_bootstrap, 1)
    events = traffic()
    third = len(events) // 3
    source = closers.env["SJT_SOURCE"]
    await produce_timed(kafka_bootstrap, source, [(k, ts, None) for k, ts in events[:third]])
    closers.start("w2")
    await wait_for_members(closers, kafka_bootstrap, 2)
    await produce_timed(
        kafka_bootstrap, source, [(k, ts, None) for k, ts in events[third : 2 * third]]
    )
    await asyncio.to_thread(closers.stop, "w1")  # a clean stop: its partitions move to w2
    await wait_for_members(closers, kafka_bootstrap, 1)
    await produce_timed(kafka_bootstrap, source, [(k, ts, None) for k, ts in events[2 * third :]])
    await ticks(closers, kafka_bootstrap)
    expected = model("tumbling", events)
    results = await finals_read(closers, kafka_bootstrap, len(expected), committed=True)
    check(results, expected, exactly_once=True)
