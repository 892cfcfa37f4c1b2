"""Restoring a global table: time and memory to read N rows into a worker's local copy.

    python -m benchmarks.global_restore --rows 1000000 [--bootstrap 127.0.0.1:9092]

Produces ``--rows`` rows (``--value-bytes`` each) to a fresh topic, then runs the
worker's :class:`~streamjoin.runtime.table_state.global_tables.GlobalTableService` in
this process three times: a RocksDB copy from empty, the same copy resumed (a restart:
nothing to read), and an in-memory copy (read in full, as at every start). Prints each
restore's seconds and records/s and the process's peak RSS growth. Not part of the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

from benchmarks.broker import broker
from streamjoin.codecs import resolve_codec
from streamjoin.global_tables import GlobalTable
from streamjoin.runtime.table_state.global_tables import GlobalTableService
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from streamjoin.tables import StoreKind
from streamjoin.topics import Topic


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _produce(bootstrap: str, topic: str, rows: int, value_bytes: int) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=50, max_batch_size=512 * 1024
    )
    await producer.start()
    started = time.monotonic()
    pad = b"x" * max(0, value_bytes - 20)
    try:
        pending = []
        for i in range(rows):
            pending.append(
                await producer.send(topic, b'{"n":%d,"p":"%s"}' % (i, pad), key=b"k%d" % i)
            )
            if len(pending) >= 10_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.monotonic() - started


async def _restore(
    bootstrap: str, topic: Topic, partitions: int, state_dir: Path, store: StoreKind
) -> tuple[float, int]:
    codec = resolve_codec("raw")
    table = GlobalTable("bench", topic, codec, codec, store=store)
    service = GlobalTableService(
        {"bench": table},
        partitions={topic.name: partitions},
        state_dir=state_dir,
        rocksdb=None,
        bootstrap_servers=bootstrap,
        progress_interval=5.0,
    )
    started = time.monotonic()
    await service.start()
    elapsed = time.monotonic() - started
    read = service.progress["bench"].restore_total
    assert table.get(b"k0") is not None
    await service.stop()
    return elapsed, read


async def main(args: argparse.Namespace) -> None:
    with broker(args.bootstrap, print, heap="512m") as bootstrap:
        name = f"bench-global-{uuid.uuid4().hex[:8]}"
        await ensure_topics(bootstrap, [TopicSpec(name, args.partitions)])
        took = await _produce(bootstrap, name, args.rows, args.value_bytes)
        print(f"produced {args.rows} rows in {took:.1f}s")
        topic = Topic(name, resolve_codec("raw"), resolve_codec("raw"), partitions=args.partitions)
        with tempfile.TemporaryDirectory() as tmp:
            for label, store in (
                ("rocksdb, empty", "rocksdb"),
                ("rocksdb, resumed", "rocksdb"),
                ("memory", "memory"),
            ):
                before = _peak_rss_mb()
                seconds, read = await _restore(bootstrap, topic, args.partitions, Path(tmp), store)  # type: ignore[arg-type]
                rate = read / seconds if seconds > 0 else 0.0
                print(
                    f"{label:18} {read:>9} records read in {seconds:6.1f}s "
                    f"({rate:,.0f} records/s); peak RSS {_peak_rss_mb():.0f} MB "
                    f"(+{_peak_rss_mb() - before:.0f})"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="a loopback broker (default: start one)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--value-bytes", type=int, default=100)
    asyncio.run(main(parser.parse_args()))
