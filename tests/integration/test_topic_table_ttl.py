"""A TTL topic table (``app.topic_table(topic, ttl_ms=)``) through the real broker.

The stream-table join app of test_joins.py, its table given a TTL of 1 s. Every key gets a
row at ``BASE``; some keys (the refreshed ones) a newer row at ``BASE + 1.5 s``. Every key
then gets an event at ``BASE + 0.5 s`` (it must meet the first row) and one at ``BASE + 2
s`` (it must meet the newer row, or nothing: the first row is 2 s old by then). The
worker reads the rows and events of a partition in timestamp order, so stream time, and
with it every answer, is deterministic. Outputs are counted per event (missing, wrong,
duplicated). (The tombstones of purged rows are app.table's TTL machinery, checked
through the broker by test_table_ttl_and_memory.py.)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tests.integration.support import Workers, read_all
from tests.integration.test_joins import produce_at, topic_table_app, topic_table_env

TTL_MS = 1_000
TTL_APP = topic_table_app(
    "A left stream-table join over a TTL topic table",
    """def enrich(key, event, user):
    return {"id": event, "user": user}
""",
).replace(
    "users_table = app.topic_table(users)", f"users_table = app.topic_table(users, ttl_ms={TTL_MS})"
)
BASE = 1_767_225_600_000
KEYS = [f"user-{i}" for i in range(60)]
REFRESHED = set(KEYS[::3])


async def test_a_ttl_topic_table_expires_rows_by_stream_time_for_the_join(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    env = await topic_table_env(kafka_bootstrap, unique_topic, tmp_path, "ttl_app", TTL_APP, "ttl")
    rows: list[tuple[str, str | None, int]] = [(k, json.dumps(f"{k}:v1"), BASE) for k in KEYS]
    rows += [(k, json.dumps(f"{k}:v2"), BASE + 1_500) for k in KEYS if k in REFRESHED]
    events: list[tuple[str, str | None, int]] = []
    expected: dict[int, str | None] = {}
    for i, key in enumerate(KEYS):
        events.append((key, json.dumps(i), BASE + 500))
        expected[i] = f"{key}:v1"
    for i, key in enumerate(KEYS, start=len(KEYS)):
        events.append((key, json.dumps(i), BASE + 2_000))
        expected[i] = f"{key}:v2" if key in REFRESHED else None
    await produce_at(kafka_bootstrap, env["SJT_USERS"], rows)
    await produce_at(kafka_bootstrap, env["SJT_EVENTS"], events)
    workers = Workers("ttl_app:app", env, tmp_path)
    try:
        workers.start("w1")
        out = await read_all(kafka_bootstrap, env["SJT_OUTPUT"], len(events), 60)
        assert workers.stop("w1") == 0, workers.log_of("w1")[-4000:]
    finally:
        workers.close()
    got = Counter((a["id"], a["user"]) for a in (json.loads(v) for _, v, _ in out))
    missing = set(expected) - {i for i, _ in got}
    wrong = {(i, user) for i, user in got if expected.get(i) != user}
    duplicates = sum(n - 1 for n in got.values())
    print(f"{len(got)} answered, {len(missing)} missing, {len(wrong)} wrong, {duplicates} dup")
    assert not missing and not wrong and duplicates == 0, (missing, sorted(wrong, key=str)[:5])
    assert sum(1 for i, user in got if user is None) == len(KEYS) - len(REFRESHED)
