"""Shared helpers for integration tests: produce/read through aiokafka, worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import RecordMetadata

from streamjoin.runtime.group.group_info import GroupInfo, MemberInfo, describe_group
from streamjoin.runtime.transport.producer import SEQUENCE_BROKEN

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


# -- counted traffic: the ledger app's inputs acknowledged one by one, and what came out ------

#: keys the ledger traffic spreads its events over
LEDGER_KEYS = 24


@dataclass
class AckedTraffic:
    """Inputs with unique ids on ``keys`` keys at a steady rate, until stopped; remembers
    which ones the broker acknowledged (acks=all) and which ones failed.

    With ``join_topics`` (impressions, clicks) it also sends ad auctions, an impression
    then a click keyed by the auction id (tests/integration/apps/ledger_join.py joins
    them): the expected joins are the auctions with both sides in the input topics."""

    bootstrap: str
    topic: str
    keys: int = LEDGER_KEYS
    join_topics: tuple[str, str] | None = None
    acked: dict[str, str] = field(default_factory=dict)  #: input id -> key
    failed: set[str] = field(default_factory=set)
    #: why sends failed: exception type name -> count (shown when a run stalls)
    failures: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    auctions: int = 0
    #: producers replaced after a refused batch broke their sequence numbers
    replaced_producers: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _sequence_broken: bool = False

    def _settled(self, record_id: str, key: str, future: asyncio.Future[RecordMetadata]) -> None:
        if future.cancelled() or future.exception() is not None:
            self.failed.add(record_id)
            error = None if future.cancelled() else future.exception()
            self.failures["cancelled" if error is None else type(error).__name__] += 1
            if isinstance(error, SEQUENCE_BROKEN):
                self._sequence_broken = True
        elif record_id.startswith("e"):
            self.acked[record_id] = key

    async def _send(
        self,
        producer: AIOKafkaProducer,
        pending: set[asyncio.Future[RecordMetadata]],
        topic: str,
        record_id: str,
        key: str,
        value: bytes,
    ) -> None:
        try:
            future = await asyncio.wait_for(producer.send(topic, value, key=key.encode()), 5)
        except Exception as exc:  # the broker is away: this one is not acknowledged
            self.failed.add(record_id)
            self.failures[f"send: {type(exc).__name__}"] += 1
            return
        future.add_done_callback(lambda f, r=record_id, k=key: self._settled(r, k, f))
        pending.add(future)

    async def _producer(self) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            # (a retry after a lost answer would write an input twice: counted as a
            # duplicate output of the worker's)
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=4_000,
            retry_backoff_ms=250,
        )
        await producer.start()
        return producer

    async def run(self, per_second: int = 100, auctions_per_second: int = 40) -> None:
        producer = await self._producer()
        pending: set[asyncio.Future[RecordMetadata]] = set()
        try:
            while not self._stop.is_set():
                if self._sequence_broken:
                    # A batch that failed (its partition had no leader for longer than
                    # the request timeout) leaves a gap in the idempotent producer's
                    # sequence numbers: aiokafka has no epoch bump (KIP-360), so every
                    # later batch to that partition fails with OutOfOrderSequenceNumber.
                    # Like the worker's sender, start a new producer.
                    self._sequence_broken = False
                    old, producer = producer, await self._producer()
                    self.replaced_producers += 1
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(old.stop(), 5)
                for _ in range(per_second // 20):
                    record_id, key = f"e{self.sent}", f"k{self.sent % self.keys}"
                    self.sent += 1
                    await self._send(
                        producer, pending, self.topic, record_id, key, record_id.encode()
                    )
                if self.join_topics is not None:
                    impressions, clicks = self.join_topics
                    for _ in range(auctions_per_second // 20):
                        auction = f"a{self.auctions}"
                        self.auctions += 1
                        for topic, side in ((impressions, "impression"), (clicks, "click")):
                            value = json.dumps({f"{side}_id": f"{side[0]}{auction}"}).encode()
                            await self._send(
                                producer, pending, topic, f"{side[0]}{auction}", auction, value
                            )
                pending = {f for f in pending if not f.done()}
                await asyncio.sleep(0.05)
            if pending:
                await asyncio.wait(pending, timeout=30)
        finally:
            await producer.stop()

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Outcome:
    """What the outputs and the table hold against the inputs."""

    acked: int
    inputs: int  #: records in the input topic (acknowledged or not)
    missing: list[str]  #: acknowledged inputs without an output
    duplicates: int  #: outputs beyond the first of an input
    unknown: int  #: outputs of ids that are not in the input topic
    broken_sequences: dict[str, list[int]]  #: keys whose output counts are not 1..n
    table_wrong: dict[str, tuple[int, int]]  #: key -> (table count, true count) if different
    acked_not_in_topic: int  #: acknowledged but not in the input topic: the broker lost it
    #: where the missing outputs are in the log read uncommitted (id -> partition, offset;
    #: absent: never written): written but not committed means an aborted transaction
    missing_uncommitted: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __str__(self) -> str:
        over = {k: v for k, v in self.table_wrong.items() if v[0] > v[1]}
        under = {k: v for k, v in self.table_wrong.items() if v[0] < v[1]}
        return (
            f"{self.acked} inputs acknowledged, {self.inputs} in the input topic; "
            f"{len(self.missing)} missing (e.g. {self.missing[:5]}), {self.duplicates} "
            f"duplicated outputs, {self.unknown} outputs of unknown inputs, "
            f"{len(self.broken_sequences)} keys not counted 1..n "
            f"(e.g. {dict(list(self.broken_sequences.items())[:2])}), table counts: "
            f"{len(over)} keys over (e.g. {dict(list(over.items())[:3])}), {len(under)} under "
            f"(e.g. {dict(list(under.items())[:3])}); {self.acked_not_in_topic} acknowledged "
            f"inputs not in the input topic; missing outputs found uncommitted: "
            f"{dict(list(self.missing_uncommitted.items())[:12])}"
        )


async def outcome_of(
    bootstrap: str, env: dict[str, str], traffic: AckedTraffic, partitions: int
) -> Outcome:
    """The ledger app's outputs and table (its changelog, read committed) against its
    input topic, read back after the run."""
    inputs = await read_to_end(bootstrap, env["SJT_SOURCE"], partitions)
    outputs = await read_to_end(bootstrap, env["SJT_OUTPUT"], partitions)
    changelog = await read_to_end(bootstrap, f"{env['SJT_APP_ID']}-counts-changelog", partitions)
    truth = Counter(key for key, _ in inputs)
    in_topic = Counter(record_id for _, record_id in inputs)
    answered: Counter[str] = Counter()
    sequences: dict[str, list[int]] = {}
    for key, value in outputs:  # in offset order per partition, so per key
        record = json.loads(value)
        answered[record["id"]] += 1
        sequences.setdefault(key, []).append(record["count"])
    table = {key: json.loads(value) for key, value in changelog}  # the last value per key
    missing = sorted(set(traffic.acked) - set(answered))
    return Outcome(
        acked=len(traffic.acked),
        inputs=len(inputs),
        missing=missing,
        # (an input in the topic twice has two outputs, rightly)
        duplicates=sum(
            max(0, n - max(1, in_topic[record_id])) for record_id, n in answered.items()
        ),
        unknown=sum(n for record_id, n in answered.items() if record_id not in in_topic),
        broken_sequences={
            k: seq
            for k in truth.keys() | sequences.keys()
            if (seq := sequences.get(k, [])) != list(range(1, truth[k] + 1))
        },
        table_wrong={
            k: (table.get(k, 0), truth[k])
            for k in truth.keys() | table.keys()
            if table.get(k, 0) != truth[k]
        },
        acked_not_in_topic=len(set(traffic.acked) - set(in_topic)),
        missing_uncommitted=(
            await uncommitted_places(bootstrap, env["SJT_OUTPUT"], set(missing), partitions)
            if missing
            else {}
        ),
    )


async def uncommitted_places(
    bootstrap: str, topic: str, ids: set[str], partitions: int
) -> dict[str, tuple[int, int]]:
    """Where outputs answering ``ids`` are in ``topic`` read uncommitted (for the report)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_uncommitted",
        enable_auto_commit=False,
    )
    await consumer.start()
    places: dict[str, tuple[int, int]] = {}
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                for record in records:
                    record_id = json.loads(record.value)["id"]
                    if record_id in ids:
                        places[record_id] = (record.partition, record.offset)
            if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                break
    finally:
        await consumer.stop()
    return places


def ledger_workers(
    bootstrap: str,
    unique_topic: Callable[..., str],
    log_dir: Path,
    guarantee: str,
    partitions: int,
    app_spec: str = "tests.integration.apps.ledger:app",
    **settings: str,
) -> Workers:
    """Worker processes of tests/integration/apps/ledger.py (or ``app_spec``, an app built
    on it) on fresh topics; ``settings`` are more of its environment variables."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("ledger"),
        "SJT_BROKER": f"kafka://{bootstrap}",
        "SJT_SOURCE": unique_topic("in"),
        "SJT_OUTPUT": unique_topic("out"),
        "SJT_PARTITIONS": str(partitions),
        "SJT_GUARANTEE": guarantee,
        "PYTHONUNBUFFERED": "1",
        **settings,
    }
    return Workers(app_spec, env, log_dir)


async def wait_all_committed(
    bootstrap: str,
    workers: Workers,
    name: str | None,
    timeout: float = 60.0,
    *,
    partitions: int,
    topics: Sequence[str] | None = None,
) -> None:
    """Until the group's committed offsets reach the end of ``topics`` (by default the
    ledger's input topic); fails at once if worker ``name`` (None: any running worker)
    exits meanwhile."""
    env = workers.env
    deadline = time.monotonic() + timeout
    watched = [env["SJT_SOURCE"]] if topics is None else list(topics)
    ends = {t: await end_offsets(bootstrap, t, partitions) for t in watched}
    committed: dict[str, list[int]] = {}
    while time.monotonic() < deadline:
        for worker in [name] if name is not None else list(workers.procs):
            code = workers.procs[worker].poll()
            assert code is None, f"{worker} exited with {code}\n{workers.log_of(worker)[-6000:]}"
        for topic in watched:
            committed[topic] = await committed_offsets(
                bootstrap, env["SJT_APP_ID"], topic, partitions
            )
        if all(c >= e for t in watched for c, e in zip(committed[t], ends[t], strict=True)):
            return
        await asyncio.sleep(0.5)
    logs = workers.log_of(name)[-6000:] if name is not None else workers.logs()
    raise AssertionError(f"inputs never all committed: {committed} of {ends}\n{logs}")


async def sleep_alive(workers: Workers, name: str, seconds: float) -> None:
    """Sleep, failing at once if the worker exits meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        code = workers.procs[name].poll()
        assert code is None, f"the worker exited with {code}:\n{workers.log_of(name)[-6000:]}"
        await asyncio.sleep(0.2)


def start_dev_command(args: list[str], banner: str) -> tuple[subprocess.Popen[str], str]:
    """Run ``streamjoin <args>`` (a dev-broker or dev-registry command) and wait for its
    first line, which must start with ``banner``; (the process, what follows ``": "``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamjoin.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        stderr = proc.stderr.read() if proc.stderr is not None else ""
        raise AssertionError(f"streamjoin {args[0]} exited with {proc.returncode}:\n{stderr}")
    assert line.startswith(banner), line
    return proc, line.split(": ", 1)[1].strip()
