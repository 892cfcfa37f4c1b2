"""The streamjoin partition assignor: co-partition groups, sticky balanced actives,
state-aware standbys. Pure and deterministic: no asyncio, no Kafka, no I/O.

``assign(Scenario) -> AssignmentResult`` is the typed entry point used by the
runtime; ``plan(dict) -> dict`` is the same on the JSON documents of
``docs/assignor.md``; ``validate_assignment`` checks every rule independently;
``fallback_assignment`` is the safe result the runtime sends when an assignment
breaks a rule of ``SAFETY_CODES``.
"""

from __future__ import annotations

from streamjoin.assignor.fallback import fallback_assignment
from streamjoin.assignor.model import (
    AssignmentResult,
    AssignmentStats,
    AssignorConfig,
    MemberAssignment,
    MemberState,
    Scenario,
)
from streamjoin.assignor.pipeline import assign
from streamjoin.assignor.plan import next_round, plan, result_to_json, scenario_from_json
from streamjoin.assignor.validate import find_violations, validate_assignment
from streamjoin.errors import SAFETY_CODES, Violation, ViolationCode

__all__ = [
    "SAFETY_CODES",
    "AssignmentResult",
    "AssignmentStats",
    "AssignorConfig",
    "MemberAssignment",
    "MemberState",
    "Scenario",
    "Violation",
    "ViolationCode",
    "assign",
    "fallback_assignment",
    "find_violations",
    "next_round",
    "plan",
    "result_to_json",
    "scenario_from_json",
    "validate_assignment",
]
