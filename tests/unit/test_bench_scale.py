"""The pure parts of the scale benchmarks: data and answers of ``many_partitions``, and
the running / settled predicates over workers' status snapshots."""

from __future__ import annotations

from typing import Any

from benchmarks.group_scale import log_time, settle_from_logs
from benchmarks.many_partitions import (
    check_dumps,
    expected_rows,
    keys_by_partition,
    make_events,
    probe_events,
)
from benchmarks.worker_processes import group_settled, tasks_running
from streamjoin.partitioner import partition_for_key


def test_every_partition_gets_its_own_keys_placed_by_the_partitioner() -> None:
    keys = keys_by_partition(16, 3, partition_for_key)
    assert sorted(keys) == list(range(16))
    for partition, ks in keys.items():
        assert len(ks) == 3
        assert all(partition_for_key(k.encode(), 16) == partition for k in ks)


def _dumps(expected: dict[int, dict[tuple[str, str], int]]) -> dict[int, Any]:
    return {p: [[t, k, v] for (t, k), v in rows.items()] for p, rows in expected.items()}


def test_the_check_accepts_the_right_answer_and_counts_each_kind_of_wrong_one() -> None:
    keys = keys_by_partition(4, 2, partition_for_key)
    events = make_events(keys, 10) + probe_events(keys)
    expected = expected_rows(events)
    first = keys[0][0]
    assert expected[0][("counts", first)] == 6  # 5 round-robin events + the probe
    assert check_dumps(expected, _dumps(expected)).correct

    dumps = _dumps(expected)
    dumps[0] = [[t, k, v + 1 if (t, k) == ("totals", first) else v] for t, k, v in dumps[0]]
    dumps[1] = [*dumps[1][1:], ["counts", "stranger", 1]]
    dumps[2] = None
    check = check_dumps(expected, dumps)
    assert (check.wrong, check.missing, check.extra, check.undumped_partitions) == (1, 1, 1, 1)
    assert not check.correct


def _status(
    active: list[int],
    tables: dict[int, str] | None = None,
    *,
    generation: int = 3,
    rebalancing: bool = False,
    others: dict[int, str] | None = None,
) -> dict[str, Any]:
    rows = [{"topic": "t", "partition": p, "role": "active"} for p in active]
    rows += [{"topic": "t", "partition": p, "role": r} for p, r in (others or {}).items()]
    return {
        "worker": {"generation": generation},
        "rebalance": {"in_progress": rebalancing},
        "partitions": rows,
        "tables": [{"table": "c", "partition": p, "role": r} for p, r in (tables or {}).items()],
    }


def test_one_worker_runs_every_task_only_when_every_table_partition_is_active() -> None:
    assert tasks_running(_status([0, 1], {0: "active", 1: "active"}), 2, 1)
    assert not tasks_running(_status([0, 1], {0: "active", 1: "restoring"}), 2, 1)
    assert not tasks_running(_status([0], {0: "active", 1: "active"}), 2, 1)


def test_a_group_is_settled_only_when_every_task_runs_exactly_once() -> None:
    wanted = {("t", 0), ("t", 1), ("t", 2)}
    good = [_status([0, 1], {0: "active", 1: "active", 2: "standby"}), _status([2], {2: "active"})]
    assert group_settled(good, wanted)
    unsettled: dict[str, list[dict[str, Any] | None]] = {
        "a worker does not answer": [good[0], None],
        "a partition is missing": [good[0], _status([])],
        "a partition runs twice": [good[0], _status([1, 2])],
        "a rebalance is under way": [good[0], _status([2], rebalancing=True)],
        "generations differ": [good[0], _status([2], generation=4)],
        "a table partition restores": [good[0], _status([2], {2: "restoring"})],
        "a table partition waits for its owner": [good[0], _status([2], {2: "pending"})],
        "a partition is being revoked": [good[0], _status([2], others={1: "revoking"})],
    }
    for why, statuses in unsettled.items():
        assert not group_settled(statuses, wanted), why


def test_the_logs_time_a_join_from_the_new_workers_server_to_the_last_rebalance_or_restore() -> (
    None
):
    newcomer = [
        "[2026-11-27 17:27:41,450] INFO streamjoin.status: status page and metrics on http://x/",
        "[2026-11-27 17:27:45,929] INFO streamjoin.membership: rebalance done: generation 61 "
        "(cooperative) in 0.446s: 2 partitions assigned, 0 revoked, 2 owned",
        "[2026-11-27 17:27:46,100] INFO streamjoin.state: restored counts[17]: 10 records in 0.01s",
    ]
    other = [
        "[2026-11-27 17:27:44,900] INFO streamjoin.membership: rebalance done: generation 60 (x)",
        "[2026-11-27 17:27:45,970] INFO streamjoin.membership: rebalance done: generation 61 (x)",
        "[2026-11-27 17:27:50,000] INFO streamjoin.membership: rebalance done: generation 610 (x)",
    ]
    assert log_time(newcomer[0]) is not None
    assert log_time("worker for app 'x' running") is None
    seconds = settle_from_logs(newcomer, [newcomer, other], 61)
    assert seconds is not None and abs(seconds - 4.65) < 1e-6
    assert settle_from_logs(newcomer[1:], [other], 61) is None  # no start in the logs
