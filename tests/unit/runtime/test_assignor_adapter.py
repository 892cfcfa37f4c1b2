"""The aiokafka assignor adapter's decisions, without a broker.

Cluster metadata is a real ``aiokafka`` ``ClusterMetadata`` fed a metadata
response; members are real ``ConsumerProtocolMemberMetadata`` carrying our
encoded userdata, and the adapter's assignments are decoded as a member would.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.protocol.metadata import MetadataResponse_v0

from streamjoin.assignor import (
    AssignmentResult,
    AssignmentStats,
    AssignorConfig,
    MemberAssignment,
    Scenario,
    ViolationCode,
    find_violations,
)
from streamjoin.assignor.model import MemberState
from streamjoin.assignor.protocol import (
    ASSIGNMENT_KIND,
    MAGIC,
    SUBSCRIPTION_KIND,
    AssignmentUserdata,
    SubscriptionUserdata,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from streamjoin.errors import InvalidAssignmentError
from streamjoin.runtime.group import assignor_adapter
from streamjoin.runtime.group.assignor_adapter import (
    StreamjoinAssignor,
    build_scenario,
    compute_assignment,
    kafka_assignment,
    known_partitions,
    read_membership,
    read_subscription,
    resolve_member_ids,
)
from streamjoin.runtime.group.membership import EAGER_PROTOCOL

JOIN = ["clicks", "impressions"]
CHANGELOG = "app-join-changelog"
LOGGER = "streamjoin.assignor"


def cluster(**topics: int) -> ClusterMetadata:
    """Cluster metadata knowing ``topics`` (name -> partitions), as a broker would send it."""
    out = ClusterMetadata(metadata_max_age_ms=60_000)
    out.update_metadata(
        MetadataResponse_v0(
            [(0, "localhost", 9092)],
            [(0, t, [(0, p, 0, [0], [0]) for p in range(n)]) for t, n in topics.items()],
        )
    )
    return out


def meta(
    topics: Sequence[str], userdata: SubscriptionUserdata | bytes
) -> ConsumerProtocolMemberMetadata:
    data = userdata if isinstance(userdata, bytes) else encode_subscription(userdata)
    return ConsumerProtocolMemberMetadata(0, sorted(topics), data)


def join_assignor(**kwargs: object) -> StreamjoinAssignor:
    return StreamjoinAssignor(
        copartition=[[*JOIN, CHANGELOG]],
        changelog_topics=[CHANGELOG],
        **kwargs,  # type: ignore[arg-type]
    )


def eager(
    assignor: StreamjoinAssignor,
    cluster: ClusterMetadata,
    members: Mapping[str, ConsumerProtocolMemberMetadata],
) -> dict[str, ConsumerProtocolMemberAssignment]:
    """The leader's eager assignment, partition counts from ``cluster`` as the leader reads
    them."""
    topics = {t for m in members.values() for t in m.subscription}
    return assignor.assign_members(known_partitions(cluster, topics), members, cooperative=False)


def consumed(out: Mapping[str, ConsumerProtocolMemberAssignment]) -> dict[str, dict[str, set[int]]]:
    return {k: {t: set(ps) for t, ps in a.assignment} for k, a in out.items()}


def owners(out: Mapping[str, ConsumerProtocolMemberAssignment], topic: str) -> list[str]:
    """Per partition of ``topic``, the Kafka member ids it is assigned to (sorted)."""
    found: dict[int, list[str]] = {}
    for kafka_id, a in sorted(out.items()):
        for t, ps in a.assignment:
            if t == topic:
                for p in ps:
                    found.setdefault(p, []).append(kafka_id)
    return [",".join(found.get(p, [])) for p in range(max(found, default=-1) + 1)]


SUBSCRIBED = [*JOIN, CHANGELOG]
CLUSTER = {"clicks": 4, "impressions": 4, CHANGELOG: 4}


# --------------------------------------------------------------------------- leader: userdata


def test_readable_userdata_is_decoded() -> None:
    sent = SubscriptionUserdata(generation=3, active={"clicks": (1,)}, capacity=2)
    assert read_subscription("k1", encode_subscription(sent)) == sent


@pytest.mark.parametrize(
    ("data", "logged"),
    [
        (b"", "unreadable userdata"),
        (b"garbage!", "unreadable userdata"),
        (MAGIC + bytes((SUBSCRIPTION_KIND, 1, 0, 0)) + b"\xff", "unreadable userdata"),
        (MAGIC + bytes((ASSIGNMENT_KIND, 1, 0, 0)), "unreadable userdata"),
        (
            MAGIC + bytes((SUBSCRIPTION_KIND, 9, 0, 0)) + b"future",
            "incompatible streamjoin version",
        ),
    ],
)
def test_unreadable_userdata_makes_a_new_member(
    data: bytes, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, LOGGER):
        assert read_subscription("k1", data) == SubscriptionUserdata()
    assert logged in caplog.text
    assert "k1" in caplog.text


def test_a_member_with_unreadable_userdata_still_gets_work(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owned = {"clicks": (0, 1, 2, 3), "impressions": (0, 1, 2, 3), CHANGELOG: (0, 1, 2, 3)}
    members = {
        "k1": meta(SUBSCRIBED, SubscriptionUserdata(generation=4, active=owned)),
        "k2": meta(SUBSCRIBED, b"\x00not ours"),
    }
    with caplog.at_level(logging.WARNING, LOGGER):
        out = eager(join_assignor(), cluster(**CLUSTER), members)
    got = consumed(out)
    assert len(got["k2"]["clicks"]) == 2  # balanced: it claims nothing, but takes its share
    assert got["k1"]["clicks"] < set(owned["clicks"])  # k1 keeps the rest of what it owned
    assert "member k2 sent unreadable userdata" in caplog.text
    assert decode_assignment(out["k2"].user_data).generation == 5  # the new epoch still fences


# --------------------------------------------------------------------------- leader: member ids


def test_members_are_known_by_instance_id_else_kafka_id() -> None:
    assert resolve_member_ids([("k2", None), ("k1", "worker-1")]) == {"worker-1": "k1", "k2": "k2"}


def test_a_duplicate_instance_id_falls_back_to_the_kafka_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, LOGGER):
        ids = resolve_member_ids([("k2", "worker"), ("k1", "worker"), ("k3", None)])
    assert ids == {"worker": "k1", "k2": "k2", "k3": "k3"}
    assert "k1 and k2 both report group_instance_id 'worker'" in caplog.text


def test_an_instance_id_equal_to_another_kafka_id_does_not_collide() -> None:
    ids = resolve_member_ids([("a", "b"), ("b", None), ("c", "b")])
    assert ids == {"b": "a", "b#1": "b", "c": "c"}
    assert sorted(ids.values()) == ["a", "b", "c"]


def test_duplicate_instance_ids_both_get_their_own_work() -> None:
    members = {
        k: meta(SUBSCRIBED, SubscriptionUserdata(group_instance_id="same")) for k in ("k1", "k2")
    }
    out = eager(join_assignor(), cluster(**CLUSTER), members)
    got = consumed(out)
    assert set(out) == {"k1", "k2"}
    assert got["k1"]["clicks"] and got["k2"]["clicks"]
    assert got["k1"]["clicks"].isdisjoint(got["k2"]["clicks"])


# --------------------------------------------------------------------------- leader: topics


def test_only_topics_the_cluster_knows_count() -> None:
    known = known_partitions(cluster(a=3, b=2), ["a", "b", "ghost", "a"])
    assert known == {"a": 3, "b": 2}


def test_unknown_topics_are_left_out_and_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    state = MemberState(
        "m1",
        frozenset({"a", "ghost"}),
        active={"a": (0,), "ghost": (0,)},
        state_lag={"ghost": {0: 1}},
    )
    with caplog.at_level(logging.WARNING, LOGGER):
        sc = build_scenario(
            [state], {"a": 1}, [("a", "ghost")], frozenset({"ghost"}), AssignorConfig()
        )
    member = sc.members[0]
    assert (member.topics, dict(member.active), dict(member.state_lag)) == (
        frozenset({"a"}),
        {"a": (0,)},
        {},
    )
    assert sc.copartition == (("a",),)
    assert sc.changelog_topics == frozenset()
    assert "unknown to the cluster metadata until they exist: ghost" in caplog.text


def test_a_join_stays_co_partitioned_while_its_changelog_does_not_exist() -> None:
    # The changelog is not created yet: clicks and impressions must still move together,
    # even when what the members report would pull them apart if they were independent.
    members = {
        "k1": meta(SUBSCRIBED, SubscriptionUserdata(1, {"clicks": (0, 1), "impressions": (2, 3)})),
        "k2": meta(SUBSCRIBED, SubscriptionUserdata(1, {"clicks": (2, 3), "impressions": (0, 1)})),
    }
    out = eager(join_assignor(), cluster(clicks=4, impressions=4), members)
    for parts in consumed(out).values():
        assert parts["clicks"] == parts["impressions"]


# --------------------------------------------------------------------------- leader: output


def test_changelogs_are_restored_not_consumed_and_standbys_travel_in_userdata() -> None:
    assignor = join_assignor(config=AssignorConfig(standby_replicas=1))
    members = {
        "k1": meta(SUBSCRIBED, SubscriptionUserdata(generation=2)),
        "k2": meta(SUBSCRIBED, SubscriptionUserdata(generation=6)),
    }
    out = eager(assignor, cluster(**CLUSTER), members)
    for kafka_id, a in out.items():
        topics = {t for t, _ in a.assignment}
        assert topics == set(JOIN), kafka_id
        userdata = decode_assignment(a.user_data)
        assert userdata.generation == 7
        active = {p for t, ps in a.assignment if t == "clicks" for p in ps}
        # the standbys are the other member's tasks, of the changelog only
        assert userdata.standby == {CHANGELOG: tuple(sorted(set(range(4)) - active))}


def test_the_kafka_assignment_drops_changelog_topics() -> None:
    active = {"a": (0, 1), CHANGELOG: (0, 1), "b": (2,)}
    assert kafka_assignment(active, [CHANGELOG]) == [("a", [0, 1]), ("b", [2])]


def test_a_member_the_result_forgot_gets_an_empty_assignment() -> None:
    result = AssignmentResult({}, {}, (), False, _stats())
    a = assignor_adapter.member_assignment(result, "m9", 3, [CHANGELOG])
    assert a.assignment == []
    assert decode_assignment(a.user_data) == AssignmentUserdata(generation=3)


def _stats() -> AssignmentStats:
    return AssignmentStats(tasks=0, moved=0, min_possible_moves=0)


# --------------------------------------------------------------------------- member side


def assignment(
    active: Mapping[str, Sequence[int]], userdata: AssignmentUserdata | bytes
) -> ConsumerProtocolMemberAssignment:
    data = userdata if isinstance(userdata, bytes) else encode_assignment(userdata)
    return ConsumerProtocolMemberAssignment(0, [(t, list(ps)) for t, ps in active.items()], data)


def test_on_assignment_remembers_and_saves_and_a_restart_claims_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "membership.json"
    worker = join_assignor(membership_file=path)
    assert (worker.generation, worker.active, worker.standby) == (-1, {}, {})
    worker.on_assignment(
        assignment(
            {"clicks": [3, 1], "impressions": [1, 3]},
            AssignmentUserdata(generation=8, standby={CHANGELOG: (0,)}, followup_rebalance=True),
        )
    )
    assert worker.generation == 8
    assert worker.active == {"clicks": (1, 3), "impressions": (1, 3)}
    assert worker.standby == {CHANGELOG: (0,)}
    assert worker.followup_rebalance
    assert json.loads(path.read_text()) == {
        "generation": 8,
        "active": {"clicks": [1, 3], "impressions": [1, 3]},
        "standby": {CHANGELOG: [0]},
    }
    restarted = join_assignor(membership_file=path)
    assert (restarted.generation, restarted.active, restarted.standby) == (
        8,
        {"clicks": (1, 3), "impressions": (1, 3)},
        {CHANGELOG: (0,)},
    )
    claimed = decode_subscription(restarted.metadata(JOIN).user_data)
    assert (claimed.generation, claimed.active, claimed.standby) == (
        8,
        worker.active,
        worker.standby,
    )


def test_a_new_epoch_replaces_the_old_one(tmp_path: Path) -> None:
    worker = join_assignor(membership_file=tmp_path / "m.json")
    worker.on_assignment(assignment({"clicks": [0]}, AssignmentUserdata(1, {CHANGELOG: (2,)})))
    worker.on_assignment(assignment({"clicks": [2]}, AssignmentUserdata(2)))
    assert (worker.generation, worker.active, worker.standby) == (2, {"clicks": (2,)}, {})
    assert not worker.followup_rebalance
    saved = read_membership(tmp_path / "m.json")
    assert saved is not None and saved.generation == 2 and dict(saved.standby) == {}


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        '{"generation": 3}',
        '{"generation": "x", "active": {}, "standby": {}}',
        '{"generation": 3, "active": {"a": [0, "x"]}, "standby": {}}',
        '{"generation": 3, "active": [], "standby": {}}',
    ],
)
def test_a_corrupt_membership_file_is_ignored_with_a_warning(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "membership.json"
    path.write_text(content)
    with caplog.at_level(logging.WARNING, LOGGER):
        worker = join_assignor(membership_file=path)
    assert (worker.generation, worker.active, worker.standby) == (-1, {}, {})
    assert f"ignoring unreadable {path}" in caplog.text


def test_an_unwritable_membership_file_is_only_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    worker = join_assignor(membership_file=blocker / "membership.json")  # parent is a file
    with caplog.at_level(logging.WARNING, LOGGER):
        worker.on_assignment(assignment({"clicks": [0]}, AssignmentUserdata(1)))
    assert worker.generation == 1
    assert "could not save" in caplog.text


def test_unreadable_assignment_userdata_keeps_the_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "membership.json"
    worker = join_assignor(membership_file=path)
    worker.on_assignment(assignment({"clicks": [0]}, AssignmentUserdata(4, {CHANGELOG: (1,)})))
    with caplog.at_level(logging.ERROR, LOGGER):
        worker.on_assignment(assignment({"clicks": [2]}, b"junk"))
    assert worker.active == {"clicks": (2,)}  # what Kafka assigned is what it consumes
    assert (worker.generation, worker.standby) == (4, {CHANGELOG: (1,)})
    assert "ignoring unreadable assignment userdata" in caplog.text
    saved = read_membership(path)
    assert saved is not None and saved.generation == 4 and dict(saved.active) == {"clicks": (0,)}


def test_metadata_reports_lags_capacity_tags_host_and_instance_id() -> None:
    worker = join_assignor(
        capacity=3,
        tags={"zone": "b"},
        host="10.0.0.7:6066",
        group_instance_id="worker-7",
        lag_provider=lambda: {CHANGELOG: {1: 0, 3: 250}},
    )
    worker.on_assignment(assignment({"clicks": [1]}, AssignmentUserdata(5, {CHANGELOG: (3,)})))
    sent = worker.metadata(["impressions", "clicks"])
    assert sent.version == assignor_adapter.CONSUMER_PROTOCOL_VERSION
    assert sent.subscription == sorted([*JOIN, CHANGELOG])  # eligible for the whole group
    assert decode_subscription(sent.user_data) == SubscriptionUserdata(
        generation=5,
        active={"clicks": (1,)},
        standby={CHANGELOG: (3,)},
        state_lag={CHANGELOG: {1: 0, 3: 250}},
        capacity=3,
        tags={"zone": "b"},
        host="10.0.0.7:6066",
        group_instance_id="worker-7",
    )
    assert EAGER_PROTOCOL == "streamjoin"  # what earlier versions offer: upgrades need it


# --------------------------------------------------------------------------- validation


def previous_owners(**owned: Sequence[int]) -> dict[str, ConsumerProtocolMemberMetadata]:
    return {
        k: meta(
            SUBSCRIBED,
            SubscriptionUserdata(generation=1, active={t: tuple(ps) for t in SUBSCRIBED}),
        )
        for k, ps in owned.items()
    }


def test_every_assignment_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Scenario, AssignmentResult]] = []

    def spy(scenario: Scenario, result: AssignmentResult) -> list[object]:
        seen.append((scenario, result))
        return find_violations(scenario, result)  # type: ignore[return-value]

    monkeypatch.setattr(assignor_adapter, "find_violations", spy)
    assignor = join_assignor()
    for _ in range(2):
        eager(assignor, cluster(**CLUSTER), previous_owners(k1=[0, 1], k2=[2, 3]))
    assert len(seen) == 2


def test_an_unsafe_result_is_caught_and_the_fallback_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(scenario: Scenario) -> AssignmentResult:
        """Every task active on both members (and split: clicks only)."""
        everything = MemberAssignment(active={"clicks": (0, 1, 2, 3)}, standby={})
        return AssignmentResult(
            assignments={m.member_id: everything for m in scenario.members},
            unassigned={},
            warnings=(),
            followup_rebalance=False,
            stats=_stats(),
        )

    monkeypatch.setattr(assignor_adapter, "assign", broken)
    with caplog.at_level(logging.ERROR, LOGGER):
        out = eager(join_assignor(), cluster(**CLUSTER), previous_owners(k1=[0, 1, 2], k2=[3]))
    assert "breaks rule duplicate_active (unsafe)" in caplog.text
    assert "breaks rule split_task (unsafe)" in caplog.text
    assert "sending the fallback assignment" in caplog.text
    # the fallback: one owner per task, joins together, previous owners keep their tasks
    assert owners(out, "clicks") == owners(out, "impressions") == ["k1", "k1", "k1", "k2"]
    assert {t for a in out.values() for t, _ in a.assignment} == set(JOIN)


def test_a_result_that_is_only_worse_than_promised_is_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = assignor_adapter.assign

    def lopsided(scenario: Scenario) -> AssignmentResult:
        """Valid ownership, but everything on the first member: unbalanced, not minimal."""
        result = real(scenario)
        first, *rest = sorted(result.assignments)
        every = {t: (0, 1, 2, 3) for t in SUBSCRIBED}
        return replace(
            result,
            assignments={first: MemberAssignment(every, {})}
            | {m: MemberAssignment({}, {}) for m in rest},
        )

    monkeypatch.setattr(assignor_adapter, "assign", lopsided)
    with caplog.at_level(logging.ERROR, LOGGER):
        out = eager(join_assignor(), cluster(**CLUSTER), previous_owners(k1=[0, 1], k2=[2, 3]))
    assert owners(out, "clicks") == ["k1"] * 4
    assert "breaks rule unbalanced:" in caplog.text
    assert "sending the assignment for epoch 2 anyway" in caplog.text
    assert "fallback" not in caplog.text


def test_an_assignor_that_raises_falls_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def crash(scenario: Scenario) -> AssignmentResult:
        raise RuntimeError("bug")

    monkeypatch.setattr(assignor_adapter, "assign", crash)
    with caplog.at_level(logging.ERROR, LOGGER):
        out = eager(join_assignor(), cluster(**CLUSTER), previous_owners(k1=[0, 1], k2=[2, 3]))
    assert owners(out, "clicks") == ["k1", "k1", "k2", "k2"]
    assert "assignor failed for epoch 2: RuntimeError('bug')" in caplog.text


def test_nothing_is_sent_when_even_the_fallback_is_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(scenario: Scenario) -> AssignmentResult:
        nothing = {m.member_id: MemberAssignment({}, {}) for m in scenario.members}
        return AssignmentResult(nothing, {}, (), False, _stats())

    monkeypatch.setattr(assignor_adapter, "assign", broken)
    monkeypatch.setattr(assignor_adapter, "fallback_assignment", broken)
    with pytest.raises(InvalidAssignmentError) as info:
        eager(join_assignor(), cluster(**CLUSTER), previous_owners(k1=[0, 1], k2=[2, 3]))
    assert ViolationCode.MISSING_ACTIVE in info.value.codes


def test_a_valid_result_is_sent_untouched() -> None:
    sc = build_scenario(
        [MemberState("m1", frozenset(SUBSCRIBED)), MemberState("m2", frozenset(SUBSCRIBED))],
        CLUSTER,
        [SUBSCRIBED],
        frozenset({CHANGELOG}),
        AssignorConfig(standby_replicas=1),
    )
    vetted = compute_assignment(sc)
    assert (vetted.violations, vetted.error, vetted.fallback) == ((), None, False)
    assert vetted.result == assignor_adapter.assign(sc)


# --------------------------------------------------------------------------- cooperative


def test_the_cooperative_leader_withholds_what_another_member_still_owns() -> None:
    leader = join_assignor()
    everything = {t: (0, 1, 2, 3) for t in SUBSCRIBED}
    members = {
        "k1": meta(
            SUBSCRIBED,
            SubscriptionUserdata(
                generation=5, active=everything, owned=dict.fromkeys(JOIN, (0, 1, 2, 3))
            ),
        ),
        "k2": meta(SUBSCRIBED, SubscriptionUserdata()),
    }
    counts = dict(CLUSTER)
    out = leader.assign_members(counts, members, cooperative=True)
    assert consumed(out)["k2"] == {}  # nothing moves while k1 still processes it
    pending = decode_assignment(out["k2"].user_data).pending
    kept = consumed(out)["k1"]["clicks"]
    assert set(pending["clicks"]) == {0, 1, 2, 3} - kept
    assert set(pending[CHANGELOG]) == set(pending["clicks"])  # warmed up meanwhile
    # eager: k1 revoked everything before joining (owns nothing), so all moves happen now
    eager = dict(
        members, k1=meta(SUBSCRIBED, SubscriptionUserdata(generation=5, active=everything))
    )
    out = leader.assign_members(counts, eager, cooperative=False)
    assert consumed(out)["k2"]["clicks"] == set(pending["clicks"])

    # the new owner claims what is pending for it, and keeps its state warm
    member = join_assignor()
    member.on_assignment(
        out_for_pending := leader.assign_members(counts, members, cooperative=True)["k2"]
    )
    assert member.active == pending
    assert member.restore_targets() == {CHANGELOG: set(pending[CHANGELOG])}
    assert out_for_pending.assignment == []
    claim = decode_subscription(member.metadata(SUBSCRIBED).user_data)
    assert claim.active == pending and claim.owned == {}


def test_owned_partitions_travel_in_the_subscription() -> None:
    member = join_assignor()
    data = member.metadata(SUBSCRIBED, owned=[("clicks", 1), ("impressions", 1)]).user_data
    assert decode_subscription(data).owned == {"clicks": (1,), "impressions": (1,)}
