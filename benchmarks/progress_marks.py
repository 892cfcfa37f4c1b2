"""Timing marks the benchmark apps write (stdlib only: the Faust and Quix apps import it too).

An app calls :meth:`Marks.seen` once per input event it has processed. The marks file
gets one line per mark, ``<WHAT> <unix time> <process CPU time> [partition]``:

* ``FIRST``: the first input event reached this process;
* ``PDONE``: this process processed the last offset of a partition (the harness passes
  each partition's last offset), with the partition;
* ``DONE``: this process has written ``PDONE`` for every partition.

Keying completion on the last offsets instead of a count keeps the marks right when a
partition is processed twice in part (at-least-once after a rebalance) or split between
two worker processes. The CPU time is ``time.process_time()``: user + system time of all
the process's threads.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable


def parse_last_offsets(text: str) -> dict[tuple[str, int], int]:
    """``topic:partition:offset,...`` -> {(topic, partition): last offset}."""
    out: dict[tuple[str, int], int] = {}
    for item in filter(None, text.split(",")):
        topic, partition, offset = item.rsplit(":", 2)
        out[(topic, int(partition))] = int(offset)
    return out


def format_last_offsets(last: dict[tuple[str, int], int]) -> str:
    return ",".join(f"{t}:{p}:{o}" for (t, p), o in sorted(last.items()))


class Marks:
    """Writes FIRST/PDONE/DONE marks; ``on_partition_done(topic, partition)`` and
    ``on_done()`` run right after their mark is written."""

    def __init__(
        self,
        path: str,
        last_offsets: dict[tuple[str, int], int],
        on_partition_done: Callable[[str, int], None] | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.last = last_offsets
        self.pending = set(last_offsets)
        self.started = False
        self.on_partition_done = on_partition_done
        self.on_done = on_done

    def write(self, what: str, extra: str = "") -> None:
        with open(self.path, "a") as f:
            f.write(f"{what} {time.time():.6f} {time.process_time():.6f} {extra}\n".rstrip() + "\n")

    def first(self) -> None:
        if not self.started:
            self.started = True
            self.write("FIRST")

    def seen(self, topic: str, partition: int, offset: int) -> None:
        if not self.started:
            self.first()
        if self.last.get((topic, partition)) == offset:
            self.write("PDONE", f"{topic}:{partition}")
            if self.on_partition_done is not None:
                self.on_partition_done(topic, partition)
            self.pending.discard((topic, partition))
            if not self.pending:
                self.write("DONE")
                if self.on_done is not None:
                    self.on_done()


def write_dump(path: str, rows: Iterable[list[object]]) -> None:
    """JSON lines, written whole and renamed into place (a reader never sees half a dump)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
