"""Table-table join transitions: when a row appears, changes, disappears or stays put."""

from __future__ import annotations

import pytest

from streamjoin.errors import ConfigurationError, JoinError
from streamjoin.joins.core import How, TableJoinChange, TableTableJoin

K = b"k"


def test_inner_row_needs_both_sides() -> None:
    join = TableTableJoin("inner")
    assert join.update(K, "left", b"l1", left=None, right=None) is None
    assert join.update(K, "right", b"r1", left=b"l1", right=None) == TableJoinChange(
        K, b"l1", b"r1"
    )
    assert join.update(K, "left", b"l2", left=b"l1", right=b"r1") == TableJoinChange(
        K, b"l2", b"r1"
    )
    # the row disappears: tombstone
    assert join.update(K, "right", None, left=b"l2", right=b"r1") == TableJoinChange(
        K, b"l2", None, deleted=True
    )
    # deleting the remaining side of a row that no longer exists: nothing to say
    assert join.update(K, "left", None, left=b"l2", right=None) is None


def test_left_row_follows_the_left_side() -> None:
    join = TableTableJoin("left")
    assert join.update(K, "right", b"r1", left=None, right=None) is None
    assert join.update(K, "left", b"l1", left=None, right=b"r1") == TableJoinChange(K, b"l1", b"r1")
    assert join.update(K, "right", None, left=b"l1", right=b"r1") == TableJoinChange(K, b"l1", None)
    assert join.update(K, "left", None, left=b"l1", right=None) == TableJoinChange(
        K, None, None, deleted=True
    )


def test_outer_row_exists_while_either_side_does() -> None:
    join = TableTableJoin("outer")
    assert join.update(K, "right", b"r1", left=None, right=None) == TableJoinChange(K, None, b"r1")
    assert join.update(K, "left", b"l1", left=None, right=b"r1") == TableJoinChange(K, b"l1", b"r1")
    assert join.update(K, "right", None, left=b"l1", right=b"r1") == TableJoinChange(K, b"l1", None)
    assert join.update(K, "left", None, left=b"l1", right=None) == TableJoinChange(
        K, None, None, deleted=True
    )


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_rewriting_the_same_value_changes_nothing(how: How) -> None:
    join = TableTableJoin(how)
    assert join.update(K, "left", b"l", left=b"l", right=b"r") is None
    assert join.update(K, "right", b"r", left=b"l", right=b"r") is None


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_deleting_what_was_never_there_changes_nothing(how: How) -> None:
    assert TableTableJoin(how).update(K, "left", None, left=None, right=None) is None


@pytest.mark.parametrize(
    ("how", "rows"),
    [
        ("inner", [False, False, False, True]),
        ("left", [False, False, True, True]),
        ("outer", [False, True, True, True]),
    ],
)
def test_has_row(how: How, rows: list[bool]) -> None:
    join = TableTableJoin(how)
    sides = [(None, None), (None, b"r"), (b"l", None), (b"l", b"r")]
    assert [join.has_row(left, right) for left, right in sides] == rows


def test_invalid_how_and_side_are_rejected() -> None:
    with pytest.raises(ConfigurationError, match="how must be"):
        TableTableJoin("right")  # type: ignore[arg-type]
    with pytest.raises(JoinError, match="side must be"):
        TableTableJoin().update(K, "middle", b"v", left=None, right=None)  # type: ignore[arg-type]
