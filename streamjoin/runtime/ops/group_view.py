"""The whole group as the status page shows it: members, and who holds each task (pure).

Input is one description of the consumer group (``DescribeGroups`` with our
userdata decoded, as plain dicts: see ``runtime/group/group_info.py``), which any
member can ask the coordinator for: the leader's decision reaches every member in
its own assignment, and the coordinator hands all of them out. A *task* is one
partition of one co-partition group (``Topology.task_groups``); each member's
partitions are mapped to tasks through ``topic_groups`` (topic -> group label).

Members that were in the previous view but are gone from this one are kept for a
while, marked not alive, so that a worker that just died stays visible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["KEEP_LEFT_SECONDS", "group_view", "member_name"]

#: how long a member that left stays on the page
KEEP_LEFT_SECONDS = 600.0

#: a member's partition maps, by the role the status page gives them
_ROLES = (
    ("active", "active"),
    ("standby", "standby"),
    ("warmup", "warmup"),
    ("incoming", "pending"),
)


def member_name(member: Mapping[str, Any]) -> str:
    """What a member is called: its instance id, else its client id, else its member id."""
    return str(member.get("instance_id") or member.get("client_id") or member.get("member_id"))


def group_view(
    description: Mapping[str, Any],
    topic_groups: Mapping[str, str],
    *,
    self_member: str | None,
    now: float,
    previous: Mapping[str, Any] | None = None,
    partitions: Mapping[str, int] | None = None,
    keep_left_seconds: float = KEEP_LEFT_SECONDS,
) -> dict[str, Any]:
    """The view of ``description`` (``state``, ``protocol``, ``members``; each member has
    ``member_id``, ``instance_id``, ``client_id``, ``host``, ``generation`` and the
    topic -> partitions maps ``active``, ``standby``, ``pending``, ``warmup``).
    ``partitions`` (group label -> partition count) lists tasks nobody holds too."""
    members_in = list(description.get("members") or ())
    tasks: dict[tuple[str, int], dict[str, list[str]]] = {}
    members: list[dict[str, Any]] = []
    for member in members_in:
        member_id = str(member["member_id"])
        held: dict[str, set[tuple[str, int]]] = {role: set() for role, _ in _ROLES}
        for role, key in _ROLES:
            for topic, held_partitions in (member.get(key) or {}).items():
                group = topic_groups.get(topic)
                if group is None:
                    continue
                for partition in held_partitions:
                    task = (group, int(partition))
                    holders = tasks.setdefault(task, {r: [] for r, _ in _ROLES})
                    if task not in held[role]:
                        holders[role].append(member_id)
                        held[role].add(task)
        members.append(
            {
                "id": member_id,
                "name": member_name(member),
                "instance_id": member.get("instance_id"),
                "client_id": member.get("client_id"),
                "host": member.get("host"),
                "generation": member.get("generation", -1),
                "alive": True,
                "self": member_id == self_member,
                "left_at": None,
                **{f"{role}_tasks": len(found) for role, found in held.items()},
            }
        )
    present = {m["id"] for m in members}
    for old in (previous or {}).get("members") or ():
        if old["id"] in present:
            continue
        left_at = old.get("left_at") or now
        if now - left_at <= keep_left_seconds:
            members.append({**old, "alive": False, "self": False, "left_at": left_at})
    members.sort(key=lambda m: (not m["alive"], m["name"], m["id"]))
    return {
        "state": description.get("state"),
        "protocol": description.get("protocol"),
        "generation": max((m["generation"] for m in members if m["alive"]), default=-1),
        "described_at": now,
        "error": None,
        "members": members,
        "tasks": _task_rows(tasks, topic_groups, partitions or {}),
    }


def _task_rows(
    tasks: Mapping[tuple[str, int], Mapping[str, Sequence[str]]],
    topic_groups: Mapping[str, str],
    partitions: Mapping[str, int],
) -> list[dict[str, Any]]:
    """Every task of every group: its partitions as counted, and any held beyond; a
    partition nobody holds is a task moving."""
    highest = {group: count - 1 for group, count in partitions.items()}
    for group, partition in tasks:
        highest[group] = max(highest.get(group, -1), partition)
    rows = []
    for group in sorted(set(topic_groups.values())):
        for partition in range(highest.get(group, -1) + 1):
            holders = tasks.get((group, partition), {})
            active = sorted(holders.get("active", ()))
            rows.append(
                {
                    "task": f"{group}#{partition}",
                    "group": group,
                    "partition": partition,
                    "active": active,
                    "standby": sorted(holders.get("standby", ())),
                    "warmup": sorted(holders.get("warmup", ())),
                    "incoming": sorted(holders.get("incoming", ())),
                    "moving": not active,
                }
            )
    return rows
