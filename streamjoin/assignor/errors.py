"""Named errors of the assignor (pure).

Validation never relies on ``assert`` (``python -O`` strips it): every broken
input or postcondition raises one of these, so the runtime and tests can tell
"the scenario is malformed" from "an assignment broke a rule". They are defined
in :mod:`streamjoin.errors` with every other streamjoin error.
"""

from __future__ import annotations

from streamjoin.errors import (
    SAFETY_CODES,
    AssignorError,
    InvalidAssignmentError,
    InvalidScenarioError,
    Violation,
    ViolationCode,
)

__all__ = [
    "SAFETY_CODES",
    "AssignorError",
    "InvalidAssignmentError",
    "InvalidScenarioError",
    "Violation",
    "ViolationCode",
]
