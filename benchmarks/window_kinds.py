"""Hopping- and session-window counts: streamjoin vs Kafka Streams vs Quix Streams, same run.

    .venv/bin/python -m benchmarks.window_kinds --window hopping          # starts a broker
    .venv/bin/python -m benchmarks.window_kinds --window session --events 5000000 \
        --systems streamjoin,kstreams --repeat 1

The input: ``--events`` JSON events (default 500,000) over ``--keys`` keys (default
10,000), keyed by user, with event times spread over 7.2 ms per event (500,000 events:
one hour; 5M: ten hours) in order with up to 2 s of jitter, so that every key passes
through many windows. Timestamps are even and the session gap odd, so no two events of a
key are exactly one gap apart (where systems may disagree on merging).

* ``--window hopping``: 5-minute windows advancing by 1 minute (each event counts in 5),
  grace 5 s;
* ``--window session``: sessions with an inactivity gap of 2 minutes (and 1 ms), grace 5 s.

Systems (``--systems``, in run order; each one a flag):

* ``streamjoin``: emit on update, the windowed table is the answer
  (``benchmarks/window_kinds_streamjoin_app.py``);
* ``streamjoin-close``: emit on close, each final result sent to an output topic;
* ``kstreams`` / ``kstreams-close``: Kafka Streams 4.3 DSL, ``count()`` on
  ``TimeWindows.ofSizeAndGrace(...).advanceBy(...)`` or ``SessionWindows``, close:
  ``EmitStrategy.onWindowClose()`` (``benchmarks/kstreams/``, built here with Maven);
* ``quix`` / ``quix-close``: Quix Streams' ``hopping_window`` / ``session_window``
  ``.count()`` with ``.current()`` or ``.final()`` (``benchmarks/window_kinds_quix_app.py``).

Every system keeps its windows for a day (nothing expires during a run). Emit on update
is checked on each system's windows, dumped once every partition's last offset is
processed, against the model computed here (``missing``, ``wrong``, ``unexpected``).
(With the default retention of size + grace, a replay of an hour of event time in seconds
lets Kafka Streams delete windows before its emission pass, throttled to once a wall-clock
second, has sent them: half of the due results were missing in a trial run; and it opens
a new RocksDB segment every 2.5 minutes of event time.) Emit on close is checked on the
output topic: every window that had closed by the time 80% of its partition's events
were in must be there once with the right count; the windows closing after that may still
be waiting for an emission pass when the input stops (Kafka Streams and streamjoin emit
in passes), so they are optional, but when present they must be right. (Kafka Streams
runs its pass only when a record arrives, at most once a wall-clock second: so that it
can send what has closed, a second after the input is done one tick record, at the
partition's stream time and with a key of its own, goes into every input partition; the
ticks are left out of every check and of the time measured.) ``duplicate``
counts repeats, ``early`` results for windows that had not closed. CPU time, wall time
and peak RSS are measured as ``benchmarks/harness.py`` describes (from each process's
first input event to its last partition's last offset); the ratios are against Kafka
Streams with the same emission.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    KSTREAMS_COLUMNS,
    ROOT,
    Launch,
    WorkloadResult,
    bench_arguments,
    bench_main,
    chosen_systems,
    dist_version,
    kstreams_arguments,
    kstreams_build,
    kstreams_command,
    kstreams_version,
    last_offsets,
    machine,
    produce,
    read_records,
    results_table,
    rounds_report,
    run_rounds,
    sayer,
    streamjoin_command,
    streamjoin_version,
    venv_arguments,
    venv_python,
    wait_leaders,
)

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
#: event time per event (in ms): 500,000 events span one hour
SPAN_PER_EVENT_MS = 7.2
JITTER_MS = 2_000
GRACE_MS = 5_000
HOP_SIZE_MS = 5 * 60_000
HOP_STEP_MS = 60_000
#: odd, while every timestamp is even: no two events are exactly one gap apart
SESSION_GAP_MS = 2 * 60_000 + 1
#: every window is kept through a run (emit on update: the answer is read at the end)
KEEP_ALL_MS = 86_400_000
#: emit on close: the windows closed once this share of a partition's events was in are due
DUE_FRACTION = 0.8

#: keys of the tick records (see :func:`ticked_output_settled`), left out of every check
TICK_PREFIX = "tick-"

SYSTEMS = ("streamjoin", "streamjoin-close", "kstreams", "kstreams-close", "quix", "quix-close")

#: (key, window start) for hopping windows, (key, start, end) for sessions -> count
Windows = dict[tuple[Any, ...], int]


@dataclass(frozen=True)
class Shape:
    """The window parameters every system gets."""

    window: str  # "hopping" or "session"
    size_ms: int = HOP_SIZE_MS
    step_ms: int = HOP_STEP_MS
    gap_ms: int = SESSION_GAP_MS
    grace_ms: int = GRACE_MS

    def retention_ms(self, close: bool) -> int:
        """A day, whatever the emission (see the module docstring)."""
        return KEEP_ALL_MS


# --------------------------------------------------------------------------- input and model


def generate(events: int, keys: int, seed: int) -> list[tuple[str, bytes, bytes, int]]:
    """The input records (logical topic, key, JSON value, even timestamp), in produce order."""
    rng = random.Random(seed)
    records = []
    for i in range(events):
        key = f"user-{rng.randrange(keys):05d}"
        ts = BASE_MS + int(i * SPAN_PER_EVENT_MS) + rng.randrange(JITTER_MS)
        ts -= ts % 2
        value = {"user": key, "page": f"/p/{rng.randrange(100)}", "seq": i}
        records.append(("input", key.encode(), json.dumps(value).encode(), ts))
    return records


def hopping_starts(ts: int, size_ms: int, step_ms: int) -> range:
    """Starts of the windows ``[s, s + size)``, ``s`` a multiple of ``step``, holding ``ts``."""
    last = ts - ts % step_ms
    first = max(0, -(-(ts - size_ms + 1) // step_ms) * step_ms)
    return range(first, last + 1, step_ms)


def hopping_model(events: Iterable[tuple[str, int]], shape: Shape) -> Windows:
    """(key, window start) -> count of the (key, timestamp) events."""
    out: Counter[tuple[Any, ...]] = Counter()
    for key, ts in events:
        for start in hopping_starts(ts, shape.size_ms, shape.step_ms):
            out[(key, start)] += 1
    return dict(out)


def session_model(events: Iterable[tuple[str, int]], gap_ms: int) -> Windows:
    """(key, first timestamp, last timestamp) -> count: a key's events sorted by time, cut
    wherever two neighbours are more than ``gap_ms`` apart (order of arrival does not
    matter: a late event between two sessions merges them)."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, ts in events:
        by_key[key].append(ts)
    out: Windows = {}
    for key, stamps in by_key.items():
        stamps.sort()
        start = prev = stamps[0]
        n = 0
        for ts in stamps:
            if ts - prev > gap_ms:
                out[(key, start, prev)] = n
                start, n = ts, 0
            n += 1
            prev = ts
        out[(key, start, prev)] = n
    return out


def model(events: Sequence[tuple[str, int]], shape: Shape) -> Windows:
    if shape.window == "hopping":
        return hopping_model(events, shape)
    return session_model(events, shape.gap_ms)


def close_time(window: tuple[Any, ...], shape: Shape) -> int:
    """When stream time closes the window: hopping ``end + grace``; a session
    ``last event + gap + grace`` (the last moment an event could still extend it)."""
    if shape.window == "hopping":
        return int(window[1]) + shape.size_ms + shape.grace_ms
    return int(window[2]) + shape.gap_ms + shape.grace_ms


@dataclass(frozen=True)
class CloseExpectation:
    """What an emit-on-close run must have emitted: ``due`` windows must be there, the
    ``optional`` ones may be; anything else is early or wrong."""

    due: Windows
    optional: Windows


def close_expectation(
    events: Sequence[tuple[str, int]],
    partition_of: Callable[[str], int],
    shape: Shape,
    due_fraction: float = DUE_FRACTION,
    delay_ms: int = 0,
) -> CloseExpectation:
    """Per partition: windows closed by the stream time (max timestamp) after
    ``due_fraction`` of its events are due; those closed by the final one optional.
    ``delay_ms`` is added to every close time (for a system that closes later)."""
    per_partition: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for key, ts in events:
        per_partition[partition_of(key)].append((key, ts))
    due: Windows = {}
    optional: Windows = {}
    for part_events in per_partition.values():
        cut = int(len(part_events) * due_fraction)
        due_time = max((ts for _, ts in part_events[:cut]), default=-1)
        final_time = max(ts for _, ts in part_events)
        for window, n in model(part_events, shape).items():
            closes = close_time(window, shape) + delay_ms
            if closes <= due_time:
                due[window] = n
            elif closes <= final_time:
                optional[window] = n
    return CloseExpectation(due, optional)


def check_windows(truth: Windows, got: Windows) -> dict[str, int]:
    """Emit on update: every window of the model with its count, and nothing else."""
    return {
        "expected": len(truth),
        "missing": sum(1 for w in truth if w not in got),
        "wrong": sum(1 for w, n in truth.items() if w in got and got[w] != n),
        "unexpected": sum(1 for w in got if w not in truth),
    }


def check_final(
    expected: CloseExpectation, results: Sequence[tuple[tuple[Any, ...], int]]
) -> dict[str, int]:
    """Emit on close: ``results`` (window, count) in the order emitted, against ``expected``."""
    seen: Counter[tuple[Any, ...]] = Counter(w for w, _ in results)
    wrong = 0
    early = 0
    for window, n in results:
        want = expected.due.get(window, expected.optional.get(window))
        if want is None:
            early += 1
        elif want != n:
            wrong += 1
    return {
        "expected": len(expected.due),
        "optional": len(expected.optional),
        "emitted": len(results),
        "missing": sum(1 for w in expected.due if w not in seen),
        "wrong": wrong,
        "duplicate": sum(n - 1 for n in seen.values() if n > 1),
        "early": early,
    }


def parse_final(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    window: str,
) -> tuple[tuple[Any, ...], int]:
    """One output record -> (window, count): the record key is the user key; the value is
    ``{"start", "end", "count"|"value"}`` (Kafka Streams app, Quix, streamjoin
    aggregations) or the count itself with the bounds in the ``window-start`` and
    ``window-end`` headers (a streamjoin windowed table). ``end`` as the system wrote it."""
    body = json.loads(value or b"null")
    user = (key or b"").decode()
    if isinstance(body, dict):
        start, end = int(body["start"]), int(body["end"])
        count = body["count"] if "count" in body else body["value"]
    else:
        found = dict(headers)
        start, end, count = int(found["window-start"]), int(found["window-end"]), body
    if window == "hopping":
        return (user, start), int(count)
    return (user, start, end), int(count)


# --------------------------------------------------------------------------- dumps


def read_dump_rows(marks: list[Path]) -> Windows:
    """The windows the apps dumped (``[key, start, count]`` or ``[key, start, end, count]``
    per line), the newest dump per partition (or one whole dump)."""
    newest: dict[str, Path] = {}
    for path in marks:
        for dump in path.parent.glob(f"{path.name}.dump.*"):
            if ".tmp-" in dump.name:
                continue
            part = dump.name.rsplit(".", 1)[-1]
            if part not in newest or dump.stat().st_mtime > newest[part].stat().st_mtime:
                newest[part] = dump
    got: Windows = {}
    for dump in newest.values():
        for line in dump.read_text().splitlines():
            row = json.loads(line)
            got[(row[0], *(int(x) for x in row[1:-1]))] = int(row[-1])
    return got


def dumps_complete(marks: list[Path], partitions: int) -> bool:
    parts = {
        dump.name.rsplit(".", 1)[-1]
        for path in marks
        for dump in path.parent.glob(f"{path.name}.dump.*")
        if ".tmp-" not in dump.name
    }
    return "all" in parts or parts >= {f"p{p}" for p in range(partitions)}


# --------------------------------------------------------------------------- systems


def system_command(
    system: str,
    shape: Shape,
    bootstrap: str,
    group: str,
    input_topic: str,
    output_topic: str,
    workdir: Path,
    name: str,
    keys: int,
    time_range: tuple[int, int],
    classpath: str | None,
    quix_python: Path | None,
    java_options: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    close = system.endswith("-close")
    emit = "close" if close else "update"
    params = {
        "window": shape.window,
        "emit": emit,
        "size-ms": shape.size_ms,
        "step-ms": shape.step_ms,
        "gap-ms": shape.gap_ms,
        "grace-ms": shape.grace_ms,
        "retention-ms": shape.retention_ms(close),
    }
    common = {
        "bootstrap": bootstrap,
        "app-id": group,
        "input": input_topic,
        "output": output_topic,
        "state-dir": str(workdir / f"state-{name}"),
    }
    if system.startswith("kstreams"):
        assert classpath is not None
        extra = {"keys": keys, "from-ms": time_range[0], "to-ms": time_range[1]}
        return kstreams_command(
            "WindowKinds", classpath, java_options, {**common, **params, **extra}
        )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if system.startswith("streamjoin"):
        env.update(
            BENCH_APP_ID=group,
            BENCH_INPUT=input_topic,
            BENCH_OUTPUT=output_topic,
            STREAMJOIN_BROKER=f"kafka://{bootstrap}",
            **{f"BENCH_{k.upper().replace('-', '_')}": str(v) for k, v in params.items()},
        )
        app = "benchmarks.window_kinds_streamjoin_app:app"
        return streamjoin_command(app, workdir / f"state-{name}", name), env
    env.pop("PYTHONPATH", None)
    assert quix_python is not None
    script = ROOT / "benchmarks" / "window_kinds_quix_app.py"
    args = [f"--{k}={v}" for k, v in {**params, **common}.items()]
    return [str(quix_python), str(script), *args], env


# --------------------------------------------------------------------------- running


async def output_settled(bootstrap: str, topic: str, partitions: int, quiet: float = 3.0) -> None:
    """Until the output topic has not grown for ``quiet`` seconds (at most a minute)."""
    previous: dict[tuple[str, int], int] | None = None
    stable_since = asyncio.get_running_loop().time()
    for _ in range(120):
        now = await last_offsets(bootstrap, [topic], partitions)
        loop_time = asyncio.get_running_loop().time()
        if now != previous:
            previous, stable_since = now, loop_time
        elif loop_time - stable_since >= quiet:
            return
        await asyncio.sleep(0.5)


def tick_keys(partitions: int) -> dict[int, str]:
    """One key per partition (by Kafka's partitioner) for the tick records."""
    from streamjoin.partitioner import partition_for_key

    out: dict[int, str] = {}
    i = 0
    while len(out) < partitions:
        key = f"{TICK_PREFIX}{i}"
        out.setdefault(partition_for_key(key.encode(), partitions), key)
        i += 1
    return out


def not_ticks(windows: Windows) -> Windows:
    return {w: n for w, n in windows.items() if not str(w[0]).startswith(TICK_PREFIX)}


async def ticked_output_settled(
    bootstrap: str, ticks: list[tuple[str, bytes, bytes, int]], topic: str, partitions: int
) -> None:
    """A tick record into every input partition once a wall-clock second has passed
    (Kafka Streams' emission pass needs a record), then :func:`output_settled`."""
    await asyncio.sleep(1.5)
    await produce(bootstrap, ticks)
    await output_settled(bootstrap, topic, partitions)


async def dumps_settled(marks: list[Path], partitions: int) -> None:
    for _ in range(1200):  # at most a minute
        if dumps_complete(marks, partitions):
            return
        await asyncio.sleep(0.05)


async def run(args: Any, bootstrap: str, workdir: Path) -> dict[str, Any]:
    from streamjoin.partitioner import partition_for_key
    from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

    progress = sayer("window_kinds")
    shape = Shape(args.window)
    systems = chosen_systems(args, SYSTEMS)
    records = generate(args.events, args.keys, args.seed)
    events = [(k.decode(), ts) for _, k, _, ts in records]
    truth = model(events, shape) if any(not s.endswith("-close") for s in systems) else {}
    expectations: dict[int, CloseExpectation] = {}

    def expectation_of(system: str) -> CloseExpectation:
        delay = close_delay_ms(system, shape)
        if delay not in expectations:
            expectations[delay] = close_expectation(
                events,
                lambda key: partition_for_key(key.encode(), args.partitions),
                shape,
                delay_ms=delay,
            )
        return expectations[delay]

    ready = {s: (streamjoin_version(), "") for s in systems if s.startswith("streamjoin")}
    classpath: str | None = None
    if any(s.startswith("kstreams") for s in systems):
        classpath, why_no_java = kstreams_build(args.rebuild, "WindowKinds")
        version = kstreams_version() if classpath else ""
        ready.update({s: (version, why_no_java) for s in systems if s.startswith("kstreams")})
    quix_python: Path | None = None
    if any(s.startswith("quix") for s in systems):
        quix_python, why_no_quix = venv_python("quix", Path(args.venv_root), not args.no_install)
        version = dist_version(quix_python, "quixstreams") if quix_python else ""
        ready.update({s: (version, why_no_quix) for s in systems if s.startswith("quix")})

    run_id = uuid.uuid4().hex[:8]
    prefix = f"windowkinds-{run_id}"
    input_topic = f"{prefix}-input"
    outputs = {(s, r): f"{prefix}-out-{s}-{r}" for s in systems for r in range(args.repeat)}
    specs = [TopicSpec(input_topic, args.partitions)]
    specs += [
        TopicSpec(t, args.partitions) for (s, _), t in outputs.items() if s.endswith("-close")
    ]
    await ensure_topics(bootstrap, specs)
    await wait_leaders(bootstrap, [sp.name for sp in specs], args.partitions)
    produce_s = await produce(bootstrap, ((input_topic, k, v, ts) for _, k, v, ts in records))
    progress(f"produced {len(records):,} records in {produce_s:.1f}s")
    last = await last_offsets(bootstrap, [input_topic], args.partitions)

    partition_time: dict[int, int] = {}
    for key, ts in events:
        p = partition_for_key(key.encode(), args.partitions)
        partition_time[p] = max(ts, partition_time.get(p, 0))
    ticks = [
        (input_topic, key.encode(), b'{"tick": true}', partition_time.get(p, BASE_MS))
        for p, key in tick_keys(args.partitions).items()
    ]
    # (the windows the Kafka Streams app reads back: its caching store walks a time range)
    time_range = (min(ts for _, ts in events) - KEEP_ALL_MS, max(ts for _, ts in events) + 1)

    def launch(system: str, r: int, name: str) -> Launch:
        output = outputs[(system, r)]
        cmd = system_command(
            system,
            shape,
            bootstrap,
            f"{prefix}-{name}",
            input_topic,
            output,
            workdir,
            name,
            args.keys,
            time_range,
            classpath,
            quix_python,
            args.kstreams_java_options.split(),
        )
        if not system.endswith("-close"):

            async def check_dump(marks: list[Path]) -> dict[str, int]:
                return check_windows(truth, not_ticks(read_dump_rows(marks)))

            settle_dump = functools.partial(dumps_settled, partitions=args.partitions)
            return Launch([cmd], check_dump, settle_dump)

        async def check_output(_marks: list[Path]) -> dict[str, int]:
            out = await read_records(bootstrap, output, args.partitions)
            finals = [
                final_of(system, rec.key, rec.value, rec.headers or (), shape.window) for rec in out
            ]
            finals = [(w, n) for w, n in finals if not str(w[0]).startswith(TICK_PREFIX)]
            return check_final(expectation_of(system), finals)

        async def settle_output(_marks: list[Path]) -> None:
            await ticked_output_settled(bootstrap, ticks, output, args.partitions)

        return Launch([cmd], check_output, settle_output)

    results = await run_rounds(args, systems, ready, launch, len(records), last, workdir, progress)
    head = (
        f"{len(records):,} events, {args.keys:,} keys, {shape.window} windows ("
        + (
            f"{shape.size_ms // 60_000} min advancing by {shape.step_ms // 60_000} min"
            if shape.window == "hopping"
            else f"gap {shape.gap_ms} ms"
        )
        + f", grace {shape.grace_ms} ms), {len(truth):,} windows in the model; "
        f"{args.partitions} partitions; {machine()}"
    )
    command_line = " ".join(["python", "-m", "benchmarks.window_kinds", *sys.argv[1:]])
    return rounds_report(command_line, head, args.repeat, results)


def close_delay_ms(system: str, shape: Shape) -> int:
    """How much later than :func:`close_time` ``system`` closes a window: Quix closes a
    session one more gap later (when no admissible late event could extend it)."""
    return shape.gap_ms if shape.window == "session" and system.startswith("quix") else 0


def final_of(
    system: str,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    window: str,
) -> tuple[tuple[Any, ...], int]:
    """An output record of ``system`` as (window, count), sessions as (key, first, last
    event): Quix's and streamjoin's session end is the last event + 1, Kafka Streams' the
    last event."""
    found, n = parse_final(key, value, headers, window)
    if window == "session" and not system.startswith("kstreams"):
        found = (*found[:2], found[2] - 1)
    return found, n


def kstreams_of(system: str) -> str:
    """The Kafka Streams system ``system`` is compared with: the one of the same emission."""
    return "kstreams-close" if system.endswith("-close") else "kstreams"


def table(report: dict[str, Any]) -> str:
    results = [WorkloadResult(**r) for r in report["results"]]
    notes = []
    by_system = {r.system: r for r in results}
    for base in ("streamjoin", "kstreams", "quix"):
        update, close = by_system.get(base), by_system.get(f"{base}-close")
        if update and close and update.cpu_seconds and close.cpu_seconds:
            notes.append(
                f"{base}: emit on close costs {close.cpu_seconds / update.cpu_seconds:.2f}x "
                "the CPU of emit on update"
            )
    for r in results:
        if r.check.get("emitted") is not None:
            notes.append(
                f"{r.system}: {r.check['emitted']:,} final results for {r.check['expected']:,} "
                f"due and {r.check['optional']:,} optional windows"
            )
    return results_table(report, KSTREAMS_COLUMNS, kstreams_of, notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--window", choices=("hopping", "session"), default="hopping")
    bench_arguments(
        parser,
        events=500_000,
        keys=10_000,
        systems=SYSTEMS,
        default="streamjoin,kstreams,quix",
        timeout=1800,
    )
    kstreams_arguments(parser)
    venv_arguments(parser)
    args = parser.parse_args(argv)
    return bench_main(args, "window_kinds", functools.partial(run, args), table)


if __name__ == "__main__":
    raise SystemExit(main())
