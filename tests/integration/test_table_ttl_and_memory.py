"""In-memory table stores and TTL tables through the real broker, with a worker killed -9.

1. ``store="memory"`` under exactly-once: the ledger app (tests/integration/apps/ledger.py)
   counts acknowledged traffic in a memory-store table; its worker is SIGKILLed mid-stream
   and restarted under the same static instance id (so its transactional id fences the
   killed one's open transaction; its memory store starts empty and is restored in full
   from the changelog). Counted like the broker-restart test: no acknowledged input without its
   output, no duplicate, per key the counts 1..n, the table (its changelog) exact.
2. ``ttl_ms``: the same app with a TTL table and a standby, fed records with chosen
   timestamps. Keys expire by stream time; the changelog holds their tombstones (and the
   partition's stored stream time); when the active worker is killed -9 the standby takes
   over, and when that one is killed too a worker restarted with no local state (restored
   from the changelog alone) sees exactly the unexpired keys.
"""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from streamjoin.state.ttl import STREAM_TIME_KEY, stamp
from tests.integration.ledger_runs import kill_9_and_restart
from tests.integration.support import (
    Workers,
    active_by_instance,
    ledger_workers,
    read_to_end,
    replayed_records,
    sizes,
    wait_all_committed,
    wait_for_group,
)

#: one partition per topic for the TTL run (one stream time: the test chooses it), two for
#: the kill -9 run (small, so a restart restores quickly)
TTL_PARTITIONS, MEMORY_PARTITIONS = 1, 2
#: seconds of traffic before the kill and after the restart
BEFORE, AFTER = 3.0, 3.0
SESSION_TIMEOUT_MS = "6000"


async def test_a_memory_store_table_is_exact_after_kill_9_under_exactly_once(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = ledger_workers(
        kafka_bootstrap,
        unique_topic,
        tmp_path,
        "exactly_once",
        MEMORY_PARTITIONS,
        SJT_TABLE_STORE="memory",
        SJT_SESSION_TIMEOUT_MS=SESSION_TIMEOUT_MS,
    )
    try:
        run = await kill_9_and_restart(
            kafka_bootstrap,
            workers,
            MEMORY_PARTITIONS,
            (BEFORE, AFTER),
            while_down=lambda: no_memory_table_on_disk(workers),
        )
        assert "an in-memory store: it starts empty and is restored in full" in run.log
        assert workers.stop("w") == 0, workers.log_of("w")[-6000:]
    finally:
        workers.close()


def no_memory_table_on_disk(workers: Workers) -> None:
    assert not list(workers.state_dir("w").glob("stores/counts")), "a memory table on disk"


# --------------------------------------------------------------------------- TTL

TTL_MS = 10_000
T0 = 1_700_000_000_000
#: written at T0 (twice): expired once stream time reaches T0 + TTL_MS
OLD = [f"old{i}" for i in range(8)]
#: written at T0 + 5 s: alive until stream time reaches T0 + 15 s
NEW = [f"new{i}" for i in range(8)]


async def send_at(bootstrap: str, topic: str, records: list[tuple[str, int]]) -> None:
    """``(key, timestamp)`` records, each value a unique id, acknowledged."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for n, (key, timestamp) in enumerate(records):
            value = f"{key}@{timestamp}#{n}".encode()
            await producer.send(topic, value, key=key.encode(), timestamp_ms=timestamp)
        await producer.flush()
    finally:
        await producer.stop()


async def changelog_of(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    """Every record of the (one-partition) changelog, tombstones included."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[tuple[bytes, bytes | None]] = []
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out.extend((r.key, r.value) for r in records)
        return out
    finally:
        await consumer.stop()


async def committed(workers: Workers) -> None:
    """Until the ledger's running workers committed every input (fails if one exits)."""
    bootstrap = workers.env["SJT_BROKER"].removeprefix("kafka://")
    await wait_all_committed(bootstrap, workers, None, 60, partitions=TTL_PARTITIONS)


async def counts_answered(bootstrap: str, env: dict[str, str]) -> dict[str, list[int]]:
    """Per key, the counts the ledger answered, in order."""
    answered: dict[str, list[int]] = {}
    for key, value in await read_to_end(bootstrap, env["SJT_OUTPUT"], TTL_PARTITIONS):
        answered.setdefault(key, []).append(json.loads(value)["count"])
    return answered


async def test_ttl_keys_expire_by_stream_time_with_tombstones_and_survive_a_restore(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = ledger_workers(
        kafka_bootstrap,
        unique_topic,
        tmp_path,
        "at_least_once",
        TTL_PARTITIONS,
        SJT_TTL_MS=str(TTL_MS),
        SJT_STANDBYS="1",
        SJT_SESSION_TIMEOUT_MS=SESSION_TIMEOUT_MS,
    )
    env = workers.env
    source, changelog = env["SJT_SOURCE"], f"{env['SJT_APP_ID']}-counts-changelog"
    await ensure_topics(
        kafka_bootstrap,
        [TopicSpec(source, TTL_PARTITIONS), TopicSpec(env["SJT_OUTPUT"], TTL_PARTITIONS)],
    )
    try:
        workers.start("a")
        workers.start("b")
        info = await wait_for_group(
            kafka_bootstrap,
            env["SJT_APP_ID"],
            lambda i: len(i.members) == 2 and sum(sizes(i, source)) == TTL_PARTITIONS,
            workers,
        )
        active = next(name for name, held in active_by_instance(info, source).items() if held)
        standby = "b" if active == "a" else "a"
        await send_at(
            kafka_bootstrap,
            source,
            [(k, T0) for k in OLD] * 2 + [(k, T0 + 5_000) for k in NEW],
        )
        # (committed first: a key written and expired within one flush needs no tombstone)
        await committed(workers)
        # stream time T0 + 12 s: every OLD key is expired at once, no NEW one; the flush
        # that commits the tick purges them
        await send_at(kafka_bootstrap, source, [("tick", T0 + 12_000)])
        await committed(workers)
        await send_at(kafka_bootstrap, source, [(k, T0) for k in OLD])
        await committed(workers)
        answered = await counts_answered(kafka_bootstrap, env)
        # the late OLD events (timestamp T0) come after stream time moved on: fresh counts
        assert {k: answered[k] for k in OLD} == {k: [1, 2, 1] for k in OLD}, answered
        assert {k: answered[k] for k in NEW} == {k: [1] for k in NEW}, answered

        # the flush after the tick purged the OLD keys: tombstones, then their new counts
        records = await changelog_of(kafka_bootstrap, changelog)
        tombstoned = {key.decode() for key, value in records if value is None}
        assert tombstoned == set(OLD), records
        assert (STREAM_TIME_KEY, stamp(T0 + 12_000, b"")) in records

        # kill -9 the active worker: the standby, which followed the changelog (tombstones
        # and stream time included), takes over
        assert workers.stop(active, signal.SIGKILL) == -signal.SIGKILL
        # stream time T0 + 16 s: NEW keys (T0 + 5 s) expire; OLD ones (T0 + 12 s) live on;
        # the late tick (T0) moves nothing back and finds its key alive
        await send_at(
            kafka_bootstrap, source, [(k, T0 + 16_000) for k in [*OLD, *NEW]] + [("tick", T0)]
        )
        await committed(workers)
        answered = await counts_answered(kafka_bootstrap, env)
        log = workers.log_of(standby)
        assert {k: answered[k][3:] for k in OLD} == {k: [2] for k in OLD}, log[-6000:]
        assert {k: answered[k][1:] for k in NEW} == {k: [1] for k in NEW}, log[-6000:]
        assert answered["tick"] == [1, 2], answered
        # (it took over from its standby store: it did not replay the whole changelog)
        assert replayed_records(log) < len(records), log[-6000:]

        # kill -9 that one too, wipe every store, restart one worker: restored from the
        # changelog alone, with the partition's stream time (T0 + 16 s)
        assert workers.stop(standby, signal.SIGKILL) == -signal.SIGKILL
        for name in ("a", "b"):
            shutil.rmtree(workers.state_dir(name), ignore_errors=True)
        workers.start(active)
        # NEW (written at T0 + 16 s) is alive at T0 + 21 s; at T0 + 27 s OLD and the tick
        # (written at T0 + 16 s) are expired, NEW (rewritten at T0 + 21 s) is not
        await send_at(
            kafka_bootstrap,
            source,
            [(k, T0 + 21_000) for k in NEW]
            + [("tick", T0 + 27_000)]
            + [(k, T0 + 27_000) for k in [*OLD, *NEW]],
        )
        await committed(workers)
        answered = await counts_answered(kafka_bootstrap, env)
        log = workers.log_of(active)
        assert {k: answered[k] for k in OLD} == {k: [1, 2, 1, 2, 1] for k in OLD}, log[-6000:]
        assert {k: answered[k] for k in NEW} == {k: [1, 1, 2, 3] for k in NEW}, log[-6000:]
        assert answered["tick"] == [1, 2, 1], answered
        assert workers.stop(active) == 0, log[-6000:]
    finally:
        workers.close()
