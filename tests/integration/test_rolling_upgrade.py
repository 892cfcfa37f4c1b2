"""Eager and cooperative workers in one group, and a rolling upgrade from the eager version.

Workers are dynamic members here: each replacement leaves the group, so the group
rebalances and picks its protocol again at once (a static member replaced within its
session timeout may not trigger a rebalance, so the switch waits for the next one).

The eager version is the last commit before streamjoin owned its group membership
(aiokafka's consumer and eager protocol), taken from this repository's history
with ``git archive`` and run as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tarfile
from collections import Counter
from collections.abc import Callable
from io import BytesIO
from pathlib import Path

import pytest

from tests.integration.support import (
    ROOT,
    Traffic,
    Workers,
    counter_workers,
    read_all,
    wait_for_group,
)

pytestmark = pytest.mark.integration

#: the last commit with aiokafka's eager group membership
EAGER_VERSION = "e04429b"
EAGER = "streamjoin"
COOPERATIVE = "streamjoin-cooperative"


def eager_version(into: Path) -> Path:
    """The eager version's package and test apps, extracted from git history."""
    paths = ["streamjoin", "tests/__init__.py", "tests/integration/__init__.py"]
    paths.append("tests/integration/apps")
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", EAGER_VERSION, *paths],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise AssertionError(
            f"the upgrade test needs commit {EAGER_VERSION} of this repository's history "
            f"(a full clone): {exc}"
        ) from exc
    into.mkdir(parents=True)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


async def counts_are_exact(bootstrap: str, workers: Workers, sent: Counter[str]) -> None:
    """Every event counted exactly once: key k's updates are exactly 1..sent[k]."""
    records = await read_all(bootstrap, workers.env["SJT_SINK"], sum(sent.values()), timeout=90)
    seen: dict[str, list[int]] = {}
    for key, value, _headers in records:
        seen.setdefault(key, []).append(int(value.split("=")[1]))
    wrong: dict[str, str] = {}
    for key, n in sorted(sent.items()):
        counts = Counter(seen.get(key, []))
        missing = [c for c in range(1, n + 1) if c not in counts]
        twice = sorted(c for c, times in counts.items() if times > 1)
        beyond = sorted(c for c in counts if not 1 <= c <= n)
        if missing or twice or beyond:
            wrong[key] = f"sent {n}: missing {missing[:5]} twice {twice[:5]} beyond {beyond[:5]}"
    assert not wrong, f"counts not exact: {wrong}\n{workers.logs()}"


async def test_eager_and_cooperative_workers_share_a_group(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = counter_workers(kafka_bootstrap, unique_topic, tmp_path, partitions=6)
    traffic = Traffic(kafka_bootstrap, workers.env["SJT_SOURCE"])
    group = workers.env["SJT_APP_ID"]
    cooperative_env = dict(workers.env)
    try:
        workers.start("coop-1", static=False)
        await wait_for_group(kafka_bootstrap, group, lambda g: len(g.members) == 1, workers)
        producing = asyncio.create_task(traffic.run())
        workers.env = {**cooperative_env, "SJT_PROTOCOL": "eager"}
        workers.start("eager-1", static=False)
        info = await wait_for_group(
            kafka_bootstrap,
            group,
            lambda g: len(g.members) == 2 and all(m.active for m in g.members),
            workers,
        )
        assert info.protocol == EAGER  # the group stays eager while a member speaks only eager
        await asyncio.sleep(2)
        workers.stop("eager-1")
        workers.env = cooperative_env
        workers.start("coop-2", static=False)
        info = await wait_for_group(
            kafka_bootstrap,
            group,
            lambda g: (
                len(g.members) == 2
                and all(m.active for m in g.members)
                and g.protocol == COOPERATIVE
            ),
            workers,
        )
        assert info.protocol == COOPERATIVE
        await asyncio.sleep(2)
        traffic.stop()
        await producing
        await counts_are_exact(kafka_bootstrap, workers, traffic.sent)
    finally:
        traffic.stop()
        workers.close()


async def test_a_rolling_upgrade_from_the_eager_version(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    old = eager_version(tmp_path / "eager-version")
    workers = counter_workers(kafka_bootstrap, unique_topic, tmp_path / "logs", partitions=6)
    (tmp_path / "logs").mkdir()
    traffic = Traffic(kafka_bootstrap, workers.env["SJT_SOURCE"])
    group = workers.env["SJT_APP_ID"]
    producing: asyncio.Task[None] | None = None

    def both_working(protocol: str) -> Callable[..., bool]:
        return lambda g: (
            len(g.members) == 2 and all(m.active for m in g.members) and g.protocol == protocol
        )

    try:
        workers.start("a", static=False, cwd=old)
        workers.start("b", static=False, cwd=old)
        await wait_for_group(kafka_bootstrap, group, both_working(EAGER), workers)
        producing = asyncio.create_task(traffic.run())
        await asyncio.sleep(2)
        # step 1: a runs the new version; b still speaks only eager, so the group stays eager
        workers.stop("a")
        workers.start("a", static=False)
        await wait_for_group(kafka_bootstrap, group, both_working(EAGER), workers)
        await asyncio.sleep(2)
        # step 2: b too; with no eager-only member left the group turns cooperative
        workers.stop("b")
        workers.start("b", static=False)
        await wait_for_group(kafka_bootstrap, group, both_working(COOPERATIVE), workers)
        await asyncio.sleep(2)
        traffic.stop()
        await producing
        await counts_are_exact(kafka_bootstrap, workers, traffic.sent)
    finally:
        traffic.stop()
        if producing is not None:
            with contextlib.suppress(Exception):
                await producing
        workers.close()
