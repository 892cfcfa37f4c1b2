"""One worker per guarantee of the ledger-and-join app, its traffic, and the counting
after a fault: shared by the broker faults on a cluster (test_cluster_faults.py) and the
network faults through a proxy (test_network_faults.py); and one worker killed -9 and
restarted (:func:`kill_9_and_restart`: test_set_tables.py, test_table_ttl_and_memory.py).

A run injects its fault between :meth:`LedgerRun.fault_begins` and
:meth:`LedgerRun.recovers`; :meth:`LedgerRun.check` then stops the traffic, waits until
everything is committed and counts the outputs against the input topics read back (see
:func:`tests.integration.support.outcome_of`): no acknowledged input without its output;
exactly-once: no duplicate, per key the counts 1..n, the table (its changelog) exact, every
expected join once; at-least-once: duplicates counted and shown, tables at least right.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import (
    AckedTraffic,
    Outcome,
    Workers,
    committed_offsets,
    end_offsets,
    ledger_workers,
    outcome_of,
    read_to_end,
    sleep_alive,
    wait_all_committed,
    wait_for_group,
)
from tests.integration.test_exactly_once import JoinCheck

PARTITIONS = 4
EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"
#: the guarantees each test runs side by side, one worker each
GUARANTEES = (EXACTLY_ONCE, AT_LEAST_ONCE)
#: seconds of traffic before the fault, and after it is over
BEFORE, AFTER = 2.0, 2.0
#: seconds a worker has, from the fault (or the cluster's return), to commit every input
#: written before it
RECOVERY_BOUND = 60.0
#: inputs the producer must get acknowledged after the fault began
AFTER_ACKS = 100
#: the worker's log level (SJT_LOGLEVEL=debug to diagnose a failure)
LOGLEVEL = os.environ.get("SJT_LOGLEVEL", "info")
APP = "tests.integration.apps.ledger_join:app"


@dataclass
class Ledger:
    """One worker of the ledger-and-join app under one guarantee, with its traffic."""

    guarantee: str
    workers: Workers
    traffic: AckedTraffic
    producing: asyncio.Task[None] | None = None

    @property
    def env(self) -> dict[str, str]:
        return self.workers.env

    @property
    def app_id(self) -> str:
        return self.env["SJT_APP_ID"]

    @property
    def transactional_id(self) -> str:
        return f"{self.app_id}-w"  # (static member "w": see transactional_id_for)

    def inputs(self) -> list[str]:
        return [self.env[k] for k in ("SJT_SOURCE", "SJT_IMPRESSIONS", "SJT_CLICKS")]

    def topics(self) -> list[tuple[str, bool]]:
        """Every topic of the app, and whether it is compacted (a changelog)."""
        outputs = [self.env["SJT_OUTPUT"], self.env["SJT_JOINED"]]
        changelogs = [
            f"{self.app_id}-counts-changelog",
            f"{self.app_id}-ad-clicks-buffer-changelog",
        ]
        return [(t, False) for t in [*self.inputs(), *outputs]] + [(t, True) for t in changelogs]


def new_ledger(
    bootstrap: str,
    unique_topic: Callable[..., str],
    log_dir: Path,
    guarantee: str,
    partitions: int = PARTITIONS,
) -> Ledger:
    workers = ledger_workers(
        bootstrap,
        unique_topic,
        log_dir,
        guarantee,
        partitions,
        APP,
        SJT_IMPRESSIONS=unique_topic("imp"),
        SJT_CLICKS=unique_topic("clk"),
        SJT_JOINED=unique_topic("joined"),
    )
    env = workers.env
    traffic = AckedTraffic(
        bootstrap, env["SJT_SOURCE"], join_topics=(env["SJT_IMPRESSIONS"], env["SJT_CLICKS"])
    )
    return Ledger(guarantee, workers, traffic)


# --------------------------------------------------------------------------- kill -9, restart


@dataclass(frozen=True)
class KilledRun:
    """What one ledger worker killed -9 mid-stream and restarted left behind."""

    traffic: AckedTraffic
    outcome: Outcome
    #: inputs acknowledged when the worker was killed
    acked_at_kill: int
    #: the worker's log, both runs
    log: str


async def kill_9_and_restart(
    bootstrap: str,
    workers: Workers,
    partitions: int,
    seconds: tuple[float, float],
    *,
    names: Sequence[str] = ("w",),
    while_down: Callable[[], None] = lambda: None,
    committed_topics: Sequence[str] | None = None,
) -> KilledRun:
    """Run the ledger workers ``names`` of ``workers`` (ledger_workers) under acknowledged
    traffic, SIGKILL the last one after ``seconds[0]``, call ``while_down`` (to wipe or
    inspect its state), restart it under the same instance id, stop the traffic
    ``seconds[1]`` later, wait until every input (and ``committed_topics``) is committed
    and count. Asserts traffic acknowledged on both sides of the kill, no acknowledged
    input without its output and, under exactly-once, no duplicate, no unknown output, per
    key the counts 1..n and the table exact. The caller stops the workers (left running
    for more checks) and closes ``workers``."""
    env, killed = workers.env, names[-1]
    traffic = await ledger_traffic(bootstrap, env, partitions)
    producing: asyncio.Task[None] | None = None
    try:
        for name in names:
            workers.start(name)
        joined = len(names)
        await wait_for_group(
            bootstrap, env["SJT_APP_ID"], lambda i: len(i.members) == joined, workers
        )
        producing = asyncio.create_task(traffic.run())
        await sleep_alive(workers, killed, seconds[0])
        acked_at_kill = len(traffic.acked)
        assert workers.stop(killed, signal.SIGKILL) == -signal.SIGKILL
        while_down()
        workers.start(killed)
        await sleep_alive(workers, killed, seconds[1])
    finally:
        traffic.stop()
        if producing is not None:
            await producing
    assert len(traffic.acked) > acked_at_kill > 0, "traffic on both sides of the kill"
    topics = [env["SJT_SOURCE"], *(committed_topics or ())]
    await wait_all_committed(bootstrap, workers, None, 90, partitions=partitions, topics=topics)
    outcome = await outcome_of(bootstrap, env, traffic, partitions)
    log = "".join(workers.log_of(name) for name in names)
    report = f"{outcome}\n{log[-6000:]}"
    print(outcome)
    assert not outcome.missing and outcome.acked_not_in_topic == 0, report
    if env["SJT_GUARANTEE"] == EXACTLY_ONCE:
        assert outcome.duplicates == 0 and outcome.unknown == 0, report
        assert not outcome.broken_sequences and not outcome.table_wrong, report
    return KilledRun(traffic, outcome, acked_at_kill, log)


async def ledger_traffic(bootstrap: str, env: dict[str, str], partitions: int) -> AckedTraffic:
    """The ledger's input and output topics, created, and acknowledged traffic to its
    input (not started: see :meth:`AckedTraffic.run`)."""
    await ensure_topics(
        bootstrap,
        [TopicSpec(env["SJT_SOURCE"], partitions), TopicSpec(env["SJT_OUTPUT"], partitions)],
    )
    return AckedTraffic(bootstrap, env["SJT_SOURCE"])


# --------------------------------------------------------------------------- one run


@dataclass
class LedgerRun:
    """The workers of one fault test, wherever their brokers are, and what the test saw
    of them. ``bootstrap``: where the test's own clients (checks, offsets) connect."""

    bootstrap: str
    ledgers: list[Ledger]
    notes: list[str] = field(default_factory=list)
    #: inputs acknowledged when the fault began, per ledger (its id())
    acked_before: dict[int, int] = field(default_factory=dict)

    async def traffic_for(self, seconds: float) -> None:
        """Let traffic flow, failing at once if a worker exits."""
        for ledger in self.ledgers:
            if ledger.producing is None:
                ledger.producing = asyncio.create_task(ledger.traffic.run())
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for ledger in self.ledgers:
                await sleep_alive(ledger.workers, "w", 0)
            await asyncio.sleep(0.2)

    def fault_begins(self) -> None:
        """Note what each producer had acknowledged when the fault began: the run must
        have traffic acknowledged on both sides of it (see :meth:`check`)."""
        for ledger in self.ledgers:
            assert ledger.traffic.acked, f"{ledger.guarantee}: nothing acknowledged before"
            self.acked_before[id(ledger)] = len(ledger.traffic.acked)

    async def recovers(self, what: str, bound: float = RECOVERY_BOUND) -> None:
        """Every worker commits, within ``bound`` seconds, the inputs written so far (the
        end offsets are read now, so this needs the cluster able to answer)."""
        started = time.monotonic()
        targets = {
            id(ledger): {
                t: await end_offsets(self.bootstrap, t, PARTITIONS) for t in ledger.inputs()
            }
            for ledger in self.ledgers
        }
        for ledger in self.ledgers:
            ends = targets[id(ledger)]
            committed: dict[str, list[int]] = {}
            while True:
                await sleep_alive(ledger.workers, "w", 0)
                for topic in ends:
                    committed[topic] = await committed_offsets(
                        self.bootstrap, ledger.app_id, topic, PARTITIONS
                    )
                if all(c >= e for t in ends for c, e in zip(committed[t], ends[t], strict=True)):
                    break
                assert time.monotonic() - started < bound, (
                    f"{ledger.guarantee}: no progress within {bound:.0f} s after {what}: "
                    f"committed {committed} of {ends}\n{ledger.workers.log_of('w')[-6000:]}"
                )
                await asyncio.sleep(0.5)
        self.notes.append(f"{what}: recovered in {time.monotonic() - started:.1f} s")

    async def check(self) -> None:
        """Stop traffic, wait until everything is committed, count, stop the workers (the
        workers side by side: each step waits for the slowest, not for the sum)."""
        began = time.monotonic()
        for ledger in self.ledgers:  # (traffic acknowledged after the fault, too)
            await self.acknowledged_beyond(ledger, self.acked_before[id(ledger)] + AFTER_ACKS)
        for ledger in self.ledgers:
            ledger.traffic.stop()
        await asyncio.gather(*(ledger.producing for ledger in self.ledgers if ledger.producing))
        await asyncio.gather(
            *(
                wait_all_committed(
                    self.bootstrap,
                    ledger.workers,
                    "w",
                    90,
                    partitions=PARTITIONS,
                    topics=ledger.inputs(),
                )
                for ledger in self.ledgers
            )
        )
        counted = await asyncio.gather(*(self._count(ledger) for ledger in self.ledgers))
        self.notes.append(f"drained and counted in {time.monotonic() - began:.1f} s")
        self.notes.extend(
            f"{ledger.guarantee}: the test's producer replaced {n} time(s) after a failed batch"
            for ledger in self.ledgers
            if (n := ledger.traffic.replaced_producers)
        )
        for ledger, (outcome, joins) in zip(self.ledgers, counted, strict=True):
            log = ledger.workers.log_of("w")
            report = (
                f"{ledger.guarantee}: {outcome}; {joins}; {'; '.join(self.notes)}\n{log[-6000:]}"
            )
            print(report.partition("\n")[0])
            assert_counted(ledger.guarantee, outcome, joins, ledger.traffic, report)
        codes = await asyncio.gather(
            *(asyncio.to_thread(ledger.workers.stop, "w") for ledger in self.ledgers)
        )
        for ledger, code in zip(self.ledgers, codes, strict=True):
            assert code == 0, ledger.workers.log_of("w")[-6000:]

    async def acknowledged_beyond(self, ledger: Ledger, count: int, bound: float = 60.0) -> None:
        deadline = time.monotonic() + bound
        traffic = ledger.traffic
        while len(ledger.traffic.acked) < count:
            assert time.monotonic() < deadline, (
                f"{ledger.guarantee}: the producer got {len(ledger.traffic.acked)} inputs "
                f"acknowledged in all, {count} expected after the fault; {traffic.sent} sent, "
                f"{len(traffic.failed)} failed: {dict(traffic.failures)}, "
                f"{traffic.replaced_producers} producers replaced"
            )
            await self.traffic_for(0.2)

    async def _count(self, ledger: Ledger) -> tuple[Outcome, JoinCheck]:
        outcome = await outcome_of(self.bootstrap, ledger.env, ledger.traffic, PARTITIONS)
        return outcome, await join_check(self.bootstrap, ledger)


async def join_check(bootstrap: str, ledger: Ledger, partitions: int = PARTITIONS) -> JoinCheck:
    """The joins against the auctions with both sides in the input topics."""
    env = ledger.env
    sides = [
        {key for key, _ in await read_to_end(bootstrap, env[name], partitions)}
        for name in ("SJT_IMPRESSIONS", "SJT_CLICKS")
    ]
    expected = {(a, f"i{a}", f"c{a}") for a in sides[0] & sides[1]}
    joins = await read_to_end(bootstrap, env["SJT_JOINED"], partitions)
    checked: JoinCheck = JoinCheck.of(joins, expected)
    return checked


def assert_counted(
    guarantee: str, outcome: Outcome, joins: JoinCheck, traffic: AckedTraffic, report: str
) -> None:
    assert len(traffic.acked) > 0 and joins.expected > 0, report
    assert outcome.acked_not_in_topic == 0, report
    assert not outcome.missing, report
    assert outcome.unknown == 0 and joins.unexpected == 0, report
    assert joins.missing == 0, report
    if guarantee == EXACTLY_ONCE:
        assert outcome.duplicates == 0 and joins.duplicates == 0, report
        assert not outcome.broken_sequences, report
        assert not outcome.table_wrong, report
    else:
        assert all(got >= true for got, true in outcome.table_wrong.values()), report
