"""Top functions of a py-spy profile (``py-spy record --format raw``), by own and total time.

    .venv/bin/python -m benchmarks.profile_summary PROFILE.txt [--top 15] [--grep streamjoin]

Samples of start-up (imports, opening stores) and of the benchmark's answer dump are left
out (``--exclude``). Own: samples whose innermost frame is the function. Total: samples
with the function
anywhere on the stack (counted once per sample). Shares are of all samples of the file.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(.*) (\d+)$")


def function_of(frame: str) -> str:
    """``name (path:line)`` -> ``name (short path)``: one entry per function, not per line."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0].rstrip(")")
    for marker in ("site-packages/", "wt-speed/", "/lib/python3."):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name


#: samples of start-up and of the benchmark's own answer dump, left out by default
EXCLUDE = ("_find_and_load", "RocksDBStorePartition.__init__", "write_dump", "local_items")


def summarize(
    path: Path, exclude: tuple[str, ...] = EXCLUDE
) -> tuple[int, Counter[str], Counter[str]]:
    total = 0
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        stack, count = match.group(1), int(match.group(2))
        if any(word in stack for word in exclude):
            continue
        frames = [function_of(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for function in set(frames):
            anywhere[function] += count
    return total, own, anywhere


#: (area, path fragments) in order: a function's own time goes to the first area it matches
AREAS = (
    (
        "agent runtime (runtime/tasks: actors, acknowledgements, offsets; agents, stream)",
        (
            "runtime/tasks/agent_runtime.py",
            "runtime/tasks/actors.py",
            "runtime/tasks/in_flight.py",
            "runtime/tasks/acknowledgements.py",
            "runtime/tasks/barrier.py",
            "runtime/tasks/error_policy.py",
            "streamjoin/agents.py",
            "streamjoin/stream.py",
            "runtime/tasks/offset_ledger.py",
            "runtime/tasks/task.py",
            "runtime/tasks/processing.py",
            "context.py",
        ),
    ),
    (
        "fetch (runtime/transport: consumer, fetched_records; alignment, record_queue, aiokafka)",
        (
            "runtime/transport/consumer.py",
            "runtime/transport/fetched_records.py",
            "runtime/table_state/changelog_records.py",
            "alignment.py",
            "record_queue.py",
            "aiokafka/consumer",
            "aiokafka/record",
        ),
    ),
    (
        "produce (topics.send, runtime/transport: producer, out_batches; partitioner, aiokafka)",
        (
            "topics.py",
            "runtime/transport/producer.py",
            "runtime/transport/out_batches.py",
            "runtime/transport/record_limits.py",
            "partitioner.py",
            "aiokafka/producer",
        ),
    ),
    ("codecs and json", ("codecs.py", "json/")),
    (
        "state (tables, windowed, state/, rocksdict, sortedcontainers)",
        (
            "tables.py",
            "windowed.py",
            "streamjoin/state/",
            "rocksdict",
            "sortedcontainers",
        ),
    ),
    ("join core (joins/)", ("core.py", "joins/", "api.py")),
    ("asyncio and other aiokafka", ("asyncio/", "aiokafka/", "mode/")),
    ("benchmark app", ("benchmarks/",)),
)


def by_area(own: Counter[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for function, n in own.items():
        area = next(
            (name for name, parts in AREAS if any(part in function for part in parts)), "other"
        )
        out[area] += n
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--grep", default="", help="total-time list: only functions matching")
    parser.add_argument(
        "--exclude",
        default=",".join(EXCLUDE),
        help="leave out samples whose stack mentions any of these (comma-separated)",
    )
    args = parser.parse_args(argv)
    for path in args.profiles:
        total, own, anywhere = summarize(path, tuple(filter(None, args.exclude.split(","))))
        print(f"== {path} ({total} samples)")
        print("-- own time")
        for function, n in own.most_common(args.top):
            print(f"{100 * n / total:5.1f}%  {function}")
        print("-- own time by area")
        for area, n in by_area(own).most_common():
            print(f"{100 * n / total:5.1f}%  {area}")
        print("-- total time")
        shown = 0
        for function, n in anywhere.most_common():
            if args.grep in function:
                print(f"{100 * n / total:5.1f}%  {function}")
                shown += 1
                if shown >= args.top:
                    break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
