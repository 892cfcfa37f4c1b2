"""What rebalances did to processing: from the tracker app's processing trace, and from
the workers' logs alone (what each rebalance handed over and how long that paused: the
demo's summary, see "handovers, from the logs" below).

The tracker app (``tests/integration/apps/tracker.py``) appends one line per processed
event (:class:`Processed`) to a per-worker file. Everything here is pure: functions of those
records (and of worker log text), so the rebalance benchmark and the rebalance tests share
one definition of an interval, an overlap, a gap, a duplicate and a missing offset, and the
definitions are unit-tested on synthetic traces.

Definitions:

- A *member* is one worker process: (worker name, pid). A worker killed and restarted under
  the same name is two members.
- A *run* is a maximal sequence of one member's records of one partition whose offsets
  follow each other (offset + 1). A revocation followed by a seek (a replay after a crash, a
  partition that moved away and came back) starts a new run; a pause without a seek does not.
- Two runs of different members of the same partition *overlap* when their time spans
  intersect by more than the clock resolution: both members processed the partition at the
  same time. Runs that only touch do not overlap.
- A *gap* is the time between two consecutive processings of a partition (by anyone).
- A *stall* is a gap longer than a threshold (a multiple of the normal gap).
- In the logs, a *rebalance* is one generation of the group, or a cooperative generation in
  which members revoked partitions together with its follow-up, which assigns them (KIP-429).
  A partition handed over in it *paused* from its release by the old owner to its
  resumption by the new one (restore included); the others *never paused*.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: (topic, partition)
TP = tuple[str, int]
#: (worker name, pid): one worker process
Member = tuple[str, int]

#: time.time() is read with microsecond resolution (and written with it)
CLOCK_RESOLUTION = 1e-6
TRACE_SUFFIX = ".trace"


# --------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class Processed:
    """One event processed by one worker process, as the tracker app records it."""

    worker: str
    pid: int
    topic: str
    partition: int
    offset: int
    time: float  #: wall clock (time.time()) when the worker processed it
    key: str
    count: int  #: the key's count after this event

    @property
    def member(self) -> Member:
        return (self.worker, self.pid)

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    def to_line(self) -> str:
        """Tab-separated, newline-terminated (names and keys must not hold tabs/newlines)."""
        return (
            f"{self.worker}\t{self.pid}\t{self.topic}\t{self.partition}\t{self.offset}\t"
            f"{self.time:.6f}\t{self.key}\t{self.count}\n"
        )

    @classmethod
    def from_line(cls, line: str) -> Processed:
        worker, pid, topic, partition, offset, at, key, count = line.rstrip("\n").split("\t")
        return cls(worker, int(pid), topic, int(partition), int(offset), float(at), key, int(count))


def read_trace_dir(directory: Path) -> list[Processed]:
    """Every record of every ``*.trace`` file under ``directory``; a last line cut short by a
    kill is skipped (the event's effects were not recorded either)."""
    out: list[Processed] = []
    for path in sorted(directory.glob(f"*{TRACE_SUFFIX}")):
        with path.open() as lines:
            for line in lines:
                if line.endswith("\n"):
                    out.append(Processed.from_line(line))
    return out


def by_partition(records: Iterable[Processed]) -> dict[TP, list[Processed]]:
    """Records per partition, in processing order (time, then offset)."""
    out: dict[TP, list[Processed]] = defaultdict(list)
    for r in records:
        out[r.tp].append(r)
    for rs in out.values():
        rs.sort(key=lambda r: (r.time, r.offset))
    return dict(out)


# --------------------------------------------------------------------------- intervals


@dataclass(frozen=True)
class Run:
    """A member's contiguous processing of one partition: offsets first..last, in order."""

    member: Member
    tp: TP
    first_offset: int
    last_offset: int
    start: float
    end: float
    records: int


def runs(records: Iterable[Processed]) -> dict[TP, list[Run]]:
    """Each partition's runs (see the module docstring), ordered by start time."""
    per: dict[tuple[TP, Member], list[Processed]] = defaultdict(list)
    for r in records:
        per[(r.tp, r.member)].append(r)
    out: dict[TP, list[Run]] = defaultdict(list)
    for (tp, member), rs in per.items():
        rs.sort(key=lambda r: (r.time, r.offset))
        first = prev = rs[0]
        n = 1
        for r in rs[1:]:
            if r.offset != prev.offset + 1:
                out[tp].append(Run(member, tp, first.offset, prev.offset, first.time, prev.time, n))
                first, n = r, 0
            prev = r
            n += 1
        out[tp].append(Run(member, tp, first.offset, prev.offset, first.time, prev.time, n))
    for rs_ in out.values():
        rs_.sort(key=lambda run: (run.start, run.end))
    return dict(out)


@dataclass(frozen=True)
class Overlap:
    """Two members processed one partition during the same time span."""

    tp: TP
    a: Run
    b: Run
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def overlaps(
    partition_runs: Mapping[TP, Sequence[Run]], resolution: float = CLOCK_RESOLUTION
) -> list[Overlap]:
    """Every pair of runs of different members whose spans intersect by more than
    ``resolution`` (a single-record run inside another member's run counts, with 0 s)."""
    found: list[Overlap] = []
    for tp, rs in sorted(partition_runs.items()):
        ordered = sorted(rs, key=lambda run: run.start)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                if b.start >= a.end - resolution:
                    break  # sorted by start: no later run can start inside ``a``
                if a.member == b.member or a.start >= b.end - resolution:
                    continue
                found.append(Overlap(tp, a, b, max(a.start, b.start), min(a.end, b.end)))
    return found


# --------------------------------------------------------------------------- gaps


@dataclass(frozen=True)
class Gap:
    """No processing of ``tp`` from ``start`` to ``end``; ``open`` when nothing was processed
    after ``start`` before the window ended (``end`` is then the window's end)."""

    tp: TP
    start: float
    end: float
    open: bool = False

    @property
    def seconds(self) -> float:
        return self.end - self.start


def gaps(tp: TP, times: Sequence[float], start: float, end: float) -> list[Gap]:
    """The gaps of one partition (its processing ``times``, sorted) that intersect the window
    [start, end], each whole even where it spans a window edge. A partition processed for
    the last time before ``end`` ends with an open gap up to ``end``."""
    out = [
        Gap(tp, before, after)
        for before, after in itertools.pairwise(times)
        if after >= start and before <= end
    ]
    if times and times[-1] < end:
        out.append(Gap(tp, times[-1], end, open=True))
    return out


def largest_gap(tp: TP, times: Sequence[float], start: float, end: float) -> Gap | None:
    """The longest gap of one partition intersecting the window, or None without two
    processings around or inside it."""
    found = gaps(tp, times, start, end)
    return max(found, key=lambda g: g.seconds) if found else None


def resume_after_stall(
    tp: TP,
    times: Sequence[float],
    start: float,
    end: float,
    threshold: float,
    began_by: float = math.inf,
) -> float | None:
    """When ``tp`` last resumed after a stall (a gap > ``threshold`` that began by
    ``began_by``) in the window; None if it never stalled there, ``math.inf`` if it was
    still stalled at the window's end."""
    stalls = [
        g for g in gaps(tp, times, start, end) if g.seconds > threshold and g.start <= began_by
    ]
    if not stalls:
        return None
    return math.inf if stalls[-1].open else stalls[-1].end


# --------------------------------------------------------------------------- correctness


@dataclass(frozen=True)
class Duplicate:
    """One partition offset processed more than once."""

    tp: TP
    offset: int
    times: tuple[float, ...]
    members: tuple[Member, ...]


def duplicates(records: Iterable[Processed]) -> list[Duplicate]:
    """Offsets processed more than once, each with its processings in time order."""
    seen: dict[tuple[TP, int], list[Processed]] = defaultdict(list)
    for r in records:
        seen[(r.tp, r.offset)].append(r)
    out = []
    for (tp, offset), rs in sorted(seen.items()):
        if len(rs) > 1:
            rs.sort(key=lambda r: r.time)
            out.append(
                Duplicate(tp, offset, tuple(r.time for r in rs), tuple(r.member for r in rs))
            )
    return out


def missing(records: Iterable[Processed], produced: Mapping[TP, tuple[int, int]]) -> dict[TP, int]:
    """How many offsets of each partition's produced range [first, end) nobody processed
    (only partitions with any missing)."""
    done: dict[TP, set[int]] = defaultdict(set)
    for r in records:
        done[r.tp].add(r.offset)
    out = {}
    for tp, (first, end) in sorted(produced.items()):
        absent = sum(1 for o in range(first, end) if o not in done[tp])
        if absent:
            out[tp] = absent
    return out


def count_errors(records: Iterable[Processed]) -> dict[str, tuple[int, int]]:
    """Keys whose highest count differs from the number of distinct events of the key
    processed: key -> (highest count, distinct events). More means an event was counted
    twice, fewer that a count was lost (replays after a crash restore the count first, so
    they leave it exact)."""
    highest: dict[str, int] = {}
    events: dict[str, set[tuple[TP, int]]] = defaultdict(set)
    for r in records:
        highest[r.key] = max(highest.get(r.key, 0), r.count)
        events[r.key].add((r.tp, r.offset))
    return {k: (c, len(events[k])) for k, c in sorted(highest.items()) if c != len(events[k])}


# --------------------------------------------------------------------------- ownership


def member_before(records: Sequence[Processed], t: float) -> Member | None:
    """Who processed the partition last at or before ``t`` (records in time order)."""
    last = None
    for r in records:
        if r.time > t:
            break
        last = r.member
    return last


def member_at_end(records: Sequence[Processed], start: float, end: float) -> Member | None:
    """Who processed the partition last within [start, end]."""
    last = None
    for r in records:
        if r.time > end:
            break
        if r.time >= start:
            last = r.member
    return last


def handover(records: Sequence[Processed], old: Member, new: Member, t: float) -> float | None:
    """Revoke to resume: seconds from ``old``'s last processing before ``new``'s first
    processing at or after ``t``, to that first processing (None if either is missing)."""
    first_new = next((r.time for r in records if r.member == new and r.time >= t), None)
    if first_new is None:
        return None
    last_old = max(
        (r.time for r in records if r.member == old and r.time <= first_new), default=None
    )
    return None if last_old is None else first_new - last_old


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Spread:
    """p50/p99/max of per-partition values (seconds)."""

    p50: float
    p99: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(
            percentile(values, 50),
            percentile(values, 99),
            max(values, default=math.nan),
            len(values),
        )


# --------------------------------------------------------------------------- one event


@dataclass
class EventStats:
    """What one event (a join, a leave, a kill) did to processing, from the trace.

    ``normal`` is the largest gap of each partition in the quiet window [t - quiet, t]
    (gaps that closed before ``t``);
    ``stayed_gap`` the largest gap in the event window of the partitions whose member was
    the same before and after it. A partition *stalled* if it had a gap longer than
    ``threshold`` in the event window; ``latency`` runs from the event to the last stalled
    partition processing again (0 when none stalled, inf when one never did); only stalls
    that began by ``cutoff`` count (the rebalance's end: a hiccup of the machine later in
    the window is not the rebalance's).
    """

    t: float
    end: float
    threshold: float
    normal: Spread
    stayed: list[TP]
    moved: list[TP]  #: to another worker
    restarted: list[TP]  #: back to a new process of the same worker
    unprocessed: list[TP]  #: nobody processed them in the event window
    stayed_gap: Spread
    stayed_normal: Spread
    stalled: list[TP]
    latency: float
    handover: dict[TP, float]  #: moved and restarted partitions: revoke-to-resume seconds
    duplicates: int  #: processings in the window of offsets processed before
    records: int  #: processings in the window
    notes: list[str] = field(default_factory=list)


def analyze_event(
    parts: Mapping[TP, Sequence[Processed]],
    t: float,
    end: float,
    quiet: float,
    stall_factor: float = 2.0,
    min_stall: float = 0.05,
    cutoff: float = math.inf,
) -> EventStats:
    """Effects of an event at ``t`` up to ``end``, against the ``quiet`` seconds before it.

    ``parts`` is :func:`by_partition` of the whole trace. The stall threshold is
    ``stall_factor`` times the median partition's largest normal gap (at least ``min_stall``);
    stalls count towards the latency if they began by ``cutoff``.
    """
    normal: dict[TP, float] = {}
    times: dict[TP, list[float]] = {tp: [r.time for r in rs] for tp, rs in parts.items()}
    for tp in parts:
        # only gaps that closed before the event: the one it may have opened is not normal
        closed = [g.seconds for g in gaps(tp, times[tp], t - quiet, t) if g.end <= t]
        if closed:
            normal[tp] = max(closed)
    # the median partition's, not the worst: one hiccup of a busy machine in the quiet
    # window would otherwise hide a rebalance's pause
    typical = percentile(list(normal.values()), 50) if normal else 0.0
    threshold = max(stall_factor * typical, min_stall)
    stayed: list[TP] = []
    moved: list[TP] = []
    restarted: list[TP] = []
    unprocessed: list[TP] = []
    handovers: dict[TP, float] = {}
    stalled: list[TP] = []
    resumes: list[float] = []
    for tp, rs in sorted(parts.items()):
        before = member_before(rs, t)
        after = member_at_end(rs, t, end)
        if after is None:
            unprocessed.append(tp)
        elif before is None or before == after:
            stayed.append(tp)
        else:
            (restarted if before[0] == after[0] else moved).append(tp)
            took = handover(rs, before, after, t)
            if took is not None:
                handovers[tp] = took
        resumed = resume_after_stall(tp, times[tp], t, end, threshold, cutoff)
        if resumed is not None:
            stalled.append(tp)
            resumes.append(resumed)
    window_dups = 0
    window_records = 0
    seen: set[tuple[TP, int]] = set()
    for tp, rs in parts.items():
        for r in rs:
            key = (tp, r.offset)
            if t <= r.time <= end:
                window_records += 1
                if key in seen:
                    window_dups += 1
            elif r.time > end:
                break
            seen.add(key)
    stayed_gaps = [
        g.seconds for tp in stayed if (g := largest_gap(tp, times[tp], t, end)) is not None
    ]
    return EventStats(
        t=t,
        end=end,
        threshold=threshold,
        normal=Spread.of(list(normal.values())),
        stayed=stayed,
        moved=moved,
        restarted=restarted,
        unprocessed=unprocessed,
        stayed_gap=Spread.of(stayed_gaps),
        stayed_normal=Spread.of([normal[tp] for tp in stayed if tp in normal]),
        stalled=stalled,
        latency=max((r - t for r in resumes), default=0.0),
        handover=handovers,
        duplicates=window_dups,
        records=window_records,
    )


# --------------------------------------------------------------------------- worker logs

#: ``[2024-05-01 12:00:00,123] INFO streamjoin...: message`` (streamjoin/runtime/run.py)
_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\] (\w+) ([\w.]+): (.*)$")
_ASSIGNED = re.compile(r"^assigned (\d+) partitions")
_EPOCH = re.compile(r"^assignment epoch (\d+) for (\d+) members")
_RESTORED = re.compile(r"^restored (\S+)\[(\d+)\]: (\d+) records in ([\d.]+)s")
_RESTORING = re.compile(r"^restoring (\S+)\[(\d+)\]: (\d+) changelog records to replay")


@dataclass(frozen=True)
class LogEvent:
    """A line of a worker's log that tells about rebalancing or restoring."""

    worker: str
    time: float
    kind: str  #: "assigned", "assignment" (the leader's), "restoring" (planned), "restored"
    table: str = ""
    partition: int = -1
    records: int = 0  #: partitions assigned, members assigned, records planned or restored
    seconds: float = 0.0


def parse_log_time(stamp: str, millis: str) -> float:
    """A log line's local-time stamp as epoch seconds."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def log_messages(text: str) -> Iterator[tuple[float, str]]:
    """``(time, message)`` of each line of a worker's log in streamjoin's format (other
    lines, such as the ``running`` line printed to stderr, are skipped)."""
    for line in text.splitlines():
        m = _LOG_LINE.match(line)
        if m is not None:
            yield parse_log_time(m[1], m[2]), m[5]


def log_events(worker: str, text: str) -> Iterator[LogEvent]:
    """The rebalance and restore lines of one worker's log (streamjoin's log format)."""
    for at, message in log_messages(text):
        if a := _ASSIGNED.match(message):
            yield LogEvent(worker, at, "assigned", records=int(a[1]))
        elif g := _EPOCH.match(message):
            yield LogEvent(worker, at, "assignment", partition=int(g[1]), records=int(g[2]))
        elif r := _RESTORED.match(message):
            yield LogEvent(worker, at, "restored", r[1], int(r[2]), int(r[3]), float(r[4]))
        elif p := _RESTORING.match(message):
            yield LogEvent(worker, at, "restoring", p[1], int(p[2]), int(p[3]))


@dataclass(frozen=True)
class LogSummary:
    """What the worker logs say about one event's window."""

    last_assigned: float | None  #: seconds from the event to the last "assigned" line
    assignments: int  #: "assigned" lines in the window
    rebalances: int  #: assignments the group's leader computed in the window
    restores_planned: int  #: records the restores in the window set out to replay
    restored: int  #: records restores in the window replayed (finished restores)
    restore_seconds: float  #: the longest finished restore in the window
    restored_partitions: tuple[tuple[str, int], ...]  #: (table, partition) of those restores


def summarize_logs(events: Iterable[LogEvent], t: float, end: float) -> LogSummary:
    """The log lines with time stamps in [t, end], summarized (stamps have ms resolution)."""
    inside = [e for e in events if t - 0.001 <= e.time <= end]
    assigned = [e.time for e in inside if e.kind == "assigned"]
    return LogSummary(
        last_assigned=max(assigned) - t if assigned else None,
        assignments=len(assigned),
        rebalances=sum(1 for e in inside if e.kind == "assignment"),
        restores_planned=sum(e.records for e in inside if e.kind == "restoring"),
        restored=sum(e.records for e in inside if e.kind == "restored"),
        restore_seconds=max((e.seconds for e in inside if e.kind == "restored"), default=0.0),
        restored_partitions=tuple(
            sorted({(e.table, e.partition) for e in inside if e.kind == "restored"})
        ),
    )


# ------------------------------------------------------------------ handovers, from the logs

_ASSIGNED_LIST = re.compile(r"^assigned \d+ partitions: (.*) \(owning \d+\)$")
_TOPIC_PARTITION = re.compile(r"([^\s,\[\]]+)\[(\d+)\]")
_ROUND_DONE = re.compile(
    r"^rebalance done: generation (-?\d+) \((\w+)(?:, leader)?\) in ([\d.]+)s: "
    r"\d+ partitions assigned, (\d+) revoked"
)
_REVOKING = re.compile(r"^revoking \d+ partitions: (.*) \(owning \d+\)$")
_STOP_REQUESTED = re.compile(r"^stop requested")
_GAVE_UP = re.compile(r"^(?:lost|giving up) \d+ partitions")


@dataclass(frozen=True)
class Round:
    """One member's part in one generation of the group: its ``rebalance done`` line and the
    ``assigned`` line before it."""

    worker: str
    generation: int
    cooperative: bool
    began: float  #: when it began rebalancing (an eager member revoked everything then)
    done: float  #: when it had revoked what moves away and taken what it was assigned
    assigned_at: float  #: its ``assigned`` line's time (``done`` when nothing was added)
    assigned: tuple[TP, ...]  #: partitions added to what it owned
    revoked: int  #: partitions it revoked in this round (eager: 0, all went at ``began``)


@dataclass(frozen=True)
class Release:
    """A member gave up everything it owned: asked to stop, or its partitions were lost."""

    worker: str
    time: float
    why: str  #: "stopped", "lost", "eager" (an eager member's revocation) or "revoked"
    #: what it gave up: everything it owned (None), or the partitions a cooperative
    #: revocation names (its ``revoking`` line, logged when the revocation starts)
    partitions: tuple[TP, ...] | None = None


@dataclass(frozen=True)
class Restore:
    """A finished restore of one table partition (the new owner's task waits for it)."""

    worker: str
    time: float
    table: str
    partition: int
    seconds: float


@dataclass(frozen=True)
class WorkerLog:
    """The lines of one worker's log that tell who owned what, when."""

    worker: str
    rounds: tuple[Round, ...]
    releases: tuple[Release, ...]
    restores: tuple[Restore, ...]


def read_worker_log(worker: str, text: str) -> WorkerLog:
    """The rounds, releases and restores in one worker's log (an ``assigned`` line with no
    ``rebalance done`` line after it, from a worker killed in between, is dropped)."""
    rounds: list[Round] = []
    releases: list[Release] = []
    restores: list[Restore] = []
    added: tuple[float, tuple[TP, ...]] | None = None
    for at, message in log_messages(text):
        if a := _ASSIGNED_LIST.match(message):
            added = (at, tuple((t, int(p)) for t, p in _TOPIC_PARTITION.findall(a[1])))
        elif d := _ROUND_DONE.match(message):
            assigned_at, assigned = added if added is not None else (at, ())
            added = None
            rounds.append(
                Round(
                    worker,
                    int(d[1]),
                    d[2] == "cooperative",
                    began=at - float(d[3]),
                    done=at,
                    assigned_at=assigned_at,
                    assigned=assigned,
                    revoked=int(d[4]),
                )
            )
        elif v := _REVOKING.match(message):
            tps = tuple((t, int(p)) for t, p in _TOPIC_PARTITION.findall(v[1]))
            releases.append(Release(worker, at, "revoked", tps))
        elif _STOP_REQUESTED.match(message):
            releases.append(Release(worker, at, "stopped"))
        elif _GAVE_UP.match(message):
            releases.append(Release(worker, at, "lost"))
        elif r := _RESTORED.match(message):
            restores.append(Restore(worker, at, r[1], int(r[2]), float(r[4])))
    return WorkerLog(worker, tuple(rounds), tuple(releases), tuple(restores))


@dataclass(frozen=True)
class Handover:
    """One partition given to a member in a rebalance.

    It paused from its release by ``old`` (the end of a cooperative revocation, the start of
    an eager one, a stop request, a loss) to its resumption by ``new``: the assignment, or the
    end of the restore of its task's tables (tables are co-partitioned with their task, so a
    restore of partition ``p`` on ``new`` belongs to the task of partition ``p`` handed over
    last to ``new``).
    """

    tp: TP
    old: str | None  #: its previous owner; None when nobody owned it before
    new: str
    released: float | None  #: None when ``old`` logged no release (or there was no ``old``)
    why: str  #: "revoked", "eager", "stopped", "lost"; "" when not released
    assigned: float
    resumed: float
    restore_seconds: float  #: the longest restore it waited for (0: none)

    @property
    def moved(self) -> bool:
        return self.old is not None and self.old != self.new

    @property
    def paused(self) -> float | None:
        return None if self.released is None else self.resumed - self.released


@dataclass(frozen=True)
class Rebalance:
    """The group's generations from one trigger to a settled assignment: one generation, or
    a cooperative revoke round followed by its assign rounds (KIP-429)."""

    generations: tuple[int, ...]
    cooperative: bool
    members: tuple[str, ...]  #: the members of its last generation
    joined: tuple[str, ...]  #: members in their first generation
    stopped: tuple[str, ...]  #: members that stopped since the previous rebalance
    handovers: tuple[Handover, ...]
    never_paused: int  #: partitions owned through it by one member, never released
    notes: tuple[str, ...] = ()

    @property
    def moved(self) -> list[Handover]:
        return [h for h in self.handovers if h.moved]

    @property
    def paused_in_place(self) -> list[Handover]:
        """Released and given back to the same member (every partition, when eager)."""
        return [h for h in self.handovers if h.old is not None and h.old == h.new]

    @property
    def started(self) -> list[Handover]:
        return [h for h in self.handovers if h.old is None]


def _episodes(rounds: Sequence[Round]) -> list[list[int]]:
    """Generations grouped into rebalances: a generation after one where a cooperative
    member revoked partitions is its follow-up (what was revoked is assigned in it)."""
    by_generation: dict[int, list[Round]] = defaultdict(list)
    for r in rounds:
        by_generation[r.generation].append(r)
    out: list[list[int]] = []
    for generation in sorted(by_generation):
        if out and any(r.cooperative and r.revoked for r in by_generation[out[-1][-1]]):
            out[-1].append(generation)
        else:
            out.append([generation])
    return out


def rebalances(logs: Iterable[WorkerLog]) -> list[Rebalance]:
    """Every rebalance in the workers' logs, in generation order, with what each handed
    over and how long that paused."""
    logs = list(logs)
    rounds = [r for log in logs for r in log.rounds]
    releases = [e for log in logs for e in log.releases]
    episodes = _episodes(rounds)
    episode_of = {g: i for i, gens in enumerate(episodes) for g in gens}
    handed, owned_after = _hand_over(rounds, releases, episode_of, len(episodes))
    handed = _after_restores(handed, [e for log in logs for e in log.restores])
    members: dict[int, set[str]] = defaultdict(set)
    first_generation: dict[str, int] = {}
    for r in sorted(rounds, key=lambda r: r.generation):
        members[r.generation].add(r.worker)
        first_generation.setdefault(r.worker, r.generation)
    out: list[Rebalance] = []
    since = -math.inf
    for i, gens in enumerate(episodes):
        last = [r for r in rounds if r.generation == gens[-1]]
        until = max(r.done for r in last)
        stopped = {e.worker for e in releases if e.why == "stopped" and since < e.time <= until}
        since = until
        mine = [r for r in rounds if r.generation in gens]
        out.append(
            Rebalance(
                generations=tuple(gens),
                cooperative=all(r.cooperative for r in mine),
                members=tuple(sorted(members[gens[-1]])),
                joined=tuple(sorted(w for w, g in first_generation.items() if g in gens)),
                stopped=tuple(sorted(stopped)),
                handovers=tuple(handed[i]),
                never_paused=len(owned_after[i] - {h.tp for h in handed[i]}),
                notes=tuple(_unmatched_revocations(mine, handed[i])),
            )
        )
    return out


def _hand_over(
    rounds: Sequence[Round],
    releases: Sequence[Release],
    episode_of: Mapping[int, int],
    episodes: int,
) -> tuple[list[list[Handover]], list[set[TP]]]:
    """Replays releases and assignments in time order: each rebalance's handovers (resumed
    at their assignment, restores not yet counted), and what was owned after it."""
    # when each member finished a cooperative revocation, per rebalance
    revoked_at: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in rounds:
        if r.cooperative and r.revoked:
            revoked_at[(r.worker, episode_of[r.generation])].append(r.done)
    timeline: list[tuple[float, int, Release | Round]] = [(e.time, 0, e) for e in releases]
    timeline += [
        (r.began, 0, Release(r.worker, r.began, "eager")) for r in rounds if not r.cooperative
    ]
    timeline += [(r.assigned_at, 1, r) for r in rounds]
    timeline.sort(key=lambda item: item[:2])  # at one instant, releases first
    owner: dict[TP, str] = {}
    released: dict[TP, tuple[str, float, str]] = {}
    handed: list[list[Handover]] = [[] for _ in range(episodes)]
    owned_after: list[set[TP]] = [set() for _ in range(episodes)]
    for _, _, event in timeline:
        if isinstance(event, Release):
            gone = event.partitions
            for tp in [tp for tp, w in owner.items() if w == event.worker]:
                if gone is None or tp in gone:
                    released[tp] = (owner.pop(tp), event.time, event.why)
            continue
        episode = episode_of[event.generation]
        for tp in event.assigned:
            old, at, why = released.pop(tp, (owner.get(tp), None, ""))
            if at is None and old is not None and old != event.worker:
                # revoked cooperatively: when ``old`` finished revoking in this rebalance
                times = revoked_at.get((old, episode), [])
                at = max((t for t in times if t <= event.assigned_at), default=None)
                why = "" if at is None else "revoked"
            owner[tp] = event.worker
            handed[episode].append(
                Handover(tp, old, event.worker, at, why, event.assigned_at, event.assigned_at, 0.0)
            )
        owned_after[episode] = set(owner)
    return handed, owned_after


def _after_restores(
    handed: list[list[Handover]], restores: Iterable[Restore]
) -> list[list[Handover]]:
    """Each handover resumed once the restores of its task's tables finished: a restore of
    partition ``p`` on a member belongs to the last handover of a partition ``p`` to it."""
    out = [list(hs) for hs in handed]
    where: dict[tuple[str, int], list[tuple[float, int, int]]] = defaultdict(list)
    for i, hs in enumerate(out):
        for j, h in enumerate(hs):
            where[(h.new, h.tp[1])].append((h.assigned, i, j))
    for restore in restores:
        # stamps have ms resolution: a restore may share its assignment's stamp
        candidates = [
            c for c in where.get((restore.worker, restore.partition), []) if c[0] <= restore.time
        ]
        if not candidates:
            continue
        latest = max(c[0] for c in candidates)
        for assigned, i, j in candidates:
            if assigned == latest:
                h = out[i][j]
                out[i][j] = dataclasses.replace(
                    h,
                    resumed=max(h.resumed, restore.time),
                    restore_seconds=max(h.restore_seconds, restore.seconds),
                )
    return out


def _unmatched_revocations(rounds: Iterable[Round], handed: Iterable[Handover]) -> list[str]:
    """Members that said they revoked more partitions than the logs show handed over from
    them (the rest were not assigned again within the rebalance)."""
    said: Counter[str] = Counter()
    for r in rounds:
        if r.cooperative:
            said[r.worker] += r.revoked
    seen = Counter(h.old for h in handed if h.why == "revoked")
    return [
        f"{w} revoked {n} partitions, {seen[w]} of them assigned again in this rebalance"
        for w, n in sorted(said.items())
        if n != seen[w]
    ]


# --------------------------------------------------------------------------- the summary


@dataclass(frozen=True)
class TaskHandover:
    """The partitions of one number handed over together from one member to another: one
    task (its co-partitioned topics)."""

    partition: int
    topics: tuple[str, ...]
    old: str | None
    new: str
    paused: float | None  #: the longest pause of its partitions (None: a release not logged)
    restore_seconds: float

    def describe(self) -> str:
        restore = f" (restore {self.restore_seconds:.2f} s)" if self.restore_seconds else ""
        return (
            f"{'+'.join(self.topics)}[{self.partition}]: {self.old} -> {self.new}, "
            f"paused {_seconds(self.paused)}{restore}"
        )


def task_handovers(handovers: Iterable[Handover]) -> list[TaskHandover]:
    """Handovers grouped into tasks (same partition number, same members, same assignment)."""
    groups: dict[tuple[int, str | None, str, float], list[Handover]] = defaultdict(list)
    for h in handovers:
        groups[(h.tp[1], h.old, h.new, h.assigned)].append(h)
    out = []
    for (partition, old, new, _), hs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][3])):
        pauses = [h.paused for h in hs]
        out.append(
            TaskHandover(
                partition,
                tuple(sorted({h.tp[0] for h in hs})),
                old,
                new,
                None if None in pauses else max(p for p in pauses if p is not None),
                max(h.restore_seconds for h in hs),
            )
        )
    return out


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _headline(rb: Rebalance) -> str:
    gens = rb.generations
    which = f"generation {gens[0]}" if len(gens) == 1 else f"generations {gens[0]}-{gens[-1]}"
    if not rb.cooperative:
        how = "eager"
    elif len(gens) == 1:
        how = "cooperative"
    else:
        how = f"cooperative in {len(gens)} rounds (revoke, then assign)"
    who = [f"{', '.join(rb.joined)} joined"] if rb.joined else []
    who += [f"{', '.join(rb.stopped)} stopped"] if rb.stopped else []
    because = f" ({'; '.join(who)})" if who else ""
    return f"{which}, {how}, {_count(len(rb.members), 'member')}{because}"


def describe_rebalances(found: Iterable[Rebalance]) -> list[str]:
    """Summary lines: per rebalance, the tasks that moved (from which member to which) and
    how long each paused, next to the partitions that never paused."""
    lines: list[str] = []
    for rb in found:
        moved = task_handovers(rb.moved)
        facts = []
        started = task_handovers(rb.started)
        if started:
            per = Counter(t.new for t in started)
            owners = ", ".join(f"{w} {n}" for w, n in sorted(per.items()))
            facts.append(f"{_count(len(started), 'task')} started ({owners})")
        if moved or not started:
            facts.append(f"{_count(len(moved), 'task')} moved")
        in_place = rb.paused_in_place
        if in_place:
            longest = max((h.paused for h in in_place if h.paused is not None), default=None)
            facts.append(
                f"{_count(len(in_place), 'partition')} paused and stayed (up to "
                f"{_seconds(longest)})"
            )
        if moved or in_place or rb.never_paused:  # (not when nothing was owned before)
            facts.append(f"{_count(rb.never_paused, 'partition')} never paused")
        lines.append(f"{_headline(rb)}: {', '.join(facts)}")
        lines += [f"  {t.describe()}" for t in moved]
        lines += [f"  note: {note}" for note in rb.notes]
    return lines
