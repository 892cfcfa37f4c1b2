"""The status page's group view, its history of samples and its charts, without a broker."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

import pytest

import streamjoin
from streamjoin.runtime.group.group_info import GroupInfo, MemberInfo
from streamjoin.runtime.metrics import Histogram, WorkerCounters
from streamjoin.runtime.ops.charts import line_chart, nice_ceiling
from streamjoin.runtime.ops.group_view import group_view
from streamjoin.runtime.ops.history import History, Sample, capacity_for, sample_of
from streamjoin.runtime.ops.monitor import WorkerMonitor
from streamjoin.runtime.ops.status_page import render_status_page

#: orders and payments are co-partitioned; "totals" is the table of that task group
TOPIC_GROUPS = {
    "orders": "orders+payments",
    "payments": "orders+payments",
    "tot-cl": "orders+payments",
}


def member(member_id: str, **maps: Any) -> dict[str, Any]:
    return {
        "member_id": member_id,
        "instance_id": None,
        "client_id": f"client-{member_id}",
        "host": f"127.0.0.1:80{member_id[-1]}",
        "generation": 4,
        **{key: maps.get(key, {}) for key in ("active", "standby", "pending", "warmup")},
    }


def two_members() -> dict[str, Any]:
    return {
        "state": "Stable",
        "protocol": "streamjoin",
        "members": [
            member("m1", active={"orders": [0, 1], "payments": [0, 1]}, standby={"tot-cl": [2]}),
            member(
                "m2",
                active={"orders": [2], "payments": [2]},
                standby={"tot-cl": [0]},
                pending={"orders": [3], "payments": [3]},
                warmup={"tot-cl": [1]},
            ),
        ],
    }


def test_the_group_view_shows_who_holds_each_task_and_how() -> None:
    view = group_view(two_members(), TOPIC_GROUPS, self_member="m1", now=100.0)
    tasks = {t["task"]: t for t in view["tasks"]}
    assert list(tasks) == [f"orders+payments#{p}" for p in range(4)]
    assert tasks["orders+payments#0"]["active"] == ["m1"]
    assert tasks["orders+payments#0"]["standby"] == ["m2"]
    assert tasks["orders+payments#1"]["warmup"] == ["m2"]
    assert tasks["orders+payments#2"]["standby"] == ["m1"]
    # partition 3 is withheld from m2 until its owner revoked it: nobody owns it now
    assert tasks["orders+payments#3"] == {
        "task": "orders+payments#3",
        "group": "orders+payments",
        "partition": 3,
        "active": [],
        "standby": [],
        "warmup": [],
        "incoming": ["m2"],
        "moving": True,
    }
    assert not any(t["moving"] for t in view["tasks"][:3])
    by_id = {m["id"]: m for m in view["members"]}
    # two co-partitioned topics are one task, counted once
    assert by_id["m1"]["active_tasks"] == 2 and by_id["m1"]["standby_tasks"] == 1
    assert by_id["m1"]["self"] and not by_id["m2"]["self"]
    assert by_id["m2"]["name"] == "client-m2" and by_id["m2"]["host"] == "127.0.0.1:802"
    assert view["generation"] == 4 and view["state"] == "Stable"


def test_partitions_nobody_holds_are_tasks_moving() -> None:
    view = group_view(
        two_members(), TOPIC_GROUPS, self_member=None, now=1.0, partitions={"orders+payments": 6}
    )
    assert [t["partition"] for t in view["tasks"] if t["moving"]] == [3, 4, 5]


def test_a_member_that_left_stays_visible_for_a_while_then_goes() -> None:
    first = group_view(two_members(), TOPIC_GROUPS, self_member="m1", now=100.0)
    alone = {**two_members(), "members": two_members()["members"][:1]}
    second = group_view(alone, TOPIC_GROUPS, self_member="m1", now=110.0, previous=first)
    gone = [m for m in second["members"] if not m["alive"]]
    assert [m["id"] for m in gone] == ["m2"] and gone[0]["left_at"] == 110.0
    assert second["members"][0]["id"] == "m1"  # the live members first
    # partition 2 was m2's: now a task with no owner
    assert {t["partition"] for t in second["tasks"] if t["moving"]} == {2}
    later = group_view(alone, TOPIC_GROUPS, self_member="m1", now=200.0, previous=second)
    assert [m["left_at"] for m in later["members"] if not m["alive"]] == [110.0]
    much_later = group_view(
        alone, TOPIC_GROUPS, self_member="m1", now=800.0, previous=later, keep_left_seconds=600
    )
    assert [m["id"] for m in much_later["members"]] == ["m1"]


def test_the_history_is_a_bounded_ring_oldest_first() -> None:
    history = History(3)
    for at in range(5):
        history.add(Sample(float(at), 1.0, None, None, 0, 0.0))
    assert len(history) == 3 and history.capacity == 3
    assert [row["at"] for row in history.rows()] == [2.0, 3.0, 4.0]
    assert capacity_for(5.0) == 121  # ten minutes of five-second samples
    assert History(1).capacity == 2  # a line needs two points


def test_a_sample_has_the_rates_and_mean_commit_latency_since_the_previous_one() -> None:
    commits = Histogram((0.1,))
    before = {"commit_latency": commits.snapshot(), "restored_records": 100}
    commits.observe(0.010)
    commits.observe(0.030)
    snapshot = {
        "throughput": {"records_in_per_second": 12.5},
        "partitions": [{"lag": 3}, {"lag": None}, {"lag": 4}],
        "tables": [
            {"role": "restoring", "records_left": 50},
            {"role": "standby", "records_left": None},
            {"role": "restoring", "records_left": 7},
        ],
        "commit_latency": commits.snapshot(),
        "restored_records": 300,
    }
    sample = sample_of(snapshot, before, 4.0, at=1000.0)
    assert sample == Sample(1000.0, 12.5, 7, pytest.approx(20.0), 57, 50.0)
    first = sample_of(snapshot, None, 0.0, at=1000.0)
    assert first.commit_latency_ms is None and first.restored_per_second == 0.0
    idle = sample_of({**snapshot, "partitions": []}, snapshot, 4.0, at=1004.0)
    assert idle.commit_latency_ms is None and idle.lag is None  # no commit, no partition


@pytest.mark.parametrize(
    ("value", "ceiling"), [(0, 1.0), (0.3, 0.5), (1, 1.0), (7, 10.0), (180, 200.0), (2100, 2500.0)]
)
def test_the_y_axis_ends_on_a_round_number(value: float, ceiling: float) -> None:
    assert nice_ceiling(value) == pytest.approx(ceiling)


def test_a_chart_draws_its_points_with_axes_and_the_current_value() -> None:
    points: list[tuple[float, float | None]] = [
        (940.0, 5.0),
        (970.0, None),
        (980.0, 8.0),
        (1000.0, 12.0),
    ]
    svg = line_chart("c", "records in", "records/s", points, now=1000.0)
    assert 'data-points="3"' in svg
    assert "records in (records/s)" in svg and "12 records/s" in svg
    assert ">-60 s<" in svg and ">now<" in svg and ">20<" in svg  # time axis, y axis to 20
    # the gap splits the line: a lone point, then a line of two points
    assert len(re.findall(r"<polyline", svg)) == 1
    assert re.search(r'<polyline points="\S+ \S+"', svg)
    empty = line_chart("c", "lag", "records", [], now=1000.0)
    assert 'data-points="0"' in empty and "no data yet" in empty


def test_the_status_page_shows_the_group_grid_and_the_charts() -> None:
    group = group_view(two_members(), TOPIC_GROUPS, self_member="m1", now=100.0)
    group["members"][1]["name"] = "<b>m2</b>"
    history = [
        {"at": 90.0 + i, "records_in_per_second": 2.0 * i, "lag": i, "commit_latency_ms": None}
        for i in range(5)
    ]
    page = render_status_page(
        {"worker": {"web_url": "https://127.0.0.1:8001/"}, "group": group, "history": history},
        now=100.0,
    )
    cells = re.findall(r'data-task="([^"]+)" data-member="([^"]+)" data-role="(\w*)"', page)
    roles = {(task, who): role for task, who, role in cells}
    assert len(roles) == 8  # two members x four tasks
    assert roles[("orders+payments#0", "m1")] == "active"
    assert roles[("orders+payments#0", "m2")] == "standby"
    assert roles[("orders+payments#1", "m2")] == "warmup"
    assert roles[("orders+payments#3", "m2")] == "incoming"
    assert roles[("orders+payments#3", "m1")] == ""
    assert re.search(r'<th class="moving" data-task="orders\+payments#3"', page)
    assert '<a href="https://127.0.0.1:802/">127.0.0.1:802</a>' in page
    assert "&lt;b&gt;m2&lt;/b&gt;" in page and "<b>m2</b>" not in page
    assert 'id="chart-in" data-points="5"' in page
    assert 'id="chart-commit" data-points="0"' in page
    assert " src=" not in page


def test_the_status_page_says_when_the_group_is_not_described_yet() -> None:
    assert "the group has not been described yet" in render_status_page({}, now=0.0)


class _Worker:
    """Just enough of a worker for the monitor's group view."""

    def __init__(self) -> None:
        app = streamjoin.App("a")
        source = app.topic("orders", partitions=2)
        app.table("totals", default=int, copartitioned_with=source)

        @app.agent(source)
        async def count(stream: Any) -> None:
            async for _ in stream:
                pass

        self.topology = app.topology()
        self.counters = WorkerCounters()
        self.membership = SimpleNamespace(generation=3, member_id="m1")
        #: three partitions: the third is held by nobody
        self.link = SimpleNamespace(partitions={"orders": 3})


def test_the_monitor_keeps_the_last_view_when_describing_fails() -> None:
    worker = _Worker()
    changelog = worker.topology.tables["totals"].changelog.name
    answers: list[GroupInfo | Exception] = [
        GroupInfo(
            "a",
            "Stable",
            "streamjoin",
            (
                MemberInfo("m1", None, "h", 3, active={"orders": [0]}, standby={changelog: [1]}),
                MemberInfo("m2", None, "h", 3, active={"orders": [1]}, standby={changelog: [0]}),
            ),
        ),
        ConnectionError("broker down"),
    ]

    async def describe() -> GroupInfo:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monitor = WorkerMonitor(worker, describe=describe, web_port=0)  # type: ignore[arg-type]

    async def run() -> None:
        await monitor._describe_group("m1")
        assert monitor.group is not None
        tasks = {t["partition"]: t for t in monitor.group["tasks"]}
        assert tasks[0]["active"] == ["m1"] and tasks[0]["standby"] == ["m2"]
        assert tasks[1]["active"] == ["m2"] and tasks[1]["standby"] == ["m1"]
        assert [t["partition"] for t in monitor.group["tasks"] if t["moving"]] == [2]
        await monitor._describe_group("m1")
        assert monitor.group["error"] == "broker down"
        assert len(monitor.group["tasks"]) == 3

    asyncio.run(run())
