"""The leader's fast paths give what the element-by-element code they stand in for gives.

The assignor, the userdata decoder and ``plan()``'s parser handle the usual case in
bulk (set and dict operations, one slice of bytes, C-level type checks) and fall back
to the element-by-element code for anything else. Each fast path is compared here
with that code, including where the fallback must take over.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from unittest import mock

import pytest
from assignor_support import member, scenario
from hypothesis import given
from hypothesis import strategies as st
from test_assignor_properties import SETTINGS, scenarios

from streamjoin.assignor import (
    Scenario,
    assign,
    plan,
    protocol,
    scenario_from_json,
    standby,
    validate_assignment,
)
from streamjoin.assignor.cooperative import withhold_moves
from streamjoin.assignor.grouping import build_grouping, merge_copartition
from streamjoin.assignor.model import (
    AssignmentResult,
    MemberAssignment,
    MemberState,
    TopicPartitions,
    normalize_topic_partitions,
    sorted_by_key,
)
from streamjoin.assignor.pipeline import sorted_members
from streamjoin.assignor.protocol import (
    SubscriptionUserdata,
    decode_subscription,
    encode_subscription,
)
from streamjoin.assignor.spread import Spread
from streamjoin.assignor.standby import claimed_standbys
from streamjoin.errors import InvalidScenarioError, UserdataError

# --------------------------------------------------------------------------- standbys


def task_by_task(sc: Scenario) -> object:
    """``assign`` with the standby keep phase always run task by task."""
    with mock.patch.object(standby, "_keep_unconstrained", lambda *args: None):
        return assign(sc)


@SETTINGS
@given(scenarios())
def test_standbys_kept_in_bulk_as_task_by_task(sc: Scenario) -> None:
    assert assign(sc) == task_by_task(sc)


def churned(members: int, tasks: int, seed: int, caught_up: bool) -> Scenario:
    """A balanced group with 1 standby after one member left, one joined, and some stale
    reports: lags for tasks members no longer hold, so some tasks have several candidates."""
    rng = random.Random(seed)
    topics = ("src", "cl")
    ids = [f"w{i:03d}" for i in range(members)]
    previous = assign(
        scenario(
            dict.fromkeys(topics, tasks),
            [member(m, topics) for m in ids],
            copartition=[topics],
            changelogs=["cl"],
            standby_replicas=1,
        )
    )
    out = []
    for m in ids[1:]:
        got = previous.assignments[m]
        lag = dict.fromkeys(got.active.get("cl", ()), 0)
        lag.update((p, 0 if caught_up else rng.randrange(20_000)) for p in got.standby["cl"])
        lag.update((rng.randrange(tasks), rng.randrange(20_000)) for _ in range(3))
        out.append(
            member(
                m,
                topics,
                generation=1,
                active=got.active,
                standby=got.standby,
                state_lag={"cl": lag},
            )
        )
    out.append(member("new", topics))
    return scenario(
        dict.fromkeys(topics, tasks),
        out,
        copartition=[topics],
        changelogs=["cl"],
        standby_replicas=1,
    )


@pytest.mark.parametrize("caught_up", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_standbys_kept_in_bulk_as_task_by_task_at_a_larger_scale(
    seed: int, caught_up: bool
) -> None:
    sc = churned(40, 300, seed, caught_up)
    result = assign(sc)
    validate_assignment(sc, result)
    assert result == task_by_task(sc)


def test_bulk_keep_gives_way_when_balance_could_refuse_a_candidate() -> None:
    keep = standby._keep_unconstrained
    # member 2 is the only candidate of three tasks; the share is 1, with one +1 slot
    assert keep({0: 2, 1: 2, 2: 2}, {}, 1, 1, 1) is None
    counts, over = keep({0: 2, 1: 2, 2: 1}, {}, 1, 1, 1) or ({}, -1)
    assert (dict(counts), over) == ({2: 2, 1: 1}, 1)
    assert keep({0: 2, 1: 2, 2: 1}, {}, 1, 1, 0) is None  # no +1 slot left for member 2
    # with several candidates, each task's best k count (smallest lag, then member)
    counts, over = keep({}, {0: [(5, 1), (0, 2)], 1: [(7, 3), (7, 0)]}, 1, 1, 0) or ({}, -1)
    assert (dict(counts), over) == ({2: 1, 0: 1}, 0)


@SETTINGS
@given(st.data())
def test_keeping_many_standbys_at_once_as_one_by_one(data: st.DataObject) -> None:
    """``Spread.keep_all`` takes the picks exactly when ``keep`` takes each, in any order,
    and leaves the same counts and levels behind; when it refuses, it changes nothing."""
    members = data.draw(st.integers(2, 6))
    tasks = data.draw(st.integers(1, 12))
    owners = [data.draw(st.lists(st.integers(0, members - 1), min_size=tasks, max_size=tasks))]
    k = data.draw(st.integers(1, members - 1))
    earlier = data.draw(st.lists(st.tuples(st.integers(0, tasks - 1), st.integers(0, members - 1))))
    picks_of = st.lists(st.tuples(st.integers(0, tasks - 1), st.integers(0, members - 1)))
    picks = [(owners[0][p], j) for p, j in data.draw(picks_of) if owners[0][p] != j]
    bulk, one_by_one = Spread(owners, [k]), Spread(owners, [k])
    for spread in (bulk, one_by_one):
        spread.begin_group(range(members), members)
        for p, j in earlier:
            if owners[0][p] != j:
                spread.keep(owners[0][p], j)
    before = {a: dict(bulk.counts(a)) for a in range(members)}
    grouped: dict[int, dict[int, int]] = {}
    for a, j in picks:
        grouped.setdefault(a, {})[j] = grouped.get(a, {}).get(j, 0) + 1
    order = data.draw(st.permutations(picks))
    taken = [one_by_one.keep(a, j) for a, j in order]
    if bulk.keep_all(grouped):
        assert all(taken)
        for a in range(members):
            assert bulk.counts(a) == one_by_one.counts(a)
            assert bulk.level(a) == one_by_one.level(a)
            assert bulk.top(a) == one_by_one.top(a)
            assert all(bulk.may_keep(a, j) == one_by_one.may_keep(a, j) for j in range(members))
    else:
        assert not all(taken)
        assert {a: dict(bulk.counts(a)) for a in range(members)} == before


# --------------------------------------------------------------------------- stats


@SETTINGS
@given(scenarios())
def test_kept_and_promoted_standbys_are_counted_as_defined(sc: Scenario) -> None:
    """A claimed standby whose task is now active on its holder is a promotion; one still
    hosted there as a standby is kept."""
    result = assign(sc)
    members = sorted_members(sc)
    grouping = build_grouping(sc.topics, sc.copartition, sc.changelog_topics, members)
    kept = promoted = 0
    for group, eligible in zip(grouping.groups, grouping.eligible, strict=True):
        if not eligible or not group.tasks or not group.changelogs:
            continue
        for i in eligible:
            got = result.assignments[members[i].member_id]
            owned = set(got.active.get(group.topics[0], ()))
            hosted = set(got.standby.get(group.changelogs[0], ()))
            for p in claimed_standbys(members[i], group):
                if p in owned:
                    promoted += 1
                elif p in hosted:
                    kept += 1
    assert result.stats.extra["standby_kept"] == kept
    assert result.stats.extra["standby_promotions"] == promoted


# --------------------------------------------------------------------------- cooperative


def withheld_one_by_one(
    result: AssignmentResult,
    owned: Mapping[str, TopicPartitions],
    topics: Mapping[str, int],
    copartition: tuple[tuple[str, ...], ...],
) -> AssignmentResult:
    """``withhold_moves`` as first written: per topic partition owned, per task assigned."""
    owners: dict[tuple[str, int], set[str]] = {}
    for member_id, tps in owned.items():
        for topic, partitions in tps.items():
            for p in partitions:
                owners.setdefault((topic, p), set()).add(member_id)
    if not owners:
        extra = {**result.stats.extra, "withheld": 0}
        return dataclasses.replace(
            result,
            assignments=dict(result.assignments),
            stats=dataclasses.replace(result.stats, extra=extra),
        )
    group_of = {t: g for g in merge_copartition(topics, copartition) for t in g}
    assignments: dict[str, MemberAssignment] = {}
    withheld = 0
    for member_id, assignment in result.assignments.items():
        tasks: dict[tuple[tuple[str, ...], int], bool] = {}
        for topic, partitions in assignment.active.items():
            group = group_of.get(topic, (topic,))
            for p in partitions:
                if (group, p) not in tasks:
                    tasks[(group, p)] = any(
                        others - {member_id} for t in group if (others := owners.get((t, p)))
                    )
        held = {key for key, elsewhere in tasks.items() if elsewhere}
        if not held:
            assignments[member_id] = assignment
            continue
        withheld += len(held)
        active: dict[str, list[int]] = {}
        pending: dict[str, list[int]] = {t: list(ps) for t, ps in assignment.pending.items()}
        for topic, partitions in assignment.active.items():
            group = group_of.get(topic, (topic,))
            for p in partitions:
                (pending if (group, p) in held else active).setdefault(topic, []).append(p)
        assignments[member_id] = dataclasses.replace(
            assignment,
            active=normalize_topic_partitions(active),
            pending=normalize_topic_partitions(pending),
        )
    extra = {**result.stats.extra, "withheld": withheld}
    stats = dataclasses.replace(result.stats, extra=extra)
    return dataclasses.replace(result, assignments=assignments, stats=stats)


@SETTINGS
@given(scenarios(), st.data())
def test_moves_withheld_per_group_as_per_topic_partition(sc: Scenario, data: st.DataObject) -> None:
    result = assign(sc)
    ids = [m.member_id for m in sc.members] + ["gone"]
    names = [*sc.topics, "ghost"]
    owned: dict[str, dict[str, tuple[int, ...]]] = {}
    for mid in data.draw(st.lists(st.sampled_from(ids), unique=True)):
        shared = tuple(data.draw(st.lists(st.integers(0, 13), max_size=5)))
        owned[mid] = {
            t: shared
            if data.draw(st.booleans())
            else tuple(data.draw(st.lists(st.integers(0, 13))))
            for t in data.draw(st.lists(st.sampled_from(names), unique=True))
        }
    expected = withheld_one_by_one(result, owned, sc.topics, sc.copartition)
    assert withhold_moves(result, owned, sc.topics, sc.copartition) == expected


# --------------------------------------------------------------------------- model


def test_a_tuple_shared_by_topics_is_normalized_once_and_stays_shared() -> None:
    shared = (9, 3, 3, 1)
    m = MemberState("m", frozenset(), active={"b": shared, "a": shared, "c": [2, 2, 0]})
    assert m.active == {"a": (1, 3, 9), "b": (1, 3, 9), "c": (0, 2)}
    assert m.active["a"] is m.active["b"]
    assert list(m.active) == ["a", "b", "c"]


def test_state_lags_that_are_not_plain_ints_are_converted_as_before() -> None:
    m = MemberState("m", frozenset(), state_lag={"t": {True: 5, 2: False, 0: 7}})
    assert m.state_lag == {"t": {0: 7, 1: 5, 2: 0}}
    assert all(type(v) is int for v in m.state_lag["t"].values())
    with pytest.raises(InvalidScenarioError, match=r"negative state lag -2 for t\[4\]"):
        MemberState("m", frozenset(), state_lag={"t": {3: 1, 4: -2, 5: -9}})


@SETTINGS
@given(st.dictionaries(st.integers(-5, 500), st.integers(0, 2**63 - 1)))
def test_lags_in_key_order_as_sorting_the_items_puts_them(lags: dict[int, int]) -> None:
    for given_ in (lags, dict(sorted(lags.items()))):
        got = sorted_by_key(given_)
        assert list(got.items()) == sorted(lags.items())
        assert got is not given_


# --------------------------------------------------------------------------- protocol


def varints(values: list[int]) -> bytes:
    out = bytearray()
    for value in values:
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


@SETTINGS
@given(
    st.lists(st.one_of(st.integers(0, 200), st.integers(0, 2**70 - 1)), max_size=12),
    st.binary(max_size=12),
)
def test_a_run_of_varints_reads_as_one_at_a_time(values: list[int], tail: bytes) -> None:
    body = varints(values) + tail
    for n in range(len(values) + 3):
        fast = protocol._Reader("subscription", body)
        slow = protocol._Reader("subscription", body)
        try:
            expected: list[int] | None = [slow.uvarint("x") for _ in range(n)]
        except UserdataError:
            expected = None
        assert fast.uvarints(n) == expected
        if expected is not None:
            assert fast.pos == slow.pos


def test_many_topics_sets_and_long_names_round_trip() -> None:
    """Two-byte topic and set references and names over 127 bytes take the slow path."""
    userdata = SubscriptionUserdata(
        generation=3,
        active={f"topic-{i:03d}": tuple(range(i, i + 3)) for i in range(140)},
        standby={"x" * 200: (1, 5, 9)},
        state_lag={"x" * 200: {1: 0, 5: 300, 9: 2**40}},
    )
    assert decode_subscription(encode_subscription(userdata)) == userdata


def uncompressed(data: bytes) -> bytes:
    header, body = data[:6], data[6:]
    if header[5] & protocol.FLAG_DEFLATED:
        body = protocol._inflate("subscription", body)
    return header[:5] + b"\x00" + body


def test_a_topic_twice_in_the_active_map_is_named() -> None:
    stored = uncompressed(encode_subscription(SubscriptionUserdata(active={"a": (1,), "b": (1,)})))
    # the active map: 2 entries, (topic 0, set 0) and (topic 1, set 0)
    assert stored.count(b"\x02\x00\x00\x01\x00") == 1
    broken = stored.replace(b"\x02\x00\x00\x01\x00", b"\x02\x00\x00\x00\x00")
    with pytest.raises(UserdataError, match="duplicate topic 'a' in active"):
        decode_subscription(broken)


def test_lags_of_several_bytes_and_a_lag_given_twice() -> None:
    lags = {p: 128**k for k, p in enumerate(range(0, 27, 3))}  # 1 to 9 bytes
    userdata = SubscriptionUserdata(
        standby={"cl": tuple(lags)}, state_lag={"cl": {**lags, 1: 0, 2: 127}}
    )
    assert decode_subscription(encode_subscription(userdata)) == userdata
    stored = uncompressed(encode_subscription(SubscriptionUserdata(state_lag={"t": {4: 1, 5: 2}})))
    body = stored[6:-1]  # without the minor-1 "owned" map (empty: one zero byte)
    assert body[-5:] == b"\x01\x00\x00\x01\x02"  # 1 entry: topic 0, set 0, lags 1 and 2
    twice = body[:-5] + b"\x02\x00\x00\x01\x02\x00\x00\x01\x02\x00"
    with pytest.raises(UserdataError, match=r"two state_lag values for t\[4\]"):
        decode_subscription(stored[:6] + twice)


def test_a_set_repeated_in_the_owned_map_is_read_once_and_shared() -> None:
    sources = ("clicks", "impressions", "views")
    mine = (3, 7, 11, 2_000, 4_001)
    userdata = SubscriptionUserdata(
        generation=4,
        active={t: mine for t in (*sources, "cl")},
        owned={**{t: mine for t in sources}, "other": (1, 2)},
    )
    decoded = decode_subscription(encode_subscription(userdata))
    assert decoded == userdata
    assert decoded.owned["clicks"] is decoded.owned["views"]


def test_a_repeated_set_still_counts_towards_the_partition_limit() -> None:
    n = varints([2_500_000])
    one_set = n + b"\x00\x01" + varints([2_500_000 - 3])  # 0, 1, 2, ...: one repeated run
    body = (
        b"\x01\x01\x00\x00\x00"  # generation -1, capacity 1, no instance id, host, tags
        + b"\x01\x01a\x01"
        + one_set  # topic table "a", one set
        + b"\x01\x00\x00\x00\x00"  # active a -> set 0; no standby, no lags
        + b"\x01\x01x"
        + one_set  # owned x -> the same set again: 5,000,000 in all
    )
    header = protocol.MAGIC + bytes((protocol.SUBSCRIPTION_KIND, protocol.MAJOR_VERSION, 1, 0))
    with pytest.raises(UserdataError, match="more than 4194304 partitions declared"):
        decode_subscription(header + body)
    assert len(decode_subscription(header + body[: -len(one_set) - 3] + b"\x00").active["a"]) == (
        2_500_000
    )


# --------------------------------------------------------------------------- plan()


def doc(**member_fields: object) -> dict[str, object]:
    return {
        "topics": {"src": 4, "cl": 4},
        "copartition": [["src", "cl"]],
        "changelog_topics": ["cl"],
        "members": [{"id": "w1", "topics": ["src", "cl"], **member_fields}],
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"active": {"src": [0, 1, True]}}, r"members\[0\]\.active\['src'\]: must be an integer"),
        ({"active": {"src": [0, 4, 9]}}, "partition 4 out of range 0-3"),
        ({"active": {"src": [0, -1]}}, "partition -1 out of range 0-3"),
        ({"active": {"src": [0, 1.0]}}, "must be an integer, got 1.0"),
        ({"state_lag": {"cl": {"0": 1, "x": 2}}}, "partition key 'x' is not an integer"),
        ({"state_lag": {"cl": {"0": 1, "7": 2}}}, "partition 7 out of range 0-3"),
        ({"state_lag": {"cl": {"0": 1, "1": -2}}}, r"cl'\]\['1'\]: must be >= 0"),
        ({"state_lag": {"cl": {"0": 1, "1": False}}}, "must be an integer, got False"),
    ],
)
def test_bad_elements_in_long_lists_are_still_named(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plan(doc(**fields))


def test_lag_keys_are_read_as_int_reads_them() -> None:
    parsed = scenario_from_json(doc(state_lag={"cl": {" 2": 5, "+3": 0, "1": 4, "01": 6}}))
    assert parsed.members[0].state_lag == {"cl": {1: 6, 2: 5, 3: 0}}


def test_equal_partition_lists_of_a_member_become_one_tuple() -> None:
    parsed = scenario_from_json(doc(active={"src": [2, 0], "cl": [2, 0]}, standby={"cl": [1]}))
    m = parsed.members[0]
    assert m.active == {"cl": (0, 2), "src": (0, 2)}
    assert m.active["cl"] is m.active["src"]
