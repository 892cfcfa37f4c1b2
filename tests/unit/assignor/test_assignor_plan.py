"""The JSON face (``plan``), its error messages, ``--explain`` and the ``streamjoin plan`` CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from streamjoin.assignor import next_round, plan, scenario_from_json
from streamjoin.assignor.plan import scenario_to_json
from streamjoin.cli import cli

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plans"

ISSUE_EXAMPLE: dict[str, Any] = {
    "topics": {"impressions": 10, "clicks": 10, "ads-joins-changelog": 10},
    "copartition": [["impressions", "clicks", "ads-joins-changelog"]],
    "changelog_topics": ["ads-joins-changelog"],
    "standby_replicas": 1,
    "acceptable_recovery_lag": 10000,
    "members": [
        {
            "id": "w1",
            "topics": ["impressions", "clicks", "ads-joins-changelog"],
            "capacity": 1,
            "generation": 7,
            "active": {"impressions": [0, 1], "clicks": [0, 1], "ads-joins-changelog": [0, 1]},
            "standby": {"ads-joins-changelog": [5]},
            "state_lag": {"ads-joins-changelog": {"5": 120, "9": 40000}},
            "tags": {"zone": "a"},
        },
        {"id": "w2", "topics": ["impressions", "clicks", "ads-joins-changelog"]},
    ],
}


def test_plan_on_the_issue_example() -> None:
    out = plan(ISSUE_EXAMPLE)
    assert set(out) == {"assignments", "unassigned", "warnings", "followup_rebalance", "stats"}
    w1 = out["assignments"]["w1"]
    assert {0, 1} <= set(w1["active"]["impressions"])
    assert w1["active"]["impressions"] == w1["active"]["clicks"]
    assert set(w1["standby"]) == {"ads-joins-changelog"}
    assert out["stats"]["tasks"] == 10
    assert out["stats"]["moved"] == out["stats"]["min_possible_moves"] == 0
    json.dumps(out)  # plain JSON types only


def test_defaults() -> None:
    sc = scenario_from_json({"topics": {"a": 2}, "members": [{"id": "m", "topics": ["a"]}]})
    (m,) = sc.members
    assert (m.capacity, m.generation, dict(m.active), dict(m.tags)) == (1, -1, {}, {})
    assert sc.config.standby_replicas == 0
    assert sc.config.acceptable_recovery_lag == 10_000
    assert sc.config.high_availability is False
    assert sc.copartition == () and sc.changelog_topics == frozenset()


def test_scenario_round_trip() -> None:
    doc = scenario_to_json(scenario_from_json(ISSUE_EXAMPLE))
    assert scenario_to_json(scenario_from_json(doc)) == doc
    assert plan(doc) == plan(ISSUE_EXAMPLE)


def test_next_round_is_a_fixed_point() -> None:
    first = plan(ISSUE_EXAMPLE)
    second = plan(next_round(ISSUE_EXAMPLE, first))
    assert second["stats"]["moved"] == 0
    assert second["assignments"] == first["assignments"]


def _broken(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(ISSUE_EXAMPLE)
    target: Any = doc
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is _DELETE:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("topics", _DELETE, "missing required field 'topics'"),
        ("members.0.id", _DELETE, r"members\[0\]: missing required field 'id'"),
        ("copartition", [["impressions", "nope"]], r"copartition\[0\]: unknown topic 'nope'"),
        ("members.0.capacity", -1, r"members\[0\]\.capacity: must be >= 1"),
        ("members.0.capacity", "2", r"members\[0\]\.capacity: must be an integer"),
        ("topics", {"a": -3}, r"topics\['a'\]: must be >= 0"),
        ("members.0.active", {"clicks": [10]}, "partition 10 out of range 0-9"),
        ("members.0.active", {"nope": [1]}, r"members\[0\]\.active: unknown topic 'nope'"),
        ("members.0.standby", {"clicks": [1]}, "'clicks' is not a changelog topic"),
        ("members.0.state_lag", {"ads-joins-changelog": {"x": 1}}, "partition key 'x'"),
        ("members.0.state_lag", {"ads-joins-changelog": {"1": -5}}, "must be >= 0"),
        ("members.1.id", "w1", "duplicate member id 'w1'"),
        ("standby_replica", 1, "unknown field 'standby_replica'"),
        ("standby_replicas", -1, "standby_replicas: must be >= 0"),
        ("high_availability", "yes", "must be true or false"),
        ("changelog_topics", ["ghost"], "changelog_topics: unknown topic 'ghost'"),
        ("members", {}, "members: must be a list"),
    ],
)
def test_malformed_input_names_the_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(_broken(path, value))


def test_unknown_subscription_is_only_a_warning() -> None:
    out = plan(_broken("members.1.topics", ["impressions", "clicks", "ads-joins-changelog", "x"]))
    assert any("'x'" in w for w in out["warnings"])


def test_cli_plan_on_a_file_and_on_stdin(tmp_path: Path) -> None:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(ISSUE_EXAMPLE))
    runner = CliRunner()
    from_file = runner.invoke(cli, ["plan", str(path)])
    assert from_file.exit_code == 0, from_file.output
    assert json.loads(from_file.output) == plan(ISSUE_EXAMPLE)
    from_stdin = runner.invoke(cli, ["plan", "-", "--indent", "0"], input=json.dumps(ISSUE_EXAMPLE))
    assert from_stdin.exit_code == 0, from_stdin.output
    assert json.loads(from_stdin.output) == plan(ISSUE_EXAMPLE)


def test_cli_explain_prints_a_table() -> None:
    runner = CliRunner()
    got = runner.invoke(cli, ["plan", "-", "--explain"], input=json.dumps(ISSUE_EXAMPLE))
    assert got.exit_code == 0, got.output
    table = got.stderr
    assert "w1" in table and "kept" in table and "G1" in table
    assert json.loads(got.stdout) == plan(ISSUE_EXAMPLE)


def test_cli_reports_bad_input() -> None:
    runner = CliRunner()
    got = runner.invoke(cli, ["plan", "-"], input="{not json")
    assert got.exit_code != 0 and "not valid JSON" in got.output
    got = runner.invoke(cli, ["plan", "-"], input=json.dumps({"topics": {}}))
    assert got.exit_code != 0 and "missing required field 'members'" in got.output


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.name)
def test_shipped_examples_plan_and_explain(path: Path) -> None:
    got = CliRunner().invoke(cli, ["plan", str(path), "--explain"])
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout)["assignments"]
    assert "active" in got.stderr
