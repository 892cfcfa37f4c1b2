"""Builders shared by the assignor tests (imported by module name, no conftest needed)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from streamjoin.assignor import (
    AssignmentResult,
    AssignorConfig,
    MemberState,
    Scenario,
    assign,
    validate_assignment,
)


def member(
    mid: str,
    topics: Iterable[str],
    *,
    capacity: int = 1,
    generation: int = -1,
    active: Mapping[str, Iterable[int]] | None = None,
    standby: Mapping[str, Iterable[int]] | None = None,
    state_lag: Mapping[str, Mapping[int, int]] | None = None,
    tags: Mapping[str, str] | None = None,
) -> MemberState:
    return MemberState(
        member_id=mid,
        topics=frozenset(topics),
        capacity=capacity,
        generation=generation,
        active={t: tuple(ps) for t, ps in (active or {}).items()},
        standby={t: tuple(ps) for t, ps in (standby or {}).items()},
        state_lag=state_lag or {},
        tags=tags or {},
    )


def scenario(
    topics: Mapping[str, int],
    members: Iterable[MemberState],
    *,
    copartition: Iterable[Iterable[str]] = (),
    changelogs: Iterable[str] = (),
    **config: Any,
) -> Scenario:
    return Scenario(
        topics=dict(topics),
        members=tuple(members),
        copartition=tuple(tuple(g) for g in copartition),
        changelog_topics=frozenset(changelogs),
        config=AssignorConfig(**config),
    )


def run(sc: Scenario) -> AssignmentResult:
    """Assign and check every rule; the tests then look at specifics."""
    result = assign(sc)
    validate_assignment(sc, result)
    return result


def active(result: AssignmentResult, mid: str, topic: str) -> set[int]:
    return set(result.assignments[mid].active.get(topic, ()))


def standby(result: AssignmentResult, mid: str, topic: str) -> set[int]:
    return set(result.assignments[mid].standby.get(topic, ()))


def counts(result: AssignmentResult, topic: str) -> dict[str, int]:
    return {mid: len(a.active.get(topic, ())) for mid, a in result.assignments.items()}


def following(sc: Scenario, result: AssignmentResult, generation: int) -> list[MemberState]:
    """Members reporting what they were just given (the next rebalance's input)."""
    out = []
    for m in sc.members:
        got = result.assignments[m.member_id]
        out.append(
            MemberState(
                member_id=m.member_id,
                topics=m.topics,
                capacity=m.capacity,
                generation=generation,
                active=got.active,
                standby=got.standby,
                state_lag=m.state_lag,
                tags=m.tags,
            )
        )
    return out
