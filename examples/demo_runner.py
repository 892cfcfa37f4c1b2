"""Runs the ad-monetization demo end to end on a local broker and prints a summary.

Steps: start Apache Kafka, start three ``streamjoin worker`` processes, produce
the first half of the generated traffic, stop one worker (SIGTERM) and time how
long the group takes to resume, produce the rest, wait until every input is
processed and committed, then compare the joined output with the expected joins
and report, from the workers' logs, what each rebalance handed over and how long
it paused (``benchmarks/rebalance_analysis.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from benchmarks.rebalance_analysis import describe_rebalances, read_worker_log, rebalances
from examples.ad_traffic import Traffic, generate
from streamjoin.local_cluster import LocalKafkaCluster
from streamjoin.local_kafka import LocalKafka
from streamjoin.runtime.group.group_info import describe_group
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

ROOT = Path(__file__).resolve().parents[1]
APP_SPEC = "examples.ad_monetization:app"
GROUP = "ad-monetization"
INPUTS = ("impressions", "clicks")
OUTPUT = "attributed-clicks"
PARTITIONS = 10


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Worker:
    def __init__(self, name: str, bootstrap: str, workdir: Path) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        env = {**os.environ, "STREAMJOIN_BROKER": f"kafka://{bootstrap}", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamjoin.cli",
                "worker",
                "-A",
                APP_SPEC,
                "--state-dir",
                str(workdir / f"state-{name}"),
                "--loglevel",
                "info",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


async def wait_members(bootstrap: str, count: int, timeout: float = 90) -> float:
    """Seconds until the group is stable with ``count`` members owning every partition."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            info = await describe_group(bootstrap, GROUP)
        except Exception:
            info = None
        if info is not None and info.state == "Stable" and len(info.members) == count:
            owned = sum(len(m.active.get("impressions", [])) for m in info.members)
            if owned == PARTITIONS:
                return time.monotonic() - started
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the group never reached {count} stable members")


async def produce(bootstrap: str, traffic: Traffic, start: int, end: int, speedup: float) -> None:
    """Produce records ``start:end`` in arrival order, replaying event time ``speedup`` times
    faster than real time (a burst with no pacing would compress minutes of event time
    into milliseconds, far tighter than any real producer and any grace period)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    records = traffic.records[start:end]
    try:
        began = time.monotonic()
        first_ts = records[0].timestamp_ms if records else 0
        clock_ts = first_ts
        for rec in records:
            clock_ts = max(clock_ts, rec.timestamp_ms)
            ahead = (clock_ts - first_ts) / 1000 / speedup - (time.monotonic() - began)
            if ahead > 0.005:
                await asyncio.sleep(ahead)
            await producer.send(
                rec.topic,
                json.dumps(rec.value, sort_keys=True, separators=(",", ":")).encode(),
                key=rec.key.encode(),
                timestamp_ms=rec.timestamp_ms,
            )
        await producer.flush()
    finally:
        await producer.stop()


async def wait_processed(bootstrap: str, timeout: float = 180) -> None:
    """Until the group's committed offsets reach the end of both input topics."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in INPUTS for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            committed = {tp: (await consumer.committed(tp)) or 0 for tp in tps}
            behind = sum(ends[tp] - committed[tp] for tp in tps)
            if behind <= 0:
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"inputs still {behind} records behind after {timeout}s")
    finally:
        await consumer.stop()


async def read_output(bootstrap: str) -> list[dict[str, str]]:
    consumer = AIOKafkaConsumer(OUTPUT, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    out: list[dict[str, str]] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=1500)
            if not batch:
                return out
            for records in batch.values():
                out.extend(json.loads(r.value) for r in records)
    finally:
        await consumer.stop()


async def run(
    bootstrap: str, auctions: int, workdir: Path, seconds: float, replicas: int = 1
) -> int:
    await ensure_topics(bootstrap, [TopicSpec(t, PARTITIONS, replicas) for t in (*INPUTS, OUTPUT)])
    traffic = generate(auctions)
    say(
        f"traffic: {traffic.impressions} impressions, {traffic.clicks} clicks "
        f"({traffic.clicks_outside_window} outside the 10 min window, {traffic.orphan_clicks} "
        f"without an impression), out of order by up to 20 s; {len(traffic.expected_joins)} "
        "joins expected"
    )
    workers = [Worker(f"w{i}", bootstrap, workdir) for i in (1, 2, 3)]
    try:
        say("starting 3 workers")
        await wait_members(bootstrap, 3)
        half = len(traffic.records) // 2
        say(f"producing the first {half} records")
        span_s = (traffic.records[-1].timestamp_ms - traffic.records[0].timestamp_ms) / 1000
        speedup = max(1.0, span_s / seconds)
        say(f"replaying {span_s / 60:.0f} min of event time {speedup:.0f}x faster than real time")
        await produce(bootstrap, traffic, 0, half, speedup)
        await asyncio.sleep(1.0)
        say("stopping worker w3 (SIGTERM) mid-stream")
        stopped = time.monotonic()
        code = workers[2].stop()
        resume = await wait_members(bootstrap, 2)
        resumed_after = time.monotonic() - stopped
        say(f"w3 exited with code {code}; 2 workers resumed after {resumed_after:.1f}s")
        say(f"producing the remaining {len(traffic.records) - half} records")
        await produce(bootstrap, traffic, half, len(traffic.records), speedup)
        await wait_processed(bootstrap)
        output = await read_output(bootstrap)
        # rebalances of the run itself (not of the final shutdown, where members leave one
        # by one)
        run_logs = {w.name: w.log() for w in workers}
    except BaseException:
        for w in workers:
            print(
                f"--- last lines of worker {w.name}'s log:\n"
                + "\n".join(w.log().splitlines()[-15:])
            )
        raise
    finally:
        for w in workers:
            w.stop()
    got = [(o["auction_id"], o["impression_id"], o["click_id"]) for o in output]
    distinct = set(got)
    missing = traffic.expected_joins - distinct
    unexpected = distinct - traffic.expected_joins
    duplicates = len(got) - len(distinct)
    print()
    print("=== ad-monetization demo summary ===")
    print(f"joins expected           {len(traffic.expected_joins)}")
    print(f"joins emitted (distinct) {len(distinct)}")
    print(f"missing                  {len(missing)}")
    print(f"unexpected               {len(unexpected)}")
    print(f"duplicates               {duplicates}  (at-least-once: replays after the stop)")
    logs = "\n".join(w.log() for w in workers)
    late = logs.count("is late and dropped")
    beyond = logs.count("is beyond the grace period")
    print(f"late events dropped      {late}  (accepted beyond grace: {beyond})")
    print(f"time to resume after stopping a worker: {resume:.1f}s (group stable again)")
    print(
        "rebalances (from the workers' logs; a task moved pauses from its revocation on the "
        "old worker to its resumption on the new one, restore included):"
    )
    found = rebalances(read_worker_log(name, text) for name, text in run_logs.items())
    for line in describe_rebalances(found):
        print(f"  {line}")
    (workdir / "missing-joins.json").write_text(json.dumps(sorted(missing), indent=0))
    ok = not missing and not unexpected
    print("result:", "CORRECT" if ok else "WRONG")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--auctions", type=int, default=20_000, help="impressions to generate")
    parser.add_argument(
        "--seconds",
        type=float,
        default=45.0,
        help="wall time to replay the traffic over (a faster replay compresses event time: "
        "fetch skew between the inputs then spans more of the grace period)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep worker logs and state here (default: a temp dir)",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="run the demo on a local cluster of this many Kafka brokers (3: every topic "
        "with 3 replicas and min.insync.replicas=2)",
    )
    args = parser.parse_args()
    if args.brokers < 1:
        parser.error(f"--brokers must be at least 1, got {args.brokers}")
    kafka = (
        LocalKafka(progress=say)
        if args.brokers == 1
        else LocalKafkaCluster(args.brokers, progress=say)
    )
    with tempfile.TemporaryDirectory(prefix="streamjoin-demo-") as tmp, kafka:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        replicas = min(3, args.brokers)
        return asyncio.run(
            run(kafka.bootstrap_servers, args.auctions, workdir, args.seconds, replicas)
        )
