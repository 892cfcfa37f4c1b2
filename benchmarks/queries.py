"""Interactive-query benchmark: latency and throughput of table reads while workers work.

    .venv/bin/python -m benchmarks.queries [--workers 3] [--seconds 10] [--rate 500]
        [--concurrency 4] [--keys 300] [--bootstrap 127.0.0.1:PORT] [--json]

1. Fresh topics; ``--workers`` worker processes of ``tests/integration/apps/counter.py``
   (``streamjoin worker --web-port 0``, RocksDB state, one standby replica) count events
   per key in table ``counts``. A producer process sends ``--rate`` events/s over
   ``--keys`` keys for the whole run, so the workers process input while being read.
2. Once every key has a count, the group's description gives each partition's owner and
   each worker's query address. Two phases of ``--seconds`` each, ``--concurrency``
   readers (aiohttp, keep-alive) each sending one ``GET /tables/counts/<key>`` after the
   other, over the keys in turn:

   * ``local``: every read goes to the key's owner (answered from its store);
   * ``forwarded``: every read goes to a worker that does not own the key, which forwards
     it to the owner (one hop) and passes the answer back.

3. Per phase: reads, reads/s, p50/p99/max latency (ms), and answers other than 200.

Goal (issue 17): p99 < 5 ms local, < 15 ms forwarded. The reader shares the machine's
cores with the workers and the broker, as a dashboard on the same host would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.process
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.broker import broker
from benchmarks.harness import load_average, sayer, stop_process, tree_commit
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.group.group_info import GroupInfo, describe_group

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 6
say = sayer("queries")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument("--rate", type=int, default=500, help="input events/s")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent readers")
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--bootstrap", default=None, help="a loopback broker (default: fresh)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser.parse_args(argv)


async def produce_forever(bootstrap: str, topic: str, keys: list[str], rate: int) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        i = 0
        tick = 0.05
        per_tick = max(1, int(rate * tick))
        while True:
            started = time.monotonic()
            for _ in range(per_tick):
                key = keys[i % len(keys)]
                await producer.send(topic, f"e{i}".encode(), key=key.encode())
                i += 1
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))
    finally:
        await producer.stop()


def produce_process(bootstrap: str, topic: str, keys: list[str], rate: int) -> None:
    """The producer's process (until terminated)."""
    asyncio.run(produce_forever(bootstrap, topic, keys, rate))


async def wait_group(bootstrap: str, group: str, workers: int, source: str) -> GroupInfo:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            info = await describe_group(bootstrap, group)
        except Exception:
            info = None
        if (
            info is not None
            and info.state == "Stable"
            and len(info.members) == workers
            and all(m.host for m in info.members)
            and sum(len(m.active.get(source, [])) for m in info.members) == PARTITIONS
        ):
            return info
        await asyncio.sleep(0.5)
    raise SystemExit(f"group {group} did not settle with {workers} members")


async def read_loop(
    session: aiohttp.ClientSession,
    targets: list[tuple[str, str]],
    offset: int,
    until: float,
    latencies: list[float],
    failures: list[int],
) -> None:
    i = offset
    while time.monotonic() < until:
        host, key = targets[i % len(targets)]
        i += 1
        started = time.perf_counter()
        async with session.get(f"http://{host}/tables/counts/{key}") as response:
            await response.read()
            status = response.status
        latencies.append((time.perf_counter() - started) * 1000)
        if status != 200:
            failures.append(status)


async def phase(
    name: str, targets: list[tuple[str, str]], seconds: float, concurrency: int
) -> dict[str, Any]:
    latencies: list[float] = []
    failures: list[int] = []
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        # warm the connections (and the owners' forwarding sessions) first
        warm = time.monotonic() + 1.0
        await asyncio.gather(
            *(read_loop(session, targets, i, warm, [], []) for i in range(concurrency))
        )
        started = time.monotonic()
        until = started + seconds
        await asyncio.gather(
            *(
                read_loop(session, targets, i * 97, until, latencies, failures)
                for i in range(concurrency)
            )
        )
        elapsed = time.monotonic() - started
    ordered = sorted(latencies)
    return {
        "phase": name,
        "reads": len(ordered),
        "reads_per_s": round(len(ordered) / elapsed, 1),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 2),
        "max_ms": round(ordered[-1], 2),
        "not_ok": len(failures),
        "statuses": sorted(set(failures)),
    }


def start_worker(n: int, env: dict[str, str], workdir: Path) -> subprocess.Popen[bytes]:
    """Worker ``w<n>`` of the counter test app, its web server on a free port."""
    log = (workdir / f"w{n}.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamjoin.cli",
            "worker",
            "-A",
            "tests.integration.apps.counter:app",
            "--state-dir",
            str(workdir / f"state-w{n}"),
            "--instance-id",
            f"w{n}",
            "--web-port",
            "0",
            "--loglevel",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # stop_process signals the process group
    )


async def run(args: argparse.Namespace, bootstrap: str, workdir: Path) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    group, source = f"qbench-{run_id}", f"qbench-events-{run_id}"
    env = {
        **os.environ,
        "SJT_APP_ID": group,
        "SJT_BROKER": f"kafka://{bootstrap}",
        "SJT_SOURCE": source,
        "SJT_SINK": f"qbench-counts-{run_id}",
        "SJT_PARTITIONS": str(PARTITIONS),
        "SJT_STANDBYS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    procs = [start_worker(n, env, workdir) for n in range(args.workers)]
    keys = [f"user-{i}" for i in range(args.keys)]
    producing: multiprocessing.process.BaseProcess | None = None
    try:
        info = await wait_group(bootstrap, group, args.workers, source)
        say(f"{args.workers} workers stable; producing {args.rate} events/s")
        # its own process: the readers' event loop must measure reads, not its sends
        producing = multiprocessing.get_context("spawn").Process(
            target=produce_process, args=(bootstrap, source, keys, args.rate), daemon=True
        )
        producing.start()
        owners = {p: m.host for m in info.members for p in m.active.get(source, []) if m.host}
        hosts = sorted({h for h in owners.values()})
        # every key counted at least once before measuring
        await asyncio.sleep(max(3.0, 2 * args.keys / args.rate))
        local, forwarded = [], []
        for key in keys:
            owner = owners[partition_for_key(key.encode(), PARTITIONS)]
            local.append((owner, key))
            others = [h for h in hosts if h != owner]
            forwarded.append((others[hash(key) % len(others)], key))
        results = []
        for name, targets in (("local", local), ("forwarded", forwarded)):
            say(f"phase {name}: {args.seconds:.0f} s, {args.concurrency} readers")
            results.append(await phase(name, targets, args.seconds, args.concurrency))
        return {
            "commit": tree_commit(str(ROOT)),
            "workers": args.workers,
            "rate": args.rate,
            "concurrency": args.concurrency,
            "keys": args.keys,
            "seconds": args.seconds,
            "load": load_average(),
            "phases": results,
        }
    finally:
        if producing is not None:
            producing.terminate()
            producing.join(10)
        for proc in procs:
            stop_process(proc)


def table(report: dict[str, Any]) -> str:
    lines = [
        "| reads | readers | reads/s | p50 ms | p99 ms | max ms | not 200 |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in report["phases"]:
        lines.append(
            f"| {p['phase']} | {report['concurrency']} | {p['reads_per_s']} | {p['p50_ms']} | "
            f"{p['p99_ms']} | {p['max_ms']} | {p['not_ok']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qbench-") as tmp, broker(args.bootstrap, say) as bs:
        report = asyncio.run(run(args, bs, Path(tmp)))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"commit {report['commit']}, {report['workers']} workers, {report['rate']} "
            f"events/s in, load {report['load']}"
        )
        print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
