"""The stream surface on the real broker (app: tests/integration/apps/surface.py): operators
(filter, an async map, echo), a sink that is an agent with no topic of its own (sent to
through its durable topic), and a sink topic, under both guarantees, across a crash in an
operator's function and across a worker killed with SIGKILL: nothing missing, and under
exactly-once nothing duplicated (what at-least-once duplicates is printed)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from streamjoin.errors import AgentFailed
from tests.integration.apps.surface import POISON, surface_app
from tests.integration.support import Workers, produce, read_to_end

RECORDS = 120


def _records(n: int) -> list[tuple[str, str]]:
    """``v-i`` values, with a ``drop-i`` (filtered out) every 10th."""
    records = []
    for i in range(n):
        records.append((f"k{i % 5}", f"v-{i}"))
        if i % 10 == 0:
            records.append((f"k{i % 5}", f"drop-{i}"))
    return records


async def _read_until(
    bootstrap: str, topic: str, expected: set[str], isolation: str, seconds: float
) -> list[tuple[str, str]]:
    """``topic`` read to its end, again until it holds every value of ``expected`` (or
    ``seconds`` passed)."""
    deadline = time.monotonic() + seconds
    while True:
        got = await read_to_end(bootstrap, topic, 1, isolation, timeout=10)
        if expected <= {value for _, value in got} or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.5)


def _check(
    guarantee: str, records: list[tuple[str, str]], outputs: dict[str, list[tuple[str, str]]]
) -> None:
    """Every kept value in every output, each with its source key; no duplicates under
    exactly-once."""
    keys = {value: key for key, value in records}
    expected = {value for _, value in records if value.startswith("v-")}
    for topic, got in outputs.items():
        counts = Counter(value for _, value in got)
        missing = expected - set(counts)
        duplicated = sum(n - 1 for n in counts.values())
        print(f"{guarantee} {topic}: {len(got)} records, {duplicated} duplicated")
        assert not missing, f"{topic}: {len(missing)} missing, e.g. {sorted(missing)[:5]}"
        assert set(counts) == expected, f"{topic}: filtered-out records came through"
        assert all(keys[value] == key for key, value in got), f"{topic}: a key changed"
        if guarantee == "exactly_once":
            assert duplicated == 0, f"{topic}: {duplicated} duplicated under exactly-once"


def _isolation(guarantee: str) -> str:
    return "read_committed" if guarantee == "exactly_once" else "read_uncommitted"


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_operators_sinks_and_agent_send_across_a_crash_in_map(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    app_id = unique_topic("surface")
    names = {part: unique_topic(part) for part in ("source", "copy", "out")}
    records = _records(RECORDS)
    expected = {value for _, value in records if value.startswith("v-")}

    crashing = surface_app(
        kafka_bootstrap, app_id, names, guarantee, tmp_path / "a", crash_on=POISON
    )
    with pytest.raises(AgentFailed, match="crash in map"):
        async with crashing:  # (creates the topics)
            await produce(kafka_bootstrap, names["source"], records)
            await asyncio.sleep(60)  # cancelled when the app fails
    # Restarted in the same process on the same state directory, as a user would: the
    # failed app's stop has finished when ``async with`` raised (it once had not, and the
    # new app found the directory still locked: StateDirInUse).
    async with surface_app(kafka_bootstrap, app_id, names, guarantee, tmp_path / "a"):
        isolation = _isolation(guarantee)
        out = await _read_until(kafka_bootstrap, names["out"], expected, isolation, 30)
        copy = await read_to_end(kafka_bootstrap, names["copy"], 1, isolation, timeout=10)
    _check(guarantee, records, {"out": out, "copy": copy})


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_worker_killed_mid_stream_loses_nothing(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    names = {part: unique_topic(part) for part in ("source", "copy", "out")}
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("surface"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_SOURCE": names["source"],
        "SJT_COPY": names["copy"],
        "SJT_OUT": names["out"],
        "SJT_GUARANTEE": guarantee,
        "SJT_WORK_MS": "10",
        "PYTHONUNBUFFERED": "1",
    }
    workers = Workers("tests.integration.apps.surface:app", env, tmp_path)
    records = _records(RECORDS * 2)
    expected = {value for _, value in records if value.startswith("v-")}
    isolation = _isolation(guarantee)
    try:
        workers.start("w1")
        deadline = time.monotonic() + 60
        while "created topics" not in workers.log_of("w1") and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        await produce(kafka_bootstrap, names["source"], records)
        # killed once two thirds went through (records in flight, sends unacknowledged)
        while time.monotonic() < deadline:
            done = await read_to_end(kafka_bootstrap, names["out"], 1, isolation, timeout=10)
            if len(done) >= RECORDS * 2 // 3:
                break
            await asyncio.sleep(0.2)
        assert workers.stop("w1", signal.SIGKILL) == -signal.SIGKILL
        assert len(done) < RECORDS * 2, "all done before the kill: nothing was tested"
        workers.start("w1")
        out = await _read_until(kafka_bootstrap, names["out"], expected, isolation, 60)
        copy = await read_to_end(kafka_bootstrap, names["copy"], 1, isolation, timeout=10)
        assert workers.stop("w1") == 0
    except BaseException:
        print(workers.logs())
        raise
    finally:
        workers.close()
    _check(guarantee, records, {"out": out, "copy": copy})
