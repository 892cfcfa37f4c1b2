"""Rebalance correctness on the real broker: reproductions of bugs found by review.

These tests are written to FAIL on the code they were written against (see each
docstring for what the failure looks like); they pass once the bug is fixed.

1. Clean rebalances (workers joining and leaving, no crash) must not count an event
   twice: revocation commits every table write it flushes together with its offset.
2. A join worker stalled past its session timeout must not lose joins (nor emit
   false "unmatched" results) when the group rebalances under it.
3. A join worker replaying a backlog must commit offsets as it goes, not only at
   the end of the backlog.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from examples.ad_traffic import GRACE_MS, WINDOW_MS, Traffic, generate
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.admin import TopicSpec, ensure_topics
from tests.integration.support import (
    Workers,
    committed_offsets,
    read_all,
    sizes,
    wait_for_group,
)

PARTITIONS = 6
#: how long the stalled worker is frozen: past its 6 s session timeout
STALL_S = 8


# --------------------------------------------------------------------------- helpers


def keys_covering(partitions: int, per_partition: int) -> list[str]:
    """``per_partition`` keys for every partition (so every partition gets traffic)."""
    chosen: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while any(len(keys) < per_partition for keys in chosen.values()):
        key = f"key-{i}"
        bucket = chosen[partition_for_key(key.encode(), partitions)]
        if len(bucket) < per_partition:
            bucket.append(key)
        i += 1
    return [k for p in range(partitions) for k in chosen[p]]


async def produce_paced(
    bootstrap: str, topic: str, records: list[tuple[str, str]], chunk: int, pause: float
) -> None:
    """Produce ``records`` ``chunk`` at a time, ``pause`` seconds apart (a live stream)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for start in range(0, len(records), chunk):
            for key, value in records[start : start + chunk]:
                await producer.send(topic, value.encode(), key=key.encode())
            await producer.flush()
            await asyncio.sleep(pause)
    finally:
        await producer.stop()


async def wait_committed(
    bootstrap: str,
    group: str,
    totals: dict[str, int],
    workers: Workers,
    timeout: float = 90.0,
) -> None:
    deadline = time.monotonic() + timeout
    got: dict[str, int] = {}
    while time.monotonic() < deadline:
        for topic in totals:
            got[topic] = sum(await committed_offsets(bootstrap, group, topic, PARTITIONS))
        if all(got[t] >= n for t, n in totals.items()):
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"offsets never fully committed: {got} of {totals}\n{workers.logs()}")


@dataclass
class Sample:
    at: float  #: seconds since the sampling started
    committed: int  #: the group's committed offsets, summed over its input partitions
    output: int  #: the output topic's end offsets, summed (records written so far)


async def sample_progress(
    bootstrap: str,
    group: str,
    inputs: list[str],
    output: str,
    done: Callable[[Sample], bool],
    timeout: float,
    every: float = 0.5,
) -> list[Sample]:
    """Every ``every`` seconds, how far the group has committed and how much output exists,
    until ``done`` says so (or ``timeout``)."""
    group_client = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    plain = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await group_client.start()
    await plain.start()
    in_tps = [TopicPartition(t, p) for t in inputs for p in range(PARTITIONS)]
    out_tps = [TopicPartition(output, p) for p in range(PARTITIONS)]
    started = time.monotonic()
    samples: list[Sample] = []
    try:
        while time.monotonic() - started < timeout:
            committed = 0
            for tp in in_tps:
                committed += (await group_client.committed(tp)) or 0
            ends = await plain.end_offsets(out_tps)
            samples.append(Sample(time.monotonic() - started, committed, sum(ends.values())))
            if done(samples[-1]):
                break
            await asyncio.sleep(every)
    finally:
        await group_client.stop()
        await plain.stop()
    return samples


# ------------------------------------------------------------- 1: no double counting


@pytest.fixture
def counters(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Workers]:
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("cnt"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_SOURCE": unique_topic("events"),
        "SJT_SINK": unique_topic("counts"),
        "SJT_PARTITIONS": str(PARTITIONS),
        "PYTHONUNBUFFERED": "1",
    }
    group = Workers("tests.integration.apps.counter:app", env, tmp_path)
    yield group
    group.close()


async def test_clean_rebalances_never_count_an_event_twice(
    kafka_bootstrap: str, counters: Workers
) -> None:
    """Workers join and leave (SIGTERM: clean stops) while a stream of events is counted.

    No worker crashes, so at-least-once leaves no excuse for a duplicate: every
    revocation waits for in-flight events, flushes their table writes and commits
    their offsets; the next owner starts exactly where the last one stopped. The
    final table (the changelog's last value per key) must equal the true counts.

    Bug reproduced: ``on_revoked`` bumps the epoch before waiting for in-flight
    events, so the acknowledgements of events whose sends complete afterwards are
    dropped; the revocation commit flushes their table writes but not their
    offsets, and the next owner counts them again.
    """
    env = counters.env
    group, source, sink = env["SJT_APP_ID"], env["SJT_SOURCE"], env["SJT_SINK"]
    changelog = f"{group}-counts-changelog"
    keys = keys_covering(PARTITIONS, 2)
    total = 40_000
    batch = [(keys[i % len(keys)], f"e{i}") for i in range(total)]
    truth = Counter(k for k, _ in batch)

    # 0.4 ms of CPU per event: the 40k-event backlog keeps the workers busy for well
    # over the ~8 s of the choreography below
    env["SJT_WORK_MS"] = "0.4"
    counters.start("w1", static=False)
    counters.start("w2", static=False)
    await wait_for_group(kafka_bootstrap, group, lambda i: sizes(i, source) == [3, 3], counters)
    started = time.monotonic()
    producing = asyncio.create_task(
        produce_paced(kafka_bootstrap, source, batch, chunk=5_000, pause=0.2)
    )
    # Five rebalances, 1.5 s apart, while the backlog is being processed (and no crash:
    # stops are SIGTERM, the worker finishes its in-flight events, commits and leaves).
    steps = [("start", "w3"), ("stop", "w1"), ("start", "w1"), ("stop", "w2"), ("start", "w2")]
    progress: list[str] = []
    for action, name in steps:
        await asyncio.sleep(1.5)
        done = sum(await committed_offsets(kafka_bootstrap, group, source, PARTITIONS))
        progress.append(f"{time.monotonic() - started:.1f}s {action} {name} ({done} committed)")
        if action == "start":
            counters.start(name, static=False)
        else:
            assert counters.stop(name, signal.SIGTERM) == 0, counters.log_of(name)
    await producing
    await wait_for_group(kafka_bootstrap, group, lambda i: sizes(i, source) == [2, 2, 2], counters)
    await wait_committed(kafka_bootstrap, group, {source: total}, counters)
    elapsed = time.monotonic() - started

    # The table: last value per key in its changelog (keys live in one partition each,
    # read in offset order). The sink: one "<key>=<count>" per processing of an event.
    table: dict[str, int] = {}
    for key, value, _ in await read_all(kafka_bootstrap, changelog, len(keys), timeout=30):
        table[key] = int(value)
    out = await read_all(kafka_bootstrap, sink, total, timeout=60)
    processings = Counter(key for key, _, _ in out)
    over = {k: table.get(k, 0) - truth[k] for k in keys if table.get(k, 0) != truth[k]}
    double_counted = sum(v for v in over.values() if v > 0)
    lost = -sum(v for v in over.values() if v < 0)
    assert not over, (
        f"{double_counted} of {total} events counted twice and {lost} not counted, after "
        f"{len(steps)} clean rebalances in {elapsed:.0f}s; per key (table - truth): {over}; "
        f"events processed {sum(processings.values())} times in all (sink records); "
        f"steps: {progress}"
    )


# -------------------------------------------------------------------------- joins


async def create_join_topics(bootstrap: str, env: dict[str, str]) -> None:
    await ensure_topics(
        bootstrap,
        [
            TopicSpec(env[name], PARTITIONS)
            for name in ("SJT_IMPRESSIONS", "SJT_CLICKS", "SJT_OUTPUT")
        ],
    )


async def produce_traffic(bootstrap: str, env: dict[str, str], traffic: Traffic) -> None:
    topics = {"impressions": env["SJT_IMPRESSIONS"], "clicks": env["SJT_CLICKS"]}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        for rec in traffic.records:
            await producer.send(
                topics[rec.topic],
                json.dumps(rec.value).encode(),
                key=rec.key.encode(),
                timestamp_ms=rec.timestamp_ms,
            )
        await producer.flush()
    finally:
        await producer.stop()


def expected_unmatched(traffic: Traffic, window_ms: int = WINDOW_MS) -> set[str]:
    """Impressions a left join must emit as unmatched: no click in their window, and their
    window closed (stream time, the largest timestamp in their partition, passed
    ``ts + window + grace``)."""
    end: dict[int, int] = {}
    for rec in traffic.records:
        p = partition_for_key(rec.key.encode(), PARTITIONS)
        end[p] = max(end.get(p, 0), rec.timestamp_ms)
    clicked = {impression for _, impression, _ in traffic.expected_joins}
    return {
        rec.value["impression_id"]
        for rec in traffic.records
        if rec.topic == "impressions"
        and rec.value["impression_id"] not in clicked
        and rec.timestamp_ms + window_ms + GRACE_MS
        < end[partition_for_key(rec.key.encode(), PARTITIONS)]
    }


def timeline(samples: list[Sample]) -> str:
    return ", ".join(f"{s.at:.1f}s:{s.committed}/{s.output}" for s in samples)


async def test_a_join_replaying_a_backlog_commits_as_it_goes(
    kafka_bootstrap: str, joiners: Workers
) -> None:
    """One join worker starts on a backlog of ~40k impressions and clicks.

    With a 0.3 s commit interval its committed offsets must advance while it works
    through the backlog, so a crash mid-replay loses at most a few seconds of work.

    Bug reproduced: nothing is committed until (nearly) the whole backlog has been
    processed, although output is being produced all along.
    """
    env = joiners.env
    group = env["SJT_APP_ID"]
    inputs = [env["SJT_IMPRESSIONS"], env["SJT_CLICKS"]]
    traffic = generate(30_000, seed=3)
    total = len(traffic.records)
    env["SJT_WORK_MS"] = "0.25"  # ~43k records: ~11 s of CPU
    await create_join_topics(kafka_bootstrap, env)
    await produce_traffic(kafka_bootstrap, env, traffic)

    joiners.start("w1", static=False)
    await wait_for_group(
        kafka_bootstrap, group, lambda i: sizes(i, inputs[0]) == [PARTITIONS], joiners
    )
    # from here on the worker owns every partition and works through the backlog
    samples = await sample_progress(
        kafka_bootstrap,
        group,
        inputs,
        env["SJT_OUTPUT"],
        done=lambda s: s.committed >= total,
        timeout=100,
    )
    assert samples[-1].committed >= total, (
        f"the backlog was not fully committed in time: {timeline(samples)}\n{joiners.logs()}"
    )
    # The longest time the committed offsets stood still before everything was committed.
    changes = [samples[0]] + [
        after
        for before, after in itertools.pairwise(samples)
        if after.committed != before.committed
    ]
    longest, stalled_at = max((b.at - a.at, a.at) for a, b in itertools.pairwise(changes))
    final_output = samples[-1].output
    half = next(s for s in samples if s.output >= final_output / 2)
    assert longest <= 4.0, (
        f"nothing committed for {longest:.1f}s (from {stalled_at:.1f}s) while the worker "
        f"processed the backlog of {total} records in {samples[-1].at:.1f}s; "
        f"{half.committed} input records were committed when half of the {final_output} "
        f"output records had been written; timeline (s: committed/output records): "
        f"{timeline(samples)}"
    )


async def test_a_join_worker_stalled_past_its_session_timeout_loses_no_join(
    kafka_bootstrap: str, joiners: Workers
) -> None:
    """Two left-join workers share a backlog; one is frozen (SIGSTOP) for longer than its
    session timeout while it is processing, so the group rebalances under it, then it
    resumes (SIGCONT) and rejoins.

    At-least-once allows duplicates, but every expected join must be in the output and
    no impression that has a click in its window may be emitted as unmatched.

    Bug reproduced: after the rebalance, the resumed worker processes records of its old
    assignment (fetched or buffered before the stall) in the new epoch; that moves its
    partitions' stream time to the end of what it holds, so when the partitions are
    reassigned and replayed from the committed offsets, the replayed records are late and
    dropped: joins are missing, and their impressions come out as "unmatched".
    """
    env = joiners.env
    env["SJT_HOW"] = "left"
    env["SJT_SESSION_TIMEOUT_MS"] = "6000"  # the broker's minimum
    env["SJT_WORK_MS"] = "0.1"  # ~56k records: both workers busy through the stall
    group = env["SJT_APP_ID"]
    inputs = [env["SJT_IMPRESSIONS"], env["SJT_CLICKS"]]
    window = 600_000
    env["SJT_WINDOW_MS"] = str(window)
    traffic = generate(40_000, seed=17, window_ms=window)
    await create_join_topics(kafka_bootstrap, env)
    await produce_traffic(kafka_bootstrap, env, traffic)
    started = time.monotonic()
    joiners.start("w1", static=False)
    joiners.start("w2", static=False)
    await wait_for_group(kafka_bootstrap, group, lambda i: sizes(i, inputs[0]) == [3, 3], joiners)
    await asyncio.sleep(1)  # both busy with the backlog
    stalled = joiners.procs["w2"]
    before = sum(await committed_offsets(kafka_bootstrap, group, inputs[0], PARTITIONS))
    stalled.send_signal(signal.SIGSTOP)  # frozen past its session timeout, mid-backlog
    try:
        await asyncio.sleep(STALL_S)
    finally:
        stalled.send_signal(signal.SIGCONT)
    await wait_committed(
        kafka_bootstrap,
        group,
        {inputs[0]: traffic.impressions, inputs[1]: traffic.clicks},
        joiners,
        timeout=75,
    )
    elapsed = time.monotonic() - started
    out = await read_all(kafka_bootstrap, env["SJT_OUTPUT"], len(traffic.expected_joins))
    results = [json.loads(value) for _, value, _ in out]
    joined = Counter(
        (r["auction_id"], r["impression_id"], r["click_id"])
        for r in results
        if r["click_id"] is not None
    )
    unmatched = {r["impression_id"] for r in results if r["click_id"] is None}
    clicked = {impression for _, impression, _ in traffic.expected_joins}
    missing = traffic.expected_joins - set(joined)
    wrong = set(joined) - traffic.expected_joins
    false_unmatched = unmatched & clicked
    lost_unmatched = expected_unmatched(traffic, window) - unmatched
    duplicates = sum(n - 1 for n in joined.values())
    should_be_unmatched = len(expected_unmatched(traffic, window))
    assert not missing and not wrong and not false_unmatched and not lost_unmatched, (
        f"{len(lost_unmatched)} of {should_be_unmatched} unmatched impressions missing, "
        f"{len(missing)} of {len(traffic.expected_joins)} expected joins missing, "
        f"{len(wrong)} unexpected joins, {len(false_unmatched)} impressions with a click "
        f"emitted as unmatched ({duplicates} duplicate joins, allowed); w2 was frozen {STALL_S} s "
        f"with {before} impressions committed; {elapsed:.0f}s in all; "
        f"late records dropped per worker: {late_drops(joiners)}"
    )


def late_drops(workers: Workers) -> dict[str, int]:
    return {
        p.stem: p.read_text(errors="replace").count("is late and dropped")
        for p in sorted(workers.log_dir.glob("*.log"))
    }
