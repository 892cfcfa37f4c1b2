"""KIP-441 warmups through the real broker: a task moves only once its new owner caught up.

One worker builds a large table alone; a second, empty worker joins. With high
availability on, the tasks stay on the first worker while warmup replicas restore their
state on the second, probing rebalances check the warmups' lag, and each task moves
only when its warmup is within ``acceptable_recovery_lag``: the second worker never
replays a whole changelog as an active task.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.support import (
    counter_workers,
    produce,
    read_all,
    sizes,
    wait_for_group,
)

pytestmark = pytest.mark.integration

RECOVERY_LAG = 200
KEYS = 12_000


def active_restores(log: str) -> list[int]:
    """Changelog records each active restore of the log had to replay."""
    return [int(n) for n in re.findall(r"restoring counts\[\d+\]: (\d+) changelog records", log)]


async def test_tasks_move_to_a_new_worker_only_once_its_warmups_caught_up(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = counter_workers(kafka_bootstrap, unique_topic, tmp_path, partitions=4)
    workers.env.update(
        SJT_HIGH_AVAILABILITY="1",
        SJT_RECOVERY_LAG=str(RECOVERY_LAG),
        SJT_PROBING_S="2",
    )
    group = workers.env["SJT_APP_ID"]
    source = workers.env["SJT_SOURCE"]
    try:
        workers.start("a")
        await wait_for_group(kafka_bootstrap, group, lambda g: len(g.members) == 1, workers)
        # every key once: each partition's changelog ends up with ~3,000 records
        await produce(kafka_bootstrap, source, [(f"key-{i}", "e") for i in range(KEYS)])
        # all processed (one count update per key in the sink), then flushed
        await read_all(kafka_bootstrap, workers.env["SJT_SINK"], KEYS, timeout=90)
        await asyncio.sleep(1.5)
        workers.start("b")
        info = await wait_for_group(
            kafka_bootstrap, group, lambda g: sizes(g, source) == [2, 2], workers, timeout=120
        )
        assert len(info.members) == 2
        log_b = workers.log_of("b")
        restores = active_restores(log_b)
        # b took its two tasks over from caught-up warmups: at most the acceptable lag was
        # replayed as an active restore (usually nothing: no "restoring" line at all)
        assert all(n <= RECOVERY_LAG for n in restores), (restores, workers.logs())
        # ... and only after warmups and at least one probing rebalance
        first_assigned = log_b.index("assigned 2 partitions")
        assert "probing rebalance planned for warmups" in log_b[:first_assigned], workers.logs()
        assert "probing rebalance: are the warmup replicas caught up?" in log_b[:first_assigned]
    finally:
        workers.close()
