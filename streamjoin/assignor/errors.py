"""Named errors of the assignor (pure).

Validation never relies on ``assert`` (``python -O`` strips it): every broken
input or postcondition raises one of these, so the runtime and tests can tell
"the scenario is malformed" from "an assignment broke a rule".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class AssignorError(Exception):
    """Base class of everything the assignor raises on purpose."""


class InvalidScenarioError(AssignorError, ValueError):
    """The scenario cannot be assigned: unknown topic in a group, duplicate member, ..."""


class ViolationCode(str, Enum):
    """Which rule an assignment breaks (see ``docs/assignor.md``)."""

    UNKNOWN_MEMBER = "unknown_member"
    MISSING_MEMBER = "missing_member"
    UNKNOWN_PARTITION = "unknown_partition"
    NOT_SUBSCRIBED = "not_subscribed"
    DUPLICATE_ACTIVE = "duplicate_active"
    MISSING_ACTIVE = "missing_active"
    SPLIT_TASK = "split_task"
    WRONG_UNASSIGNED = "wrong_unassigned"
    UNBALANCED = "unbalanced"
    NOT_MINIMAL = "not_minimal"
    WRONG_STATS = "wrong_stats"
    STANDBY_NOT_CHANGELOG = "standby_not_changelog"
    STANDBY_ON_ACTIVE = "standby_on_active"
    STANDBY_COUNT = "standby_count"
    STANDBY_UNBALANCED = "standby_unbalanced"
    STANDBY_TAG_SPREAD = "standby_tag_spread"


#: Violations that make an assignment unsafe to apply: a task processed twice or not at
#: all, a join's inputs split over members, a partition its member cannot consume (or that
#: does not exist), a standby restoring over its own active or from a source topic, or an
#: assignment that does not match the group's members. The others (balance, minimal
#: movement, standby count/balance/tag spread, the reported stats and unassigned list) make
#: it worse than promised, not wrong.
SAFETY_CODES: frozenset[ViolationCode] = frozenset(
    {
        ViolationCode.UNKNOWN_MEMBER,
        ViolationCode.MISSING_MEMBER,
        ViolationCode.UNKNOWN_PARTITION,
        ViolationCode.NOT_SUBSCRIBED,
        ViolationCode.DUPLICATE_ACTIVE,
        ViolationCode.MISSING_ACTIVE,
        ViolationCode.SPLIT_TASK,
        ViolationCode.STANDBY_NOT_CHANGELOG,
        ViolationCode.STANDBY_ON_ACTIVE,
    }
)


@dataclass(frozen=True)
class Violation:
    """One broken rule, with a message naming the member/topic/partition involved."""

    code: ViolationCode
    message: str

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"

    @property
    def unsafe(self) -> bool:
        """True for the violations of :data:`SAFETY_CODES`."""
        return self.code in SAFETY_CODES


class InvalidAssignmentError(AssignorError):
    """An assignment breaks at least one rule; ``violations`` lists them all."""

    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations: tuple[Violation, ...] = tuple(violations)
        shown = "\n  ".join(str(v) for v in self.violations[:20])
        more = len(self.violations) - 20
        suffix = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(f"{len(self.violations)} assignment violation(s):\n  {shown}{suffix}")

    @property
    def codes(self) -> frozenset[ViolationCode]:
        return frozenset(v.code for v in self.violations)
