"""Exactly-once processing (issue 13) on the real broker: kill -9, zombies, aborted changelogs.

Every scenario is a function of the processing guarantee. The suite runs the
exactly-once variants (skipped while ``processing_guarantee="exactly_once"`` is not
accepted), plus one at-least-once soak that must SEE duplicates after kill -9: the proof
that the counting below can fail. Set ``EOS_TESTS_DETECTION=1`` to also run the
at-least-once variants of the zombie and aborted-changelog scenarios: they pass when
they find the fault the exactly-once variants guard against.

1. ``test_kill_9_soak_is_exact``: three workers of tests/integration/apps/eos_app.py (a
   stream-stream join and a counting table), one killed with SIGKILL every few seconds
   and restarted with the same instance id (so the same transactional id), while
   traffic flows. A ``read_committed`` reader of the outputs must find every expected
   join once and nothing else, and per counted key the updates "<key>=1" ... "<key>=n",
   each once and in order, n the true number of events; the same for a second counting
   agent that takes its events in batches (``stream.take``). ``SOAK_SCALE`` (default 1)
   multiplies its duration for a larger run (``soak_size``, ``run_soak``).
2. ``test_zombie_commits_nothing_after_its_partitions_moved``: a worker frozen (SIGSTOP)
   past its 6 s session timeout while processing a backlog; its partitions move to the
   other worker; then it resumes (SIGCONT). Its output must not reach ``read_committed``
   readers twice, and the group's committed offsets must never move backwards.
3. ``test_aborted_changelog_records_are_not_restored``: transactions written into a
   table's changelog and aborted must not be restored (a committed one must), both by a
   worker replaying its changelog from its local checkpoint and by one rebuilding the
   table from scratch.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from examples.ad_traffic import Traffic, generate
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.group.group_info import GroupInfo
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import (
    Workers,
    committed_offsets,
    counter_workers,
    end_offsets,
    eos_workers,
    produce,
    produce_traffic,
    read_to_end,
    sizes,
    wait_for_group,
)

#: partitions of every input and output topic of the apps here (and of their tables)
PARTITIONS = 6

EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"
#: the guarantees each fault scenario runs under: exactly-once (must be exact), plus the
#: at-least-once variant on request (``EOS_TESTS_DETECTION=1``), which must show the fault
#: and so proves the scenario and its counting can fail (see ``check_guarantee``)
GUARANTEES = [EXACTLY_ONCE] + (
    [AT_LEAST_ONCE] if os.environ.get("EOS_TESTS_DETECTION") == "1" else []
)


def check_guarantee(guarantee: str, exact: bool, outcome: object) -> None:
    """Exactly-once must be exact; the at-least-once variant must NOT be (it proves the
    scenario and its counting can fail)."""
    if guarantee == EXACTLY_ONCE:
        assert exact, str(outcome)
    else:
        assert not exact, f"at-least-once showed no fault, so this test cannot catch one: {outcome}"


# --------------------------------------------------------------------------- checking


def join_key(value: str) -> tuple[str, str, str]:
    result = json.loads(value)
    return (result["auction_id"], result["impression_id"], result["click_id"])


@dataclass
class JoinCheck:
    expected: int
    missing: int
    duplicates: int  #: copies beyond the first of an expected join
    unexpected: int

    @classmethod
    def of(cls, records: Iterable[tuple[str, str]], expected: set[tuple[str, str, str]]):
        got = Counter(join_key(value) for _, value in records)
        return cls(
            expected=len(expected),
            missing=len(expected - set(got)),
            duplicates=sum(n - 1 for j, n in got.items() if j in expected),
            unexpected=sum(n for j, n in got.items() if j not in expected),
        )

    @property
    def exact(self) -> bool:
        return not (self.missing or self.duplicates or self.unexpected)

    def __str__(self) -> str:
        return (
            f"joins: {self.missing} of {self.expected} missing, {self.duplicates} duplicates, "
            f"{self.unexpected} unexpected"
        )


@dataclass
class CountCheck:
    """The "<key>=<count>" updates of a counting table against the true counts."""

    events: int
    updates: int
    #: updates repeating a (key, count) already seen: events counted twice in the output
    repeated: int
    #: key -> (last count, true count), where they differ
    wrong_final: dict[str, tuple[int, int]]
    #: keys whose updates are not exactly 1, 2, ..., n in order
    broken_sequences: dict[str, list[int]]
    truth: Counter[str] = field(repr=False, default_factory=Counter)
    sequences: dict[str, list[int]] = field(repr=False, default_factory=dict)

    @classmethod
    def of(cls, records: Iterable[tuple[str, str]], truth: Counter[str]) -> CountCheck:
        sequences: dict[str, list[int]] = {}
        for key, value in records:  # in offset order per partition, so per key
            name, _, count = value.partition("=")
            assert name == key, (key, value)
            sequences.setdefault(key, []).append(int(count))
        wrong = {
            k: (sequences.get(k, [0])[-1], truth[k])
            for k in truth.keys() | sequences.keys()
            if sequences.get(k, [0])[-1] != truth[k]
        }
        broken = {
            k: seq
            for k in truth.keys() | sequences.keys()
            if (seq := sequences.get(k, [])) != list(range(1, truth[k] + 1))
        }
        return cls(
            events=sum(truth.values()),
            updates=sum(len(s) for s in sequences.values()),
            repeated=sum(len(s) - len(set(s)) for s in sequences.values()),
            wrong_final=wrong,
            broken_sequences=broken,
            truth=truth,
            sequences=sequences,
        )

    @property
    def exact(self) -> bool:
        return not (self.repeated or self.wrong_final or self.broken_sequences)

    @property
    def overcounted(self) -> int:
        """Events the final counts hold beyond the truth."""
        return sum(max(0, got - true) for got, true in self.wrong_final.values())

    @property
    def undercounted(self) -> int:
        return sum(max(0, true - got) for got, true in self.wrong_final.values())

    def __str__(self) -> str:
        # an example of each kind of fault: over-, under-counted, repeated updates
        examples = {}
        for key, (got, true) in sorted(self.wrong_final.items()):
            examples.setdefault("over" if got > true else "under", key)
        for key in sorted(self.broken_sequences):
            examples.setdefault("sequence", key)
        shown = "".join(
            f"; e.g. {key} (true count {self.truth[key]}): {_runs(self.sequences.get(key, []))}"
            for key in dict.fromkeys(examples.values())
        )
        return (
            f"counts: {self.updates} updates for {self.events} events, {self.repeated} "
            f"repeated, {len(self.wrong_final)} keys with a wrong final count "
            f"(+{self.overcounted}/-{self.undercounted} events), "
            f"{len(self.broken_sequences)} keys not counted 1..n{shown}"
        )


def _runs(seq: list[int]) -> str:
    """1,2,3,4,3,4,5 -> "1..4, 3..5" (a count sequence, shortened)."""
    runs: list[list[int]] = []
    for n in seq:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in runs[:12]) + (
        ", ..." if len(runs) > 12 else ""
    )


# --------------------------------------------------------------------------- helpers


def all_busy(members: int) -> Callable[[GroupInfo], bool]:
    """A group predicate: ``members`` members, each with active partitions."""
    return lambda info: len(info.members) == members and all(m.active for m in info.members)


async def create_topics(bootstrap: str, env: dict[str, str]) -> None:
    names = ("SJT_IMPRESSIONS", "SJT_CLICKS", "SJT_OUTPUT", "SJT_EVENTS", "SJT_COUNTS")
    await ensure_topics(bootstrap, [TopicSpec(env[n], PARTITIONS) for n in names])


def input_topics(env: dict[str, str]) -> list[str]:
    return [env["SJT_IMPRESSIONS"], env["SJT_CLICKS"], env["SJT_EVENTS"]]


async def wait_all_committed(
    bootstrap: str, workers: Workers, totals: dict[str, int], timeout: float
) -> float:
    """Wait until the group committed every input record; returns the seconds it took."""
    group = workers.env["SJT_APP_ID"]
    started = time.monotonic()
    got: dict[str, int] = {}
    while time.monotonic() - started < timeout:
        for topic in totals:
            got[topic] = sum(await committed_offsets(bootstrap, group, topic, PARTITIONS))
        if all(got[t] >= n for t, n in totals.items()):
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    raise AssertionError(
        f"inputs never fully committed in {timeout:.0f}s: {got} of {totals}\n{workers.logs()}"
    )


async def committed_total(bootstrap: str, group: str, topics: list[str]) -> int:
    """The group's committed offsets of ``topics``, summed over their partitions."""
    total = 0
    for topic in topics:
        total += sum(await committed_offsets(bootstrap, group, topic, PARTITIONS))
    return total


async def sleep_unless(event: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``event`` is set; whether it was set."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


def exited_on_their_own(workers: Workers, known: set[str]) -> list[str]:
    """Workers that exited without being told to (restarted, so the run goes on)."""
    found = []
    for name, proc in list(workers.procs.items()):
        code = proc.poll()
        if code is not None and name not in known:
            found.append(f"{name} exited {code}: ...{workers.log_of(name)[-1500:]}")
            known.add(name)
    return found


class OffsetWatch:
    """The group's committed offsets of ``topics``, sampled every ``every`` seconds;
    any that moves backwards (a zombie committing stale offsets) is remembered."""

    def __init__(self, bootstrap: str, group: str, topics: list[str], every: float = 0.2):
        self.bootstrap = bootstrap
        self.group = group
        self.tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
        self.every = every
        self.high: dict[TopicPartition, int] = {}
        self.regressions: list[str] = []
        self.samples = 0
        self._stop = asyncio.Event()
        self._started = time.monotonic()

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            while not self._stop.is_set():
                for tp in self.tps:
                    committed = await consumer.committed(tp)
                    if committed is None:
                        continue
                    before = self.high.get(tp)
                    if before is not None and committed < before:
                        self.regressions.append(
                            f"{time.monotonic() - self._started:.1f}s {tp.topic}[{tp.partition}]"
                            f" {before} -> {committed}"
                        )
                    self.high[tp] = max(committed, before or 0)
                self.samples += 1
                await sleep_unless(self._stop, self.every)
        finally:
            await consumer.stop()

    def stop(self) -> None:
        self._stop.set()


# --------------------------------------------------------------------------- 1: soak


@dataclass(frozen=True)
class SoakSize:
    seconds: float  #: how long traffic flows and workers are killed
    auctions_per_s: int  #: ad auctions (impression, maybe a click) per second
    events_per_s: int  #: events to count per second
    keys: int  #: keys the counted events are spread over
    kill_every: float  #: mean seconds between two kills (each 0.5x to 1.5x of it)
    down_for: float  #: seconds a killed worker stays down


def soak_size(scale: float | None = None) -> SoakSize:
    """The soak's size: ``scale`` (default: $SOAK_SCALE, else 1) multiplies its duration;
    1 is the suite's ~25 s of traffic with ~6 kills."""
    if scale is None:
        scale = float(os.environ.get("SOAK_SCALE", "1"))
    return SoakSize(
        seconds=25.0 * scale,
        auctions_per_s=250,
        events_per_s=250,
        keys=60,
        kill_every=3.0,
        down_for=0.5,
    )


@dataclass
class SoakOutcome:
    guarantee: str
    size: SoakSize
    joins: JoinCheck
    counts: CountCheck
    #: the same count by an agent taking batches of events (``stream.take``)
    batch_counts: CountCheck
    kills: list[str]
    crashes: list[str]
    seconds: float  #: wall time, from the first record produced to the outputs read
    drain_seconds: float  #: from the end of traffic to every input committed

    @property
    def exact(self) -> bool:
        return (
            self.joins.exact and self.counts.exact and self.batch_counts.exact and not self.crashes
        )

    @property
    def duplicates(self) -> int:
        return self.joins.duplicates + self.counts.repeated + self.batch_counts.repeated

    def __str__(self) -> str:
        return (
            f"{self.guarantee} soak, {len(self.kills)} kills in {self.size.seconds:.0f}s of "
            f"traffic ({self.seconds:.0f}s in all, {self.drain_seconds:.1f}s to commit "
            f"the rest): {self.joins}; {self.counts}; batch agent's {self.batch_counts}; "
            f"workers that exited on their own: "
            f"{self.crashes or 'none'}; kills: {', '.join(self.kills)}"
        )


async def produce_soak_traffic(
    bootstrap: str, env: dict[str, str], traffic: Traffic, size: SoakSize, seed: int
) -> Counter[str]:
    """Ad traffic and counted events at a steady pace for ``size.seconds``; the true
    number of counted events per key."""
    rng = random.Random(seed)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=True
    )
    topics = {"impressions": env["SJT_IMPRESSIONS"], "clicks": env["SJT_CLICKS"]}
    tick = 0.05
    ticks = max(1, round(size.seconds / tick))
    ads = traffic.records
    events_per_tick = max(1, round(size.events_per_s * tick))
    truth: Counter[str] = Counter()
    await producer.start()
    try:
        started = time.monotonic()
        for i in range(ticks):
            for rec in ads[len(ads) * i // ticks : len(ads) * (i + 1) // ticks]:
                await producer.send(
                    topics[rec.topic],
                    json.dumps(rec.value).encode(),
                    key=rec.key.encode(),
                    timestamp_ms=rec.timestamp_ms,
                )
            for _ in range(events_per_tick):
                key = f"k{rng.randrange(size.keys)}"
                await producer.send(env["SJT_EVENTS"], b"e", key=key.encode())
                truth[key] += 1
            await asyncio.sleep(max(0.0, started + (i + 1) * tick - time.monotonic()))
        await producer.flush()
    finally:
        await producer.stop()
    return truth


async def kill_loop(
    workers: Workers, size: SoakSize, done: asyncio.Event, seed: int, started: float
) -> tuple[list[str], list[str]]:
    """Until ``done``: every ~``size.kill_every`` seconds SIGKILL the next worker and
    restart it (same name: same instance id, same state directory) ``size.down_for``
    seconds later. Returns the kills, and the workers found exited on their own
    (restarted too)."""
    rng = random.Random(seed)
    names = sorted(workers.procs)
    victims = itertools.cycle(names)
    kills: list[str] = []
    crashes: list[str] = []
    exited: set[str] = set()
    while not await sleep_unless(done, rng.uniform(0.5, 1.5) * size.kill_every):
        crashes += exited_on_their_own(workers, exited)
        name = next(victims)
        workers.stop(name, signal.SIGKILL)
        kills.append(f"{time.monotonic() - started:.1f}s {name}")
        await asyncio.sleep(size.down_for)
        for restart in {*exited, name}:
            workers.start(restart)
        exited.clear()
    crashes += exited_on_their_own(workers, exited)
    return kills, crashes


async def run_soak(
    bootstrap: str,
    unique_topic: Callable[..., str],
    log_dir: Path,
    guarantee: str,
    size: SoakSize,
    seed: int = 5,
) -> SoakOutcome:
    """The kill -9 soak under ``guarantee``: what a ``read_committed`` reader finds."""
    workers = eos_workers(
        bootstrap,
        unique_topic,
        log_dir,
        PARTITIONS,
        SJT_GUARANTEE=guarantee,
        SJT_BATCH_COUNTS=unique_topic("batch-counts"),
    )
    try:
        env = workers.env
        await create_topics(bootstrap, env)
        await ensure_topics(bootstrap, [TopicSpec(env["SJT_BATCH_COUNTS"], PARTITIONS)])
        traffic = generate(int(size.auctions_per_s * size.seconds), seed=seed)
        for name in ("w1", "w2", "w3"):
            workers.start(name)
        await wait_for_group(bootstrap, env["SJT_APP_ID"], all_busy(3), workers, timeout=90)
        started = time.monotonic()
        done = asyncio.Event()
        killing = asyncio.create_task(kill_loop(workers, size, done, seed, started))
        try:
            truth = await produce_soak_traffic(bootstrap, env, traffic, size, seed)
        finally:
            done.set()
            kills, crashes = await killing
        drain = await wait_all_committed(
            bootstrap,
            workers,
            {
                env["SJT_IMPRESSIONS"]: traffic.impressions,
                env["SJT_CLICKS"]: traffic.clicks,
                env["SJT_EVENTS"]: sum(truth.values()),
            },
            timeout=120 + size.seconds,
        )
        await asyncio.sleep(1.0)  # anything written late (a zombie's output) is seen too
        crashes += exited_on_their_own(workers, set())
        joins = JoinCheck.of(
            await read_to_end(bootstrap, env["SJT_OUTPUT"], PARTITIONS), traffic.expected_joins
        )
        counts = CountCheck.of(await read_to_end(bootstrap, env["SJT_COUNTS"], PARTITIONS), truth)
        batch_counts = CountCheck.of(
            await read_to_end(bootstrap, env["SJT_BATCH_COUNTS"], PARTITIONS), truth
        )
        return SoakOutcome(
            guarantee,
            size,
            joins,
            counts,
            batch_counts,
            kills,
            crashes,
            time.monotonic() - started,
            drain,
        )
    finally:
        workers.close()


async def test_kill_9_soak_is_exact(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Three exactly-once workers, one killed (SIGKILL) every ~4 s and restarted, while
    ad traffic and counted events flow: a ``read_committed`` reader finds every expected
    join exactly once and nothing else, and every key's count updates are exactly
    1, 2, ..., n (n its true number of events): nothing lost, nothing repeated.

    Caught on 6de2c5e: AddOffsetsToTxn answered CONCURRENT_TRANSACTIONS (the previous
    transaction still writing its markers) was taken for a failure; the worker aborted,
    rejoined, got its partitions back and never processed them (fixed by 276d830)."""
    outcome = await run_soak(
        kafka_bootstrap, unique_topic, tmp_path, EXACTLY_ONCE, soak_size(), seed=5
    )
    print(outcome)
    assert len(outcome.kills) >= 3, f"the soak killed too few workers: {outcome}"
    assert outcome.exact, str(outcome)


async def test_at_least_once_soak_sees_the_duplicates_of_kill_9(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The same soak under at-least-once: the reader must find duplicates (joins emitted
    twice, counts repeated or above the truth), or the soak could not catch them under
    exactly-once either. At-least-once still loses nothing: every expected join is there
    and no final count is below the truth."""
    outcome = await run_soak(
        kafka_bootstrap, unique_topic, tmp_path, AT_LEAST_ONCE, soak_size(), seed=5
    )
    print(outcome)
    assert outcome.duplicates > 0 or outcome.counts.overcounted > 0, (
        f"kill -9 under at-least-once left no duplicate to detect: {outcome}"
    )
    assert not outcome.joins.missing and not outcome.joins.unexpected, str(outcome)
    assert not outcome.counts.undercounted, str(outcome)
    assert not outcome.batch_counts.undercounted, str(outcome)


# --------------------------------------------------------------------------- 2: zombie


@dataclass
class ZombieOutcome:
    guarantee: str
    joins: JoinCheck
    counts: CountCheck
    regressions: list[str]  #: committed offsets that moved backwards
    committed_at_stop: int  #: input records committed when the worker was frozen
    committed_at_resume: int  #: ... and when it resumed
    total: int  #: input records in all
    final_committed: dict[str, list[int]]
    ends: dict[str, list[int]]
    seconds: float

    @property
    def exact(self) -> bool:
        return (
            self.joins.exact
            and self.counts.exact
            and not self.regressions
            and self.final_committed == self.ends
        )

    def __str__(self) -> str:
        return (
            f"{self.guarantee} zombie: {self.joins}; {self.counts}; committed offsets moved "
            f"backwards: {self.regressions or 'never'}; committed at SIGSTOP "
            f"{self.committed_at_stop}, at SIGCONT {self.committed_at_resume} of "
            f"{self.total}; final committed {self.final_committed} (ends {self.ends}); "
            f"{self.seconds:.0f}s"
        )


async def zombie_scenario(
    bootstrap: str, unique_topic: Callable[..., str], log_dir: Path, guarantee: str
) -> ZombieOutcome:
    workers = eos_workers(
        bootstrap,
        unique_topic,
        log_dir,
        PARTITIONS,
        SJT_GUARANTEE=guarantee,
        SJT_SESSION_TIMEOUT_MS="6000",  # the broker's minimum
        SJT_WORK_MS="0.5",  # ~14 s of CPU for the whole backlog
    )
    watch: OffsetWatch | None = None
    watching: asyncio.Task[None] | None = None
    try:
        env = workers.env
        group = env["SJT_APP_ID"]
        inputs = input_topics(env)
        await create_topics(bootstrap, env)
        traffic = generate(6_000, seed=23)
        events = [(f"k{(i * 7) % 40}", f"e{i}") for i in range(20_000)]
        truth = Counter(k for k, _ in events)
        total = len(traffic.records) + len(events)
        # the whole backlog before the workers start: both have work from the first second
        await asyncio.gather(
            produce_traffic(bootstrap, env, traffic.records, linger_ms=5),
            produce(bootstrap, env["SJT_EVENTS"], events),
        )
        started = time.monotonic()
        workers.start("w1")
        workers.start("w2")
        await wait_for_group(bootstrap, group, all_busy(2), workers)
        watch = OffsetWatch(bootstrap, group, inputs)
        watching = asyncio.create_task(watch.run())
        # both busy with the backlog, and committing: freeze w2 in the middle of it
        deadline = time.monotonic() + 60
        while await committed_total(bootstrap, group, inputs) < total // 8:
            assert time.monotonic() < deadline, f"nothing committed\n{workers.logs()}"
            await asyncio.sleep(0.2)
        zombie = workers.procs["w2"]
        zombie.send_signal(signal.SIGSTOP)
        try:
            committed_at_stop = await committed_total(bootstrap, group, inputs)
            # past the 6 s session timeout the group drops w2: w1 owns every partition
            await wait_for_group(
                bootstrap,
                group,
                lambda i: (
                    [m.instance_id for m in i.members] == ["w1"]
                    and sizes(i, inputs[2]) == [PARTITIONS]
                ),
                workers,
                timeout=30,
            )
            await asyncio.sleep(2.0)  # w1 processes and commits w2's former partitions
            committed_at_resume = await committed_total(bootstrap, group, inputs)
        finally:
            zombie.send_signal(signal.SIGCONT)  # it finds out it was dropped, and rejoins
        await wait_all_committed(
            bootstrap,
            workers,
            {
                inputs[0]: traffic.impressions,
                inputs[1]: traffic.clicks,
                inputs[2]: len(events),
            },
            timeout=120,
        )
        await asyncio.sleep(2.0)  # whatever the zombie still writes or commits, late
        watch.stop()
        await watching
        final = {t: await committed_offsets(bootstrap, group, t, PARTITIONS) for t in inputs}
        ends = {t: await end_offsets(bootstrap, t, PARTITIONS) for t in inputs}
        joins = JoinCheck.of(
            await read_to_end(bootstrap, env["SJT_OUTPUT"], PARTITIONS), traffic.expected_joins
        )
        counts = CountCheck.of(await read_to_end(bootstrap, env["SJT_COUNTS"], PARTITIONS), truth)
        return ZombieOutcome(
            guarantee,
            joins,
            counts,
            watch.regressions,
            committed_at_stop,
            committed_at_resume,
            total,
            final,
            ends,
            time.monotonic() - started,
        )
    finally:
        if watch is not None and watching is not None:
            watch.stop()
            with contextlib.suppress(Exception):
                await watching
        for proc in workers.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
        workers.close()


@pytest.mark.parametrize(
    "guarantee",
    GUARANTEES,
)
async def test_zombie_commits_nothing_after_its_partitions_moved(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    """Two workers share a backlog (joins and counts); one is frozen (SIGSTOP) in the
    middle of it for longer than its 6 s session timeout, so its partitions move to the
    other; then it resumes (SIGCONT). Whatever it had processed and not committed, and
    whatever it does before it learns it was dropped, must never become visible: a
    ``read_committed`` reader finds every join once and every key counted 1..n, and the
    group's committed offsets never move backwards and end at the inputs' ends.

    Caught on 276d830 (2 runs in 3): the surviving worker's transaction was aborted by
    the rebalances (ILLEGAL_GENERATION), and the update its agent was still sending went
    into the next transaction and was committed without its offsets: the counts
    partition held "k8=474" in a one-record batch right after the worker's own ABORT
    marker, between "k8=371" and "k8=372" (fixed by 75f5aa1)."""
    outcome = await zombie_scenario(kafka_bootstrap, unique_topic, tmp_path, guarantee)
    print(outcome)
    # the scenario happened as intended: frozen mid-backlog, partitions moved under it
    assert outcome.committed_at_stop < outcome.total, str(outcome)
    check_guarantee(guarantee, outcome.exact, outcome)


# ------------------------------------------------------- 3: aborted changelog records

KEYS = [f"user-{i}" for i in range(12)]
#: the key whose injected value is committed (the others' are aborted)
CONTROL_KEY = KEYS[0]


async def inject_changelog_transactions(
    bootstrap: str, changelog: str, truth: Counter[str], transactional_id: str
) -> None:
    """Three transactions into the counter's changelog (keys "str", values json ints, the
    key's partition): every key set to 1000, aborted; ``CONTROL_KEY`` set to its true
    count + 100, committed; every key set to 2000, aborted (so the changelog ends in an
    aborted transaction)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)
    await producer.start()
    try:
        for values, commit in (
            ({k: 1000 for k in KEYS}, False),
            ({CONTROL_KEY: truth[CONTROL_KEY] + 100}, True),
            ({k: 2000 for k in KEYS}, False),
        ):
            await producer.begin_transaction()
            for key, value in values.items():
                await producer.send_and_wait(
                    changelog,
                    json.dumps(value).encode(),
                    key=key.encode(),
                    partition=partition_for_key(key.encode(), PARTITIONS),
                )
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()


def latest_counts(records: Iterable[tuple[str, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in records:
        out[key] = int(value.split("=")[1])
    return out


@dataclass
class RestoreOutcome:
    guarantee: str
    truth: dict[str, int]
    before: dict[str, int]  #: the counts before the injection (the sink's last updates)
    #: after restarting on its own state directory, one more event per key
    replayed: dict[str, int]
    #: after a worker rebuilt the table from the changelog, one more event per key
    rebuilt: dict[str, int]
    logs: str = field(repr=False)

    @property
    def exact(self) -> bool:
        return self.replayed == self.expected(1) and self.rebuilt == self.expected(2)

    def expected(self, more: int) -> dict[str, int]:
        extra = {CONTROL_KEY: 100}
        return {k: self.truth[k] + extra.get(k, 0) + more for k in KEYS}

    def __str__(self) -> str:
        def diff(got: dict[str, int], want: dict[str, int]) -> str:
            wrong = {k: f"{got.get(k)} (expected {want[k]})" for k in KEYS if got.get(k) != want[k]}
            return str(wrong) if wrong else f"all as expected {want}"

        return (
            f"{self.guarantee}: counts before the injection: {diff(self.before, self.truth)}; "
            f"next update after a restart on the local state: "
            f"{diff(self.replayed, self.expected(1))}; after a full restore: "
            f"{diff(self.rebuilt, self.expected(2))}"
        )


async def aborted_changelog_scenario(
    bootstrap: str, unique_topic: Callable[..., str], log_dir: Path, guarantee: str
) -> RestoreOutcome:
    workers = counter_workers(bootstrap, unique_topic, log_dir, PARTITIONS)
    try:
        env = workers.env
        env["SJT_GUARANTEE"] = guarantee
        group, source, sink = env["SJT_APP_ID"], env["SJT_SOURCE"], env["SJT_SINK"]
        changelog = f"{group}-counts-changelog"

        async def one_more_each(name: str, total: int) -> dict[str, int]:
            """Start worker ``name`` (its own state directory, instance id w1), send one
            more event per key; the counts once it is committed."""
            workers.start(name, instance_id="w1")
            await wait_for_group(
                bootstrap, group, lambda i: sizes(i, source) == [PARTITIONS], workers
            )
            await produce(bootstrap, source, [(k, f"more-{total}") for k in KEYS])
            await wait_all_totals(bootstrap, workers, source, total)
            counts = latest_counts(await read_to_end(bootstrap, sink, 1))
            assert workers.stop(name) == 0, workers.log_of(name)
            return counts

        workers.start("w1")
        await wait_for_group(bootstrap, group, lambda i: sizes(i, source) == [PARTITIONS], workers)
        batch = [(KEYS[(i * 7) % len(KEYS)], f"e{i}") for i in range(300)]
        truth = Counter(k for k, _ in batch)
        await produce(bootstrap, source, batch)
        await wait_all_totals(bootstrap, workers, source, len(batch))
        before = latest_counts(await read_to_end(bootstrap, sink, 1))
        assert workers.stop("w1") == 0, workers.log_of("w1")

        await inject_changelog_transactions(bootstrap, changelog, truth, f"{group}-injector")

        # 1. the same worker on its own state: replays the changelog past its checkpoint
        replayed = await one_more_each("w1", len(batch) + len(KEYS))
        # 2. a worker with an empty state directory (same instance id): a full restore
        rebuilt = await one_more_each("w1-fresh", len(batch) + 2 * len(KEYS))
        return RestoreOutcome(guarantee, dict(truth), before, replayed, rebuilt, workers.logs())
    finally:
        workers.close()


async def wait_all_totals(bootstrap: str, workers: Workers, topic: str, total: int) -> None:
    group = workers.env["SJT_APP_ID"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum(await committed_offsets(bootstrap, group, topic, PARTITIONS)) >= total:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"{topic}: {total} records never committed\n{workers.logs()}")


@pytest.mark.parametrize(
    "guarantee",
    GUARANTEES,
)
async def test_aborted_changelog_records_are_not_restored(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    """A counter worker counts 300 events over 12 keys and stops; then three transactions
    are written into its table's changelog with a transactional producer: every key set
    to 1000 (aborted), one key set to its count + 100 (committed), every key set to 2000
    (aborted). The worker restarts on its own state (it replays the changelog from its
    checkpoint), and later a worker with an empty state directory rebuilds the table:
    after each, one more event per key must show the true count + 1 (+ 2), and the key of
    the committed transaction its injected value + 1 (+ 2): aborted records are never
    restored, committed transactional ones are."""
    outcome = await aborted_changelog_scenario(kafka_bootstrap, unique_topic, tmp_path, guarantee)
    print(outcome)
    assert outcome.before == outcome.truth, str(outcome)
    check_guarantee(guarantee, outcome.exact, outcome)
