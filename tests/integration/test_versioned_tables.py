"""A versioned topic table (``history_ms=``) through the real broker, with a worker killed -9.

Every key has two rows: v1 at ``BASE`` and v2 at ``BASE + 10 s``. The stream's events are
mostly at ``BASE + 20 s`` and later (they must meet v2), but every third one is out of
order within its partition, timestamped between the two rows (it must meet v1, though it
is read after v2 was applied). The worker is killed -9 mid-stream and restarted with its
state directory wiped, so the rest (a last third produced after the restart, at least) is
joined from a table restored from its changelog alone: the history must come back with
it. Outputs are counted per event: none missing, every answer the as-of one (duplicates,
allowed under at-least-once after a kill, must carry the same answer; under exactly-once,
read committed, there must be none). The same input through a plain topic table (the
same app with ``history_ms`` unset) gives the newer row to the out-of-order events: the
difference this test exists to catch. Before the kill, a row and an event older than the
history are sent: the worker drops both, and its /metrics count them.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.support import Workers, read_all, replayed_records, sleep_alive
from tests.integration.test_joins import produce_at, topic_table_app, topic_table_env
from tests.integration.test_metrics_endpoint import eventually, scrape

#: the reused stream-table join app (test_joins.py), its table made versioned by the env
VERSIONED_APP = topic_table_app(
    "A left stream-table join over a versioned topic table",
    """def enrich(key, event, user):
    return {"id": event, "user": user}
""",
    app_options=', processing_guarantee=os.environ["SJT_GUARANTEE"]',
).replace(
    "users_table = app.topic_table(users)",
    'users_table = app.topic_table(users, history_ms=int(os.environ["SJT_HISTORY_MS"]) or None)',
)
BASE = 1_767_225_600_000
KEYS = [f"user-{i}" for i in range(60)]
EVENTS = 3_000
HISTORY_MS = 60_000


def row(version: str, key: str) -> str:
    return f"{key}:{version}"


def event_stream() -> tuple[list[tuple[str, str | None, int]], dict[int, str]]:
    """The events in production order, and the row each must meet (as of its time)."""
    events, expected = [], {}
    for i in range(EVENTS):
        key = KEYS[i % len(KEYS)]
        if i % 3 == 2:  # out of order: between v1 and v2, produced after later events
            events.append((key, json.dumps(i), BASE + 5_000 + i))
            expected[i] = row("v1", key)
        else:
            events.append((key, json.dumps(i), BASE + 20_000 + i))
            expected[i] = row("v2", key)
    return events, expected


async def run_join(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    history_ms: int,
    kill: bool,
    guarantee: str = "at_least_once",
) -> tuple[Counter[tuple[int, str | None]], dict[int, str]]:
    """Produce the rows and the events' first third, run one worker until it joined them;
    then the second third, and (``kill``) at once a kill -9 and a restart with no local
    state; then the last third (joined by the restored table for sure). The outputs
    (id, row) counted."""
    env = await topic_table_env(
        kafka_bootstrap, unique_topic, tmp_path, "versioned_app", VERSIONED_APP, "versioned"
    )
    env["SJT_HISTORY_MS"] = str(history_ms)
    env["SJT_GUARANTEE"] = guarantee
    isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
    rows = [(k, json.dumps(row("v1", k)), BASE) for k in KEYS]
    rows += [(k, json.dumps(row("v2", k)), BASE + 10_000) for k in KEYS]
    await produce_at(kafka_bootstrap, env["SJT_USERS"], rows)
    events, expected = event_stream()
    third = len(events) // 3
    await produce_at(kafka_bootstrap, env["SJT_EVENTS"], events[:third])
    workers = Workers("versioned_app:app", env, tmp_path)
    try:
        workers.start("w1", extra=["--metrics-port", "0"])
        await read_all(kafka_bootstrap, env["SJT_OUTPUT"], third, 60, isolation)
        if history_ms:
            await drops_counted(kafka_bootstrap, env, workers)
        await produce_at(kafka_bootstrap, env["SJT_EVENTS"], events[third : 2 * third])
        if kill:  # mid-stream: the second third is being read
            assert workers.stop("w1", signal.SIGKILL) == -signal.SIGKILL
            shutil.rmtree(workers.state_dir("w1"))  # restored from the changelog alone
            workers.start("w1")
            await sleep_alive(workers, "w1", 1.0)
        await produce_at(kafka_bootstrap, env["SJT_EVENTS"], events[2 * third :])
        out = await read_all(kafka_bootstrap, env["SJT_OUTPUT"], EVENTS, 90, isolation)
        log = workers.log_of("w1")
        assert workers.stop("w1") == 0, log[-4000:]
    finally:
        workers.close()
    if kill:  # the restart had no local state: its table is the changelog's
        assert replayed_records(log) >= 2 * len(KEYS), log[-4000:]
    answers = [json.loads(value) for _, value, _ in out]
    return Counter((a["id"], a["user"]) for a in answers), expected


async def drops_counted(bootstrap: str, env: dict[str, str], workers: Workers) -> None:
    """Send a row and an event older than the history (the rows moved the table's stream
    time to ``BASE`` + 10 s): the worker drops both, and its /metrics count one late write
    and one too-late lookup. The event's id (``EVENTS``) has no expected answer: were it
    ever joined, the caller's count of wrong answers would show it."""
    too_old = BASE - 2 * HISTORY_MS
    await produce_at(bootstrap, env["SJT_USERS"], [(KEYS[0], json.dumps("late"), too_old)])
    await produce_at(bootstrap, env["SJT_EVENTS"], [(KEYS[0], json.dumps(EVENTS), too_old)])
    announced = re.search(r"status page and metrics on (http://\S+/)", workers.log_of("w1"))
    assert announced, workers.log_of("w1")[-4000:]
    metrics = ("streamjoin_table_late_writes_total", "streamjoin_table_too_late_lookups_total")

    seen: list[tuple[float, ...]] = []

    async def dropped() -> bool:
        values = await scrape(announced.group(1))
        seen.append(tuple(sum(v for (n, _), v in values.items() if n == m) for m in metrics))
        return seen[-1] == (1.0, 1.0)

    try:
        await eventually(dropped, "counted one late write and one too-late lookup", timeout=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {metrics} = {seen[-1:]}") from None


def fresh_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_versioned_table_joins_late_events_as_of_their_time_through_a_kill_9(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    got, expected = await run_join(
        kafka_bootstrap,
        unique_topic,
        fresh_dir(tmp_path / "versioned"),
        HISTORY_MS,
        kill=True,
        guarantee=guarantee,
    )
    answered = {i for i, _ in got}
    missing = set(expected) - answered
    wrong = {(i, user) for i, user in got if expected.get(i) != user}
    duplicates = sum(n - 1 for n in got.values())
    print(f"versioned ({guarantee}): {len(answered)} answered, {duplicates} duplicates")
    assert not missing, f"{len(missing)} events without output, e.g. {sorted(missing)[:5]}"
    assert not wrong, f"{len(wrong)} wrong answers, e.g. {sorted(wrong, key=str)[:5]}"
    if guarantee == "exactly_once":
        assert duplicates == 0
        return

    plain, _ = await run_join(
        kafka_bootstrap, unique_topic, fresh_dir(tmp_path / "plain"), 0, kill=False
    )
    late_wrong = {i for i, user in plain if i % 3 == 2 and user != expected[i]}
    # (a partition whose first event is a late one reads it before the v2 rows: right)
    assert len(late_wrong) > EVENTS // 3 - 10, "a plain table gives late events the newer row"
