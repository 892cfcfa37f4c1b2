"""Cooperative rebalancing through the real broker, measured from the tracker app's trace.

- Partitions that keep their owner never stop while members join and leave: no member
  revokes more than what moves, and their processing gaps stay short.
- No event is counted twice without a crash, and nothing is missed.
- Across joins, leaves, kill -9 and restarts, no two members process one partition at the
  same time (the overlap test).
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.rebalance_analysis import (
    analyze_event,
    by_partition,
    count_errors,
    duplicates,
    missing,
    overlaps,
    read_trace_dir,
    runs,
)
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import Traffic, Workers, tracker_workers, wait_for_group
from tests.integration.test_rebalance_trace import end_offsets

pytestmark = pytest.mark.integration

PARTITIONS = 6
_REVOKED = re.compile(
    r"rebalance done: generation \d+ \((\w+)[^)]*\) in [\d.]+s: "
    r"(\d+) partitions assigned, (\d+) revoked"
)


def revoked_per_rebalance(log: str) -> list[tuple[str, int]]:
    """(protocol, partitions revoked) of each rebalance a worker's log reports."""
    return [(m[1], int(m[3])) for m in _REVOKED.finditer(log)]


async def all_processed(
    bootstrap: str, source: str, trace: Path, timeout: float = 40.0
) -> tuple[dict[tuple[str, int], int], list]:  # type: ignore[type-arg]
    """The source's end offsets, once the trace shows the last record of every partition."""
    ends = await end_offsets(bootstrap, source)
    deadline = time.monotonic() + timeout
    records = read_trace_dir(trace)
    while time.monotonic() < deadline:
        records = read_trace_dir(trace)
        done = {(r.tp, r.offset) for r in records}
        if all((tp, end - 1) in done for tp, end in ends.items() if end):
            break
        await asyncio.sleep(0.5)
    return ends, records


async def test_partitions_that_keep_their_owner_never_stop(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = tracker_workers(kafka_bootstrap, unique_topic, tmp_path, PARTITIONS, SJT_STANDBYS="1")
    group, source = workers.env["SJT_APP_ID"], workers.env["SJT_SOURCE"]
    await ensure_topics(kafka_bootstrap, [TopicSpec(source, PARTITIONS)])
    events: dict[str, float] = {}
    try:
        for name in ("a", "b"):
            workers.start(name, static=False)
        await wait_for_group(kafka_bootstrap, group, lambda i: len(i.members) == 2, workers)
        traffic = Traffic(kafka_bootstrap, source)
        stream = asyncio.create_task(traffic.run(per_second=300))
        await asyncio.sleep(4)
        events["join"] = time.time()
        workers.start("c", static=False)
        await wait_for_group(
            kafka_bootstrap,
            group,
            lambda i: len(i.members) == 3 and all(m.active for m in i.members),
            workers,
        )
        await asyncio.sleep(4)
        events["leave"] = time.time()
        assert await asyncio.to_thread(workers.stop, "a") == 0
        await wait_for_group(kafka_bootstrap, group, lambda i: len(i.members) == 2, workers)
        await asyncio.sleep(max(0.0, events["leave"] + 5 - time.time()))
        traffic.stop()
        await stream
        ends, records = await all_processed(kafka_bootstrap, source, tmp_path / "trace")
    finally:
        workers.close()
    logs = {name: workers.log_of(name) for name in ("a", "b", "c")}
    # no event counted twice without a crash, nothing missed, never two processes at once
    assert missing(records, {tp: (0, end) for tp, end in ends.items()}) == {}, workers.logs()
    assert duplicates(records) == []
    assert count_errors(records) == {}
    assert overlaps(runs(records)) == []
    # members revoke only what moves: every rebalance line is cooperative, and over the run
    # fewer partitions were revoked than a stop-the-world protocol revokes in one rebalance
    lines = [line for log in logs.values() for line in revoked_per_rebalance(log)]
    assert lines and all(protocol == "cooperative" for protocol, _ in lines), lines
    assert sum(n for _, n in lines) < PARTITIONS, (lines, workers.logs())
    parts = by_partition(records)
    for name, t in events.items():
        stats = analyze_event(parts, t, t + 4.0, quiet=3.0)
        assert stats.stayed, (name, stats)
        # unmoved partitions: the longest pause is a fetch gap, not a rebalance
        assert stats.stayed_gap.max < 1.0, (name, stats.stayed_gap, stats.stayed_normal)


async def test_no_two_members_ever_process_a_partition_at_once(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers: Workers = tracker_workers(
        kafka_bootstrap,
        unique_topic,
        tmp_path,
        PARTITIONS,
        SJT_STANDBYS="1",
        SJT_SESSION_TIMEOUT_MS="6000",
    )
    group, source = workers.env["SJT_APP_ID"], workers.env["SJT_SOURCE"]
    await ensure_topics(kafka_bootstrap, [TopicSpec(source, PARTITIONS)])

    def members(n: int) -> Callable[..., bool]:
        return lambda i: len(i.members) == n and all(m.active for m in i.members)

    try:
        for name in ("a", "b", "c"):
            workers.start(name)
        await wait_for_group(kafka_bootstrap, group, members(3), workers)
        traffic = Traffic(kafka_bootstrap, source)
        stream = asyncio.create_task(traffic.run(per_second=300))
        await asyncio.sleep(3)
        workers.start("d")  # a join
        await wait_for_group(kafka_bootstrap, group, members(4), workers)
        await asyncio.sleep(2)
        workers.start("e", static=False)  # a dynamic member joins, then leaves cleanly
        await wait_for_group(kafka_bootstrap, group, members(5), workers)
        await asyncio.sleep(2)
        await asyncio.to_thread(workers.stop, "e")
        await wait_for_group(kafka_bootstrap, group, members(4), workers)
        await asyncio.to_thread(workers.stop, "b", signal.SIGKILL)  # a crash...
        await asyncio.sleep(2)
        workers.start("b")  # ... and a restart with the same instance id
        await asyncio.sleep(3)
        await asyncio.to_thread(workers.stop, "c", signal.SIGKILL)  # a crash, no restart
        await wait_for_group(kafka_bootstrap, group, members(3), workers, timeout=60)
        await asyncio.sleep(2)
        traffic.stop()
        await stream
        ends, records = await all_processed(kafka_bootstrap, source, tmp_path / "trace")
    finally:
        workers.close()
    found = overlaps(runs(records))
    assert found == [], (found[:5], workers.logs())
    assert missing(records, {tp: (0, end) for tp, end in ends.items()}) == {}, workers.logs()
