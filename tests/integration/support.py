"""Shared helpers for integration tests: produce/read through aiokafka, worker processes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streamjoin.runtime.group.group_info import GroupInfo, MemberInfo, describe_group

ROOT = Path(__file__).resolve().parents[2]


async def produce(bootstrap: str, topic: str, records: list[tuple[str, str]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, value.encode(), key=key.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def read_all(
    bootstrap: str,
    topic: str,
    expected: int,
    timeout: float = 60.0,
    isolation_level: str = "read_uncommitted",
) -> list[tuple[str, str, dict[str, bytes]]]:
    """Everything in ``topic``: waits for at least ``expected`` records, then reads on until
    the topic has nothing more (so duplicates written late are seen too).
    ``isolation_level="read_committed"`` reads what a transactional app committed only
    (records of aborted transactions are skipped, open ones wait for their outcome)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        isolation_level=isolation_level,
    )
    await consumer.start()
    out: list[tuple[str, str, dict[str, bytes]]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                out.extend(
                    (r.key.decode(), r.value.decode(), dict(r.headers or ())) for r in records
                )
            if len(out) >= expected and not batch:
                break
    finally:
        await consumer.stop()
    return out


async def read_to_end(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation_level: str = "read_committed",
    timeout: float = 60.0,
) -> list[tuple[str, str]]:
    """Every record of the ``partitions`` partitions of ``topic`` up to its end (under
    ``read_committed`` the last stable offset: nothing of a transaction still open), as
    (key, value) in offset order per partition; reads until the end stops moving. Unlike
    :func:`read_all` it needs no expected count, so it returns as soon as the topic is
    read, however few records it has."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
        enable_auto_commit=False,
    )
    await consumer.start()
    out: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                out.extend((r.key.decode(), r.value.decode()) for r in records)
            if batch:
                quiet_since = time.monotonic()
            positions = {tp: await consumer.position(tp) for tp in tps}
            # a partition ending in a transaction marker may leave the position just short
            # of the end (no record after it to move past): 2 s of nothing also ends it
            caught_up = all(positions[tp] >= ends[tp] for tp in tps)
            if caught_up or time.monotonic() - quiet_since > 2.0:
                newer = await consumer.end_offsets(tps)
                if newer == ends:
                    return out
                ends = newer
                quiet_since = time.monotonic()
        raise AssertionError(f"{topic} not read to its end {ends} in {timeout:.0f}s")
    finally:
        await consumer.stop()


async def end_offsets(
    bootstrap: str, topic: str, partitions: int, isolation_level: str = "read_uncommitted"
) -> list[int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
        return [ends[tp] for tp in tps]
    finally:
        await consumer.stop()


async def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        return [
            (await consumer.committed(TopicPartition(topic, p))) or 0 for p in range(partitions)
        ]
    finally:
        await consumer.stop()


class Workers:
    """Worker processes (``streamjoin worker``) of one test app, each with its own state dir."""

    def __init__(self, app_spec: str, env: dict[str, str], log_dir: Path) -> None:
        self.app_spec = app_spec
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def state_dir(self, name: str) -> Path:
        return self.log_dir / f"state-{name}"

    def log_of(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(
        self,
        name: str,
        *,
        static: bool = True,
        cwd: Path | None = None,
        instance_id: str | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        """Start worker ``name`` (its instance id is ``name`` unless ``instance_id`` says
        otherwise); ``cwd`` runs another checkout's streamjoin package (its directory holds
        ``streamjoin/`` and the test apps)."""
        log = (self.log_dir / f"{name}.log").open("ab")
        args = [
            sys.executable,
            "-m",
            "streamjoin.cli",
            "worker",
            "-A",
            self.app_spec,
            "--state-dir",
            str(self.state_dir(name)),
            "--loglevel",
            "info",
        ]
        if static:
            args += ["--instance-id", instance_id or name]
        args += extra
        self.procs[name] = subprocess.Popen(
            args,
            cwd=cwd or ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def stop(self, instance_id: str, sig: int = signal.SIGTERM) -> int:
        proc = self.procs.pop(instance_id)
        proc.send_signal(sig)
        return proc.wait(60)

    def stop_all(self, sig: int = signal.SIGTERM) -> dict[str, int]:
        """Signal every worker at once (a full stop), then wait for each; exit codes."""
        procs, self.procs = self.procs, {}
        for proc in procs.values():
            proc.send_signal(sig)
        return {name: proc.wait(60) for name, proc in procs.items()}

    def name_of(self, member: MemberInfo) -> str:
        """The worker a group member is: its instance id, else the pid in its client id
        (``<app id>-<host>-<pid>-<uuid>``, see ``runtime/worker.py``)."""
        if member.instance_id:
            return member.instance_id
        for name, proc in self.procs.items():
            if f"-{proc.pid}-" in member.member_id:
                return name
        raise AssertionError(f"no running worker is member {member.member_id}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.log_dir.glob("*.log"))
        )

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()


async def wait_for_group(
    bootstrap: str,
    group: str,
    predicate: Callable[[GroupInfo], bool],
    workers: Workers,
    timeout: float = 60.0,
) -> GroupInfo:
    deadline = time.monotonic() + timeout
    info: GroupInfo | None = None
    while time.monotonic() < deadline:
        try:
            info = await describe_group(bootstrap, group)
        except Exception:
            info = None
        if info is not None and info.state == "Stable" and predicate(info):
            return info
        await asyncio.sleep(0.5)
    raise AssertionError(
        f"group {group} never reached the expected state: {info}\n{workers.logs()}"
    )


def replayed_records(log_text: str) -> int:
    """Changelog records a worker's log says it had to replay to restore active tasks."""
    return sum(int(n) for n in re.findall(r"(\d+) changelog records to replay", log_text))


def sizes(info: GroupInfo, topic: str) -> list[int]:
    return sorted(len(m.active.get(topic, [])) for m in info.members)


def active_by_instance(info: GroupInfo, topic: str) -> dict[str, set[int]]:
    return {m.instance_id or m.member_id: set(m.active.get(topic, [])) for m in info.members}


def counter_workers(
    bootstrap: str, unique_topic: Callable[..., str], log_dir: Path, partitions: int
) -> Workers:
    """Worker processes of tests/integration/apps/counter.py on fresh topics."""
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("cnt"),
        "SJT_BROKER": f"kafka://{bootstrap}",
        "SJT_SOURCE": unique_topic("events"),
        "SJT_SINK": unique_topic("counts"),
        "SJT_PARTITIONS": str(partitions),
        "PYTHONUNBUFFERED": "1",
    }
    return Workers("tests.integration.apps.counter:app", env, log_dir)


def tracker_workers(
    bootstrap: str,
    unique_topic: Callable[..., str],
    log_dir: Path,
    partitions: int,
    **settings: str,
) -> Workers:
    """Worker processes of tests/integration/apps/tracker.py on fresh topics, tracing into
    ``log_dir``/trace; ``settings`` are more of its environment variables (SJT_STANDBYS,
    SJT_REBALANCE_PROTOCOL, ...)."""
    trace_dir = log_dir / "trace"
    trace_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("track"),
        "SJT_BROKER": f"kafka://{bootstrap}",
        "SJT_SOURCE": unique_topic("events"),
        "SJT_PARTITIONS": str(partitions),
        "SJT_TRACE_DIR": str(trace_dir),
        "PYTHONUNBUFFERED": "1",
        **settings,
    }
    return Workers("tests.integration.apps.tracker:app", env, log_dir)


def join_workers(
    bootstrap: str,
    unique_topic: Callable[..., str],
    log_dir: Path,
    partitions: int,
    **settings: str,
) -> Workers:
    """Worker processes of tests/integration/apps/joiner.py on fresh topics; ``settings``
    are more of its environment variables (SJT_HOW, SJT_WORK_MS, ...)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("join"),
        "SJT_BROKER": f"kafka://{bootstrap}",
        "SJT_IMPRESSIONS": unique_topic("imp"),
        "SJT_CLICKS": unique_topic("clk"),
        "SJT_OUTPUT": unique_topic("out"),
        "SJT_PARTITIONS": str(partitions),
        "PYTHONUNBUFFERED": "1",
        **settings,
    }
    return Workers("tests.integration.apps.joiner:app", env, log_dir)


def eos_workers(
    bootstrap: str,
    unique_topic: Callable[..., str],
    log_dir: Path,
    partitions: int,
    **settings: str,
) -> Workers:
    """Worker processes of tests/integration/apps/eos_app.py (a join and a counting table)
    on fresh topics; ``settings`` are more of its environment variables (SJT_GUARANTEE,
    SJT_SESSION_TIMEOUT_MS, SJT_WORK_MS, ...)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("eos"),
        "SJT_BROKER": f"kafka://{bootstrap}",
        "SJT_IMPRESSIONS": unique_topic("imp"),
        "SJT_CLICKS": unique_topic("clk"),
        "SJT_OUTPUT": unique_topic("out"),
        "SJT_EVENTS": unique_topic("events"),
        "SJT_COUNTS": unique_topic("counts"),
        "SJT_PARTITIONS": str(partitions),
        "PYTHONUNBUFFERED": "1",
        **settings,
    }
    return Workers("tests.integration.apps.eos_app:app", env, log_dir)


async def produce_traffic(
    bootstrap: str, env: dict[str, str], records: Iterable[Any], linger_ms: int = 20
) -> None:
    """Produce ad traffic (``examples.ad_traffic`` records) to the join app's input topics."""
    topics = {"impressions": env["SJT_IMPRESSIONS"], "clicks": env["SJT_CLICKS"]}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=linger_ms)
    await producer.start()
    try:
        for rec in records:
            await producer.send(
                topics[rec.topic],
                json.dumps(rec.value).encode(),
                key=rec.key.encode(),
                timestamp_ms=rec.timestamp_ms,
            )
        await producer.flush()
    finally:
        await producer.stop()


class Traffic:
    """Events on 30 keys at a steady rate, until stopped; remembers how many per key."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.sent: Counter[str] = Counter()
        self._stop = asyncio.Event()

    async def run(self, per_second: int = 200) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            i = 0
            while not self._stop.is_set():
                for _ in range(per_second // 20):
                    key = f"k{i % 30}"
                    await producer.send(self.topic, b"e", key=key.encode())
                    self.sent[key] += 1
                    i += 1
                await asyncio.sleep(0.05)
            await producer.flush()
        finally:
            await producer.stop()

    def stop(self) -> None:
        self._stop.set()
