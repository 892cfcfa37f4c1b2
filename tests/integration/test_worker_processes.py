"""``streamjoin worker --processes 2`` on the real broker: one command, two members.

1. Both children join the group as members ``<instance id>-0`` and ``-1`` with their own
   state directories, share the partitions, and count every record exactly once (none
   missing, none counted twice); SIGTERM to the command stops both cleanly (exit 0).
2. A child killed with kill -9 ends the command: the other child is stopped and the
   command exits non-zero, so what restarts it sees the failure.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.support import (
    Workers,
    counter_workers,
    produce,
    read_all,
    sizes,
    wait_for_group,
)
from tests.integration.test_membership import last_counts

PARTITIONS = 4


def children_of(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")"
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def started(bootstrap: str, workers: Workers) -> list[int]:
    """Start ``w`` with two processes; wait until both are members holding 2 partitions
    each; the children's pids."""
    group, source = workers.env["SJT_APP_ID"], workers.env["SJT_SOURCE"]
    workers.start("w", extra=["--processes", "2"])
    info = await wait_for_group(
        bootstrap, group, lambda i: sorted(sizes(i, source)) == [2, 2], workers
    )
    assert sorted(m.instance_id for m in info.members) == ["w-0", "w-1"], info
    pids = children_of(workers.procs["w"].pid)
    assert len(pids) == 2, pids
    return pids


async def test_two_processes_share_the_partitions_and_count_every_record_once(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = counter_workers(kafka_bootstrap, unique_topic, tmp_path, PARTITIONS)
    source, sink = workers.env["SJT_SOURCE"], workers.env["SJT_SINK"]
    keys = [f"k{i}" for i in range(40)]
    try:
        pids = await started(kafka_bootstrap, workers)
        for _ in range(5):
            await produce(kafka_bootstrap, source, [(k, "x") for k in keys])
        updates = await read_all(kafka_bootstrap, sink, 5 * len(keys))
        # each update is one counted record: every key counted 5 times, each once
        assert last_counts(updates) == dict.fromkeys(keys, 5), workers.logs()
        assert sorted(v for _k, v, _h in updates) == sorted(
            f"{k}={n}" for k in keys for n in range(1, 6)
        ), workers.logs()
        state = workers.state_dir("w")
        assert sorted(p.name for p in state.iterdir() if p.is_dir()) == [
            "process-0",
            "process-1",
        ]
        assert workers.stop("w") == 0, workers.logs()
        assert not any(alive(pid) for pid in pids), workers.logs()
    finally:
        workers.close()


async def test_a_child_killed_with_kill_9_ends_the_command_with_a_failure(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = counter_workers(kafka_bootstrap, unique_topic, tmp_path, PARTITIONS)
    try:
        pids = await started(kafka_bootstrap, workers)
        os.kill(pids[0], signal.SIGKILL)
        parent = workers.procs["w"]
        deadline = time.monotonic() + 60
        while parent.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        assert parent.returncode == 1, workers.logs()
        assert not alive(pids[1]), workers.logs()
        assert "ended on its own" in workers.log_of("w"), workers.logs()
    finally:
        workers.close()
