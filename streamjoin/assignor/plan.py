"""The JSON face of the assignor (pure): scenario documents in, result documents out.

``plan(doc)`` parses a scenario document (see ``docs/assignor.md``), runs
:func:`assign` and renders the result. Malformed input raises ``ValueError``
(:class:`InvalidScenarioError`) naming the offending field, e.g.
``members[2].active['clicks']: partition 12 out of range 0-9``. Unknown fields
are rejected too, so a typo such as ``standby_replica`` does not silently fall
back to a default. A member subscribing to a topic that is not in ``topics`` is
*not* an error (the runtime sees that while a topic is being created): it is
reported in ``warnings`` and the topic is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamjoin.assignor.explain import explain
from streamjoin.assignor.model import (
    AssignmentResult,
    AssignorConfig,
    MemberState,
    Scenario,
    TopicPartitions,
)
from streamjoin.assignor.pipeline import assign
from streamjoin.errors import InvalidScenarioError

_SCENARIO_FIELDS = frozenset(
    {
        "topics",
        "copartition",
        "changelog_topics",
        "standby_replicas",
        "acceptable_recovery_lag",
        "high_availability",
        "max_warmup_replicas",
        "members",
    }
)
#: the one type a list of plain integers holds
_INT = frozenset([int])
_MEMBER_FIELDS = frozenset(
    {
        "id",
        "topics",
        "capacity",
        "generation",
        "active",
        "standby",
        "state_lag",
        "tags",
        "host",
    }
)


def plan(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """Assign the scenario document and return the result document."""
    return result_to_json(assign(scenario_from_json(scenario)))


def plan_with_explanation(scenario: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """:func:`plan` plus the ``--explain`` table of the same result."""
    parsed = scenario_from_json(scenario)
    result = assign(parsed)
    return result_to_json(result), explain(parsed, result)


# ----------------------------------------------------------------------------------- parsing


def _fail(where: str, message: str) -> InvalidScenarioError:
    return InvalidScenarioError(f"{where}: {message}")


def _int(value: Any, where: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise _fail(where, f"must be >= {minimum}, got {value}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(where, f"must be a non-empty string, got {value!r}")
    return value


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, f"must be an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(where, f"must be a list, got {type(value).__name__}")
    return value


def _no_unknown(doc: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise _fail(where, f"unknown field {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _partitions(
    value: Any, where: str, topics: Mapping[str, int], only: frozenset[str] | None = None
) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    #: equal lists (co-partitioned topics) become one tuple, so later steps handle it once
    seen: dict[tuple[int, ...], tuple[int, ...]] = {}
    for topic, parts in _obj(value, where).items():
        here = f"{where}[{topic!r}]"
        if topic not in topics:
            raise _fail(where, f"unknown topic {topic!r}")
        if only is not None and topic not in only:
            raise _fail(where, f"{topic!r} is not a changelog topic")
        checked = _partition_list(_list(parts, here), here, topics[topic])
        out[topic] = seen.setdefault(checked, checked)
    return out


def _partition(value: Any, where: str, count: int) -> int:
    p = _int(value, where)
    if not 0 <= p < count:
        raise _fail(where, f"partition {p} out of range 0-{count - 1}")
    return p


def _all_ints(values: list[Any]) -> bool:
    """Plain ints only (no bools), checked at C speed: a scenario can list a million."""
    return set(map(type, values)) <= _INT


def _partition_list(parts: list[Any], where: str, count: int) -> tuple[int, ...]:
    """Partition numbers in range; element by element only to name a bad one."""
    if _all_ints(parts) and (not parts or (min(parts) >= 0 and max(parts) < count)):
        return tuple(parts)
    return tuple(_partition(p, where, count) for p in parts)


def _lags(per: Mapping[str, Any], where: str, count: int) -> dict[int, int]:
    """Partition (a decimal string key) -> lag; element by element only to name a bad one."""
    try:
        keys = list(map(int, per))
    except (TypeError, ValueError):
        keys = []
    lags = list(per.values())
    if (
        len(keys) == len(lags)
        and _all_ints(lags)
        and (not lags or min(lags) >= 0)
        and (not keys or (min(keys) >= 0 and max(keys) < count))
    ):
        return dict(zip(keys, lags, strict=True))
    out: dict[int, int] = {}
    for key, lag in per.items():
        try:
            p = int(key)
        except (TypeError, ValueError):
            raise _fail(where, f"partition key {key!r} is not an integer") from None
        _partition(p, where, count)
        out[p] = _int(lag, f"{where}[{key!r}]", 0)
    return out


def scenario_from_json(doc: Mapping[str, Any]) -> Scenario:
    """Parse and check a scenario document; errors name the offending field."""
    doc = _obj(doc, "scenario")
    _no_unknown(doc, _SCENARIO_FIELDS, "scenario")
    for required in ("topics", "members"):
        if required not in doc:
            raise _fail("scenario", f"missing required field {required!r}")
    topics: dict[str, int] = {}
    for topic, count in _obj(doc["topics"], "topics").items():
        topics[_str(topic, "topics")] = _int(count, f"topics[{topic!r}]", 0)
    copartition: list[tuple[str, ...]] = []
    for g, group in enumerate(_list(doc.get("copartition", []), "copartition")):
        where = f"copartition[{g}]"
        names = tuple(_str(t, where) for t in _list(group, where))
        if not names:
            raise _fail(where, "is empty")
        for t in names:
            if t not in topics:
                raise _fail(where, f"unknown topic {t!r}")
        copartition.append(names)
    changelogs: set[str] = set()
    for t in _list(doc.get("changelog_topics", []), "changelog_topics"):
        if _str(t, "changelog_topics") not in topics:
            raise _fail("changelog_topics", f"unknown topic {t!r}")
        changelogs.add(t)
    high_availability = doc.get("high_availability", False)
    if not isinstance(high_availability, bool):
        raise _fail("high_availability", f"must be true or false, got {high_availability!r}")
    config = AssignorConfig(
        standby_replicas=_int(doc.get("standby_replicas", 0), "standby_replicas", 0),
        acceptable_recovery_lag=_int(
            doc.get("acceptable_recovery_lag", 10_000), "acceptable_recovery_lag", 0
        ),
        high_availability=high_availability,
        max_warmup_replicas=_int(doc.get("max_warmup_replicas", 2), "max_warmup_replicas", 0),
    )
    members: list[MemberState] = []
    seen: set[str] = set()
    only = frozenset(changelogs)
    for n, raw in enumerate(_list(doc["members"], "members")):
        where = f"members[{n}]"
        m = _obj(raw, where)
        _no_unknown(m, _MEMBER_FIELDS, where)
        for required in ("id", "topics"):
            if required not in m:
                raise _fail(where, f"missing required field {required!r}")
        mid = _str(m["id"], f"{where}.id")
        if mid in seen:
            raise _fail(f"{where}.id", f"duplicate member id {mid!r}")
        seen.add(mid)
        subscribed = frozenset(_str(t, f"{where}.topics") for t in _list(m["topics"], where))
        lags: dict[str, dict[int, int]] = {}
        for topic, per in _obj(m.get("state_lag", {}), f"{where}.state_lag").items():
            here = f"{where}.state_lag[{topic!r}]"
            if topic not in topics:
                raise _fail(f"{where}.state_lag", f"unknown topic {topic!r}")
            if topic not in only:
                raise _fail(f"{where}.state_lag", f"{topic!r} is not a changelog topic")
            lags[topic] = _lags(_obj(per, here), here, topics[topic])
        tags = {
            _str(k, f"{where}.tags"): _str(v, f"{where}.tags[{k!r}]")
            for k, v in _obj(m.get("tags", {}), f"{where}.tags").items()
        }
        host = m.get("host")
        members.append(
            MemberState(
                member_id=mid,
                topics=subscribed,
                capacity=_int(m.get("capacity", 1), f"{where}.capacity", 1),
                generation=_int(m.get("generation", -1), f"{where}.generation"),
                active=_partitions(m.get("active", {}), f"{where}.active", topics),
                standby=_partitions(m.get("standby", {}), f"{where}.standby", topics, only),
                state_lag=lags,
                tags=tags,
                host=None if host is None else _str(host, f"{where}.host"),
            )
        )
    return Scenario(
        topics=topics,
        members=tuple(members),
        copartition=tuple(copartition),
        changelog_topics=frozenset(changelogs),
        config=config,
    )


# --------------------------------------------------------------------------------- rendering


def _parts_json(parts: TopicPartitions) -> dict[str, list[int]]:
    return {t: list(ps) for t, ps in sorted(parts.items())}


def scenario_to_json(scenario: Scenario) -> dict[str, Any]:
    """The canonical document of a scenario (every default spelled out, keys sorted)."""
    config = scenario.config
    return {
        "topics": dict(sorted(scenario.topics.items())),
        "copartition": [list(g) for g in scenario.copartition],
        "changelog_topics": sorted(scenario.changelog_topics),
        "standby_replicas": config.standby_replicas,
        "acceptable_recovery_lag": config.acceptable_recovery_lag,
        "high_availability": config.high_availability,
        "max_warmup_replicas": config.max_warmup_replicas,
        "members": [
            {
                "id": m.member_id,
                "topics": sorted(m.topics),
                "capacity": m.capacity,
                "generation": m.generation,
                "active": _parts_json(m.active),
                "standby": _parts_json(m.standby),
                "state_lag": {
                    t: {str(p): lag for p, lag in sorted(per.items())}
                    for t, per in sorted(m.state_lag.items())
                },
                "tags": dict(sorted(m.tags.items())),
                **({"host": m.host} if m.host is not None else {}),
            }
            for m in scenario.members
        ],
    }


def result_to_json(result: AssignmentResult) -> dict[str, Any]:
    """The result document: assignments per member (sorted), unassigned, warnings, stats."""
    assignments: dict[str, Any] = {}
    for mid, a in sorted(result.assignments.items()):
        entry: dict[str, Any] = {"active": _parts_json(a.active), "standby": _parts_json(a.standby)}
        if a.warmup:
            entry["warmup"] = _parts_json(a.warmup)
        assignments[mid] = entry
    stats = result.stats
    return {
        "assignments": assignments,
        "unassigned": _parts_json(result.unassigned),
        "warnings": list(result.warnings),
        "followup_rebalance": result.followup_rebalance,
        "stats": {
            "tasks": stats.tasks,
            "moved": stats.moved,
            "min_possible_moves": stats.min_possible_moves,
            "standby_tasks": stats.standby_tasks,
            **dict(sorted(stats.extra.items())),
        },
    }


def next_round(scenario: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario document of the next rebalance if nothing changes.

    Each member reports the active and standby sets it was just given, one
    generation later. Re-planning it must move nothing (a balanced assignment is
    a fixed point); handy for "what if" chains on the command line and in tests.
    """
    doc = scenario_to_json(scenario_from_json(scenario))
    assignments = _obj(result.get("assignments", {}), "result.assignments")
    generation = max((m["generation"] for m in doc["members"]), default=-1) + 1
    for m in doc["members"]:
        given = _obj(assignments.get(m["id"], {}), f"result.assignments[{m['id']!r}]")
        m["active"] = dict(given.get("active", {}))
        m["standby"] = dict(given.get("standby", {}))
        m["generation"] = generation
    return doc
