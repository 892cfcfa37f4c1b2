"""Our group membership service (streamjoin/runtime/group/membership.py) on the real broker.

1. ``test_a_second_worker_with_the_same_instance_id_fences_the_first``: two workers started
   with the same ``--instance-id``: the older one is fenced (FENCED_INSTANCE_ID) and must stop
   on its own, within a bounded time, with one clear error line and a non-zero exit code,
   while the group goes on with the newer one.
2. ``test_a_static_worker_frozen_past_its_session_timeout_joins_again``: the group drops a
   static member whose session expired; the member hears UNKNOWN_MEMBER_ID and must join
   again (a fresh member id for the same instance id), not take itself for fenced.
3. ``test_assignment_cli_shows_the_group_as_a_consumer_group``: with membership no longer
   aiokafka's, the group must still look like a consumer group to Kafka's tools (protocol
   type ``consumer``) and ``streamjoin assignment`` must show its member and partitions.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from streamjoin.runtime.group.group_info import describe_group
from streamjoin.runtime.group.membership import COOPERATIVE_PROTOCOL, PROTOCOL_TYPE
from tests.integration.support import (
    ROOT,
    Workers,
    committed_offsets,
    counter_workers,
    produce,
    read_all,
    sizes,
    wait_for_group,
)

PARTITIONS = 4
#: how long the fenced worker may take to stop: it learns at its next heartbeat (1 s in
#: the counter app), loses its partitions and stops; most of this is margin for a busy box
FENCED_STOP_BOUND = 30.0


def last_counts(records: list[tuple[str, str, dict[str, bytes]]]) -> dict[str, int]:
    """The counter's sink holds "<key>=<count>" updates: the last count of every key."""
    out: dict[str, int] = {}
    for key, value, _headers in records:
        out[key] = max(out.get(key, 0), int(value.split("=", 1)[1]))
    return out


async def wait_committed(bootstrap: str, workers: Workers, total: int, timeout: float) -> None:
    group, topic = workers.env["SJT_APP_ID"], workers.env["SJT_SOURCE"]
    deadline = time.monotonic() + timeout
    offsets: list[int] = []
    while time.monotonic() < deadline:
        offsets = await committed_offsets(bootstrap, group, topic, PARTITIONS)
        if sum(offsets) >= total:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"committed offsets {offsets} never reached {total}\n{workers.logs()}")


async def test_a_second_worker_with_the_same_instance_id_fences_the_first(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = counter_workers(kafka_bootstrap, unique_topic, tmp_path, PARTITIONS)
    group, source, sink = (workers.env[k] for k in ("SJT_APP_ID", "SJT_SOURCE", "SJT_SINK"))
    keys = [f"k{i}" for i in range(8)]
    try:
        workers.start("old", instance_id="shared")
        await wait_for_group(
            kafka_bootstrap, group, lambda i: sizes(i, source) == [PARTITIONS], workers
        )
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys])
        first = await read_all(kafka_bootstrap, sink, len(keys))
        assert last_counts(first) == dict.fromkeys(keys, 1), workers.logs()
        # Everything the old worker did is committed: the new one must not replay any of it.
        await wait_committed(kafka_bootstrap, workers, len(keys), 30.0)

        old = workers.procs["old"]
        workers.start("new", instance_id="shared")
        started = time.monotonic()
        try:
            code = await asyncio.to_thread(old.wait, FENCED_STOP_BOUND)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"the fenced worker was still running {FENCED_STOP_BOUND:.0f}s after another "
                f"worker took its instance id\n{workers.logs()}"
            ) from exc
        took = time.monotonic() - started
        assert code != 0, f"the fenced worker exited with {code}\n{workers.logs()}"
        log = workers.log_of("old")
        # (aiokafka's fetcher may log errors of its own while a fresh topic gets its leaders)
        errors = [line for line in log.splitlines() if " ERROR streamjoin" in line]
        assert len(errors) == 1, f"expected one error line, got {errors}\n{log[-4000:]}"
        assert "FencedInstanceError" in errors[0] and "'shared'" in errors[0], errors
        assert "Traceback" not in log, log[-4000:]
        print(f"fenced worker stopped {took:.1f}s after the new one started: {errors[0]}")

        # The group goes on with the newer worker: it owns everything and counts on from the
        # old worker's committed state (its changelog), nothing replayed.
        assert workers.procs["new"].poll() is None, workers.log_of("new")[-4000:]
        info = await wait_for_group(
            kafka_bootstrap, group, lambda i: sizes(i, source) == [PARTITIONS], workers
        )
        assert [m.instance_id for m in info.members] == ["shared"]
        await produce(kafka_bootstrap, source, [(k, "y") for k in keys])
        everything = await read_all(kafka_bootstrap, sink, 2 * len(keys))
        assert last_counts(everything) == dict.fromkeys(keys, 2), workers.logs()
        assert len(everything) == 2 * len(keys), everything
        assert workers.procs["new"].poll() is None, workers.log_of("new")[-4000:]
    finally:
        workers.close()


async def test_a_static_worker_frozen_past_its_session_timeout_joins_again(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = counter_workers(kafka_bootstrap, unique_topic, tmp_path, PARTITIONS)
    group, source, sink = (workers.env[k] for k in ("SJT_APP_ID", "SJT_SOURCE", "SJT_SINK"))
    keys = [f"k{i}" for i in range(8)]
    try:
        workers.start("w1")
        await wait_for_group(
            kafka_bootstrap, group, lambda i: sizes(i, source) == [PARTITIONS], workers
        )
        proc = workers.procs["w1"]
        proc.send_signal(signal.SIGSTOP)
        try:
            # the counter app's session timeout is 10 s: the group drops the member
            deadline = time.monotonic() + 30.0
            while (await describe_group(kafka_bootstrap, group)).members:
                assert time.monotonic() < deadline, "the frozen member was never dropped"
                await asyncio.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGCONT)
        info = await wait_for_group(
            kafka_bootstrap, group, lambda i: sizes(i, source) == [PARTITIONS], workers
        )
        assert [m.instance_id for m in info.members] == ["w1"]
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys])
        counts = await read_all(kafka_bootstrap, sink, len(keys))
        assert last_counts(counts) == dict.fromkeys(keys, 1), workers.logs()
        assert proc.poll() is None, workers.log_of("w1")[-4000:]
        log = workers.log_of("w1")
        assert "heartbeat answered UNKNOWN_MEMBER_ID" in log, log[-4000:]
        assert "Fenced" not in log and " ERROR streamjoin" not in log, log[-4000:]
    finally:
        workers.close()


async def test_assignment_cli_shows_the_group_as_a_consumer_group(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = counter_workers(kafka_bootstrap, unique_topic, tmp_path, PARTITIONS)
    group, source = workers.env["SJT_APP_ID"], workers.env["SJT_SOURCE"]
    try:
        workers.start("w1", extra=["--web-port", "0"])
        await wait_for_group(
            kafka_bootstrap, group, lambda i: sizes(i, source) == [PARTITIONS], workers
        )
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            described = (await admin.describe_consumer_groups([group]))[0].to_object()
        finally:
            await admin.close()
        [state] = described["groups"]
        assert state["protocol_type"] == PROTOCOL_TYPE == "consumer"
        assert state["protocol"] == COOPERATIVE_PROTOCOL
        assert [m["client_id"].startswith(group) for m in state["members"]] == [True], state

        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "streamjoin.cli", "assignment", "-A", workers.app_spec],
            cwd=ROOT,
            env=workers.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == f"group {group!r}: state Stable, 1 members", out.stdout
        header = ["MEMBER", "INSTANCE", "HOST", "QUERY", "GENERATION", "ACTIVE", "STANDBY"]
        assert lines[1].split() == header
        member = lines[2].split()
        assert member[1] == "w1" and member[5] == f"{source}[0-{PARTITIONS - 1}]", out.stdout
        # the query address the worker advertises: its web server's, on loopback
        assert member[3].startswith("127.0.0.1:"), out.stdout
    finally:
        workers.close()
