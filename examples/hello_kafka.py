"""Demo (foundation stage): a real Apache Kafka broker provisioned by streamjoin, keyed records
produced into a multi-partition topic and read back through a consumer group.

Run it with ``./scripts/demo``. Later stages replace this with the ad-monetization join demo.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streamjoin.local_kafka import LocalKafka
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

TOPIC = "page-views"
PARTITIONS = 3
USERS = ["alice", "bob", "carol", "dave", "erin", "frank"]
RECORDS = 12


async def run(bootstrap: str) -> int:
    await ensure_topics(bootstrap, [TopicSpec(TOPIC, PARTITIONS)])
    print(f"created topic {TOPIC!r} with {PARTITIONS} partitions")

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(RECORDS):
            user = USERS[i % len(USERS)]
            meta = await producer.send_and_wait(
                TOPIC, key=user.encode(), value=f"/page/{i}".encode()
            )
            print(
                f"produced  key={user:<6} value=/page/{i:<3} -> partition {meta.partition} "
                f"offset {meta.offset}"
            )
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        TOPIC,
        bootstrap_servers=bootstrap,
        group_id="hello-demo",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    seen: list[tuple[int, int, str, str]] = []
    deadline = time.monotonic() + 30
    try:
        while len(seen) < RECORDS and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                seen.extend(
                    (r.partition, r.offset, r.key.decode(), r.value.decode()) for r in records
                )
        await consumer.commit()
    finally:
        await consumer.stop()
    for partition, offset, key, value in sorted(seen):
        print(f"consumed  partition {partition} offset {offset}: key={key:<6} value={value}")
    per_partition = Counter(p for p, *_ in seen)
    summary = ", ".join(f"p{p}={n}" for p, n in sorted(per_partition.items()))
    print(
        f"summary: produced {RECORDS}, consumed {len(seen)} through group 'hello-demo' ({summary})"
    )
    return 0 if len(seen) == RECORDS else 1


def main() -> int:
    with LocalKafka(progress=lambda line: print(f"[broker] {line}", flush=True)) as kafka:
        return asyncio.run(run(kafka.bootstrap_servers))


if __name__ == "__main__":
    raise SystemExit(main())
