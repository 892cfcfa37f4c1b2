"""The versioned subscription/assignment userdata (streamjoin.assignor.protocol)."""

from __future__ import annotations

import contextlib
import random
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.assignor.model import (
    AssignmentResult,
    AssignmentStats,
    MemberAssignment,
    MemberState,
)
from streamjoin.assignor.protocol import (
    MAJOR_VERSION,
    MAX_BODY_BYTES,
    MAX_DECODED_PARTITIONS,
    MAX_PARTITION,
    MINOR_VERSION,
    AssignmentUserdata,
    SubscriptionUserdata,
    assignment_userdata_for,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    next_generation,
)
from streamjoin.errors import UnsupportedUserdataVersion, UserdataError

SOURCES = ("impressions", "clicks")
CHANGELOG = "ads-joins-changelog"
GROUP = (*SOURCES, CHANGELOG)

# --------------------------------------------------------------------------- strategies

topic_names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12
)
# Mostly small partition numbers (runs and gaps), sometimes anywhere in int32.
partitions = st.one_of(st.integers(0, 64), st.integers(0, MAX_PARTITION))
partition_sets = st.frozensets(partitions, min_size=1, max_size=40)
topic_partitions = st.dictionaries(topic_names, partition_sets, max_size=5)
lags = st.one_of(st.integers(0, 300), st.integers(0, 2**63 - 1))
state_lags = st.dictionaries(
    topic_names, st.dictionaries(partitions, lags, min_size=1, max_size=20), max_size=3
)
optional_text = st.none() | st.text(max_size=40)


@st.composite
def member_states(draw: st.DrawFn) -> tuple[MemberState, str | None]:
    state = MemberState(
        member_id=draw(st.text(min_size=1, max_size=20)),
        topics=draw(st.frozensets(topic_names, max_size=5)),
        capacity=draw(st.integers(1, 2**31 - 1)),
        generation=draw(st.integers(-1, 2**63 - 1)),
        active=draw(topic_partitions),
        standby=draw(topic_partitions),
        state_lag=draw(state_lags),
        tags=draw(st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4)),
        host=draw(optional_text),
    )
    return state, draw(optional_text)


assignments = st.builds(
    AssignmentUserdata,
    generation=st.integers(0, 2**63 - 1),
    standby=topic_partitions,
    followup_rebalance=st.booleans(),
)


def example_subscription(**overrides: object) -> SubscriptionUserdata:
    values: dict[str, object] = {
        "generation": 7,
        "active": {t: [0, 1, 2, 3, 4, 9, 10, 11] for t in GROUP},
        "standby": {CHANGELOG: [40, 41, 42, 43, 44]},
        "state_lag": {CHANGELOG: {0: 0, 1: 0, 2: 3, 40: 120, 41: 4_000, 44: 40_000}},
        "capacity": 2,
        "tags": {"zone": "eu-west-1a", "rack": "r7"},
        "host": "10.0.3.17:6066",
        "group_instance_id": "worker-17",
    }
    values.update(overrides)
    return SubscriptionUserdata(**values)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- round trips


@settings(max_examples=300, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(member_states(), st.text(min_size=1, max_size=20))
def test_subscription_round_trips_any_member_state(
    drawn: tuple[MemberState, str | None], kafka_member_id: str
) -> None:
    state, group_instance_id = drawn
    userdata = SubscriptionUserdata.from_member_state(state, group_instance_id)
    decoded = decode_subscription(encode_subscription(userdata))
    assert decoded == userdata
    assert decoded.group_instance_id == group_instance_id
    assert decoded.to_member_state(state.member_id, state.topics) == state
    assert decoded.to_member_state(kafka_member_id, ()).member_id == kafka_member_id


@settings(max_examples=300, print_blob=True)
@given(assignments)
def test_assignment_round_trips(userdata: AssignmentUserdata) -> None:
    assert decode_assignment(encode_assignment(userdata)) == userdata


def test_encoding_is_canonical_whatever_the_input_order() -> None:
    a = example_subscription()
    b = example_subscription(
        active={t: [11, 10, 9, 4, 3, 2, 1, 0] for t in reversed(GROUP)},
        state_lag={CHANGELOG: {44: 40_000, 41: 4_000, 40: 120, 2: 3, 1: 0, 0: 0}},
        tags={"rack": "r7", "zone": "eu-west-1a"},
    )
    assert encode_subscription(a) == encode_subscription(b)


def test_empty_userdata_round_trips_and_is_tiny() -> None:
    data = encode_subscription(SubscriptionUserdata())
    assert decode_subscription(data) == SubscriptionUserdata()
    assert len(data) <= 16
    assert decode_assignment(encode_assignment(AssignmentUserdata(0))) == AssignmentUserdata(0)


def test_body_is_deflated_only_when_that_shrinks_it() -> None:
    small = encode_assignment(AssignmentUserdata(generation=300, standby={"t": (7,)}))
    assert small[5] == 0  # flags: stored as is, deflate would add bytes to a 14-byte body
    assert len(small) == 6 + 14
    repetitive = SubscriptionUserdata(tags={f"key-{i}": "the same long value" for i in range(40)})
    big = encode_subscription(repetitive)
    assert big[5] == 1  # flags: deflated
    assert decode_subscription(big) == repetitive


def test_header_layout() -> None:
    data = encode_assignment(AssignmentUserdata(generation=1))
    assert data[:3] == b"SJA"
    assert (data[3], data[4]) == (MAJOR_VERSION, MINOR_VERSION)
    assert encode_subscription(SubscriptionUserdata())[:3] == b"SJS"


def test_lags_for_partitions_it_does_not_own_survive() -> None:
    userdata = SubscriptionUserdata(state_lag={CHANGELOG: {7: 0, 900: 12_345_678}})
    assert decode_subscription(encode_subscription(userdata)).state_lag == {
        CHANGELOG: {7: 0, 900: 12_345_678}
    }


# --------------------------------------------------------------------------- epochs


def test_next_generation_is_one_more_than_any_claim() -> None:
    assert next_generation([]) == 0
    assert next_generation([-1, -1]) == 0
    assert next_generation([3, 9, -1, 4]) == 10


def test_assignment_userdata_for_a_result() -> None:
    result = AssignmentResult(
        assignments={
            "w1": MemberAssignment(active={"clicks": (0,)}, standby={CHANGELOG: (1,)}),
            "w2": MemberAssignment(active={"clicks": (1,)}, standby={}),
        },
        unassigned={},
        warnings=(),
        followup_rebalance=True,
        stats=AssignmentStats(tasks=2, moved=0, min_possible_moves=0),
    )
    assert assignment_userdata_for(result, "w1", 5) == AssignmentUserdata(
        generation=5, standby={CHANGELOG: (1,)}, followup_rebalance=True
    )
    assert assignment_userdata_for(result, "w3", 5).standby == {}


# --------------------------------------------------------------------------- versions


def with_header(data: bytes, *, major: int | None = None, minor: int | None = None) -> bytes:
    header = bytearray(data[:6])
    if major is not None:
        header[3] = major
    if minor is not None:
        header[4] = minor
    return bytes(header) + data[6:]


@pytest.mark.parametrize("major", [0, MAJOR_VERSION + 1, 255])
def test_unknown_major_versions_are_named(major: int) -> None:
    data = with_header(encode_subscription(example_subscription()), major=major, minor=3)
    with pytest.raises(UnsupportedUserdataVersion, match=rf"version {major}\.3") as info:
        decode_subscription(data)
    assert (info.value.kind, info.value.major, info.value.minor) == ("subscription", major, 3)
    with pytest.raises(UnsupportedUserdataVersion):
        decode_assignment(with_header(encode_assignment(AssignmentUserdata(1)), major=major))


def uncompressed(data: bytes) -> bytes:
    """The same message with its body stored as is (to append fields to it)."""
    if data[5] & 1:
        return data[:5] + b"\x00" + zlib.decompress(data[6:], -15)
    return data


def test_newer_minor_versions_may_append_fields_older_decoders_skip() -> None:
    userdata = example_subscription()
    data = uncompressed(encode_subscription(userdata))
    newer = with_header(data, minor=MINOR_VERSION + 1) + b"\x05future"
    assert decode_subscription(newer) == userdata
    assignment = AssignmentUserdata(4, {CHANGELOG: (1, 2)})
    newer = with_header(encode_assignment(assignment), minor=MINOR_VERSION + 1) + b"\x01\x02"
    assert decode_assignment(newer) == assignment


def test_newer_minor_assignment_flags_are_ignored() -> None:
    data = bytearray(
        uncompressed(encode_assignment(AssignmentUserdata(4, followup_rebalance=True)))
    )
    data[7] |= 0x02  # an extra flag bit: generation 4 is one byte, flags the next
    with pytest.raises(UserdataError, match="unknown assignment flags"):
        decode_assignment(bytes(data))
    decoded = decode_assignment(with_header(bytes(data), minor=MINOR_VERSION + 1))
    assert decoded.followup_rebalance


def test_trailing_bytes_at_a_known_version_are_malformed() -> None:
    data = uncompressed(encode_subscription(example_subscription()))
    with pytest.raises(UserdataError, match="trailing bytes"):
        decode_subscription(data + b"\x00")


# --------------------------------------------------------------------------- bad input


def test_wrong_kind_magic_and_flags_are_named() -> None:
    sub = encode_subscription(example_subscription())
    with pytest.raises(UserdataError, match="expected assignment userdata, got subscription"):
        decode_assignment(sub)
    with pytest.raises(UserdataError, match="bad magic"):
        decode_subscription(b"XX" + sub[2:])
    with pytest.raises(UserdataError, match="unknown header flags"):
        decode_subscription(sub[:5] + bytes([sub[5] | 0x80]) + sub[6:])
    with pytest.raises(UserdataError, match="unknown kind"):
        decode_subscription(b"SJ\x00" + sub[3:])


@pytest.mark.parametrize(
    "userdata",
    [
        example_subscription(),
        example_subscription(tags={f"k{i}": "repeated value" for i in range(30)}),
    ],
    ids=["stored", "deflated"],
)
def test_every_truncation_is_malformed_never_index_error(userdata: SubscriptionUserdata) -> None:
    data = encode_subscription(userdata)
    for cut in range(len(data)):
        with pytest.raises(UserdataError, match=r"truncated|corrupt|header|bad magic"):
            decode_subscription(data[:cut])


def test_truncated_assignment_is_malformed() -> None:
    data = encode_assignment(AssignmentUserdata(300, {CHANGELOG: (1, 5, 9)}))
    for cut in range(len(data)):
        with pytest.raises(UserdataError) as caught:
            decode_assignment(data[:cut])
        assert not isinstance(caught.value, UnsupportedUserdataVersion)


@settings(max_examples=500, print_blob=True)
@given(st.binary(max_size=200), st.sampled_from([0, 1]), st.sampled_from([0, 1]))
def test_garbage_after_a_valid_header_never_escapes_as_another_error(
    body: bytes, minor: int, flags: int
) -> None:
    for kind, decode in ((b"S", decode_subscription), (b"A", decode_assignment)):
        data = b"SJ" + kind + bytes((MAJOR_VERSION, minor, flags)) + body
        with contextlib.suppress(UserdataError):
            decode(data)


@settings(max_examples=300, print_blob=True)
@given(st.data())
def test_corrupted_messages_decode_or_fail_cleanly(data: st.DataObject) -> None:
    encoded = bytearray(encode_subscription(example_subscription()))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(encoded) - 1))
        encoded[index] = data.draw(st.integers(0, 255))
    with contextlib.suppress(UserdataError):
        decode_subscription(bytes(encoded))


def stored_assignment(body: bytes) -> bytes:
    return b"SJA" + bytes((MAJOR_VERSION, MINOR_VERSION, 0)) + body


def test_named_errors_for_broken_references_and_sets() -> None:
    # generation 1, flags 0, one topic "t", no sets, a standby entry pointing at set 0
    with pytest.raises(UserdataError, match=r"set reference 0 .* only 0 sets"):
        decode_assignment(stored_assignment(b"\x01\x00\x01\x01t\x00\x01\x00\x00"))
    with pytest.raises(UserdataError, match=r"topic reference 3 .* only 1 topics"):
        decode_assignment(stored_assignment(b"\x01\x00\x01\x01t\x00\x01\x03\x00"))
    # one set of 3 partitions starting at 5 whose single run (gap 1, repeated) claims 4 more
    with pytest.raises(UserdataError, match="overshoots"):
        decode_assignment(stored_assignment(b"\x01\x00\x00\x01\x03\x05\x01\x02"))
    with pytest.raises(UserdataError, match="duplicate topic name"):
        decode_assignment(stored_assignment(b"\x01\x00\x02\x01t\x01t\x00\x00"))
    with pytest.raises(UserdataError, match="not valid UTF-8"):
        decode_assignment(stored_assignment(b"\x01\x00\x01\x01\xff\x00\x00"))
    with pytest.raises(UserdataError, match="longer than 10 bytes"):
        decode_assignment(stored_assignment(b"\xff" * 11))


def test_partition_numbers_above_int32_are_malformed() -> None:
    first = bytearray()
    value = MAX_PARTITION + 1
    while value > 0x7F:
        first.append((value & 0x7F) | 0x80)
        value >>= 7
    first.append(value)
    with pytest.raises(UserdataError, match="above"):
        decode_assignment(stored_assignment(b"\x01\x00\x00\x01\x01" + bytes(first) + b"\x00"))


def test_duplicate_and_oversized_lags_are_malformed() -> None:
    stored = uncompressed(encode_subscription(SubscriptionUserdata(state_lag={"t": {4: 1, 5: 2}})))
    body = stored[6:-1]  # without the minor-1 "owned" map (empty: one zero byte)
    assert stored[-1:] == b"\x00"
    # the state-lag section: count 1, topic 0, set 0, lags 1 and 2
    assert body[-5:] == b"\x01\x00\x00\x01\x02"
    twice = body[:-5] + b"\x02\x00\x00\x01\x02\x00\x00\x01\x02\x00"
    with pytest.raises(UserdataError, match="two state_lag values"):
        decode_subscription(stored[:6] + twice)
    huge = body[:-2] + b"\xff" * 9 + b"\x01" + b"\x02\x00"  # 2**63 + ...
    with pytest.raises(UserdataError, match="above"):
        decode_subscription(stored[:6] + huge)


def test_a_few_bytes_cannot_claim_millions_of_partitions() -> None:
    n = MAX_DECODED_PARTITIONS + 1
    count = bytearray()
    while n > 0x7F:
        count.append((n & 0x7F) | 0x80)
        n >>= 7
    count.append(n)
    # one set: count, first 0, then one run "gap 1, repeated count - 1 times"
    body = b"\x01\x00\x00\x01" + bytes(count) + b"\x00\x01" + bytes(count)
    with pytest.raises(UserdataError, match="more than"):
        decode_assignment(stored_assignment(body))


def test_a_deflate_bomb_is_refused() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = compressor.compress(b"\x00" * (MAX_BODY_BYTES + 1)) + compressor.flush()
    data = b"SJS" + bytes((MAJOR_VERSION, MINOR_VERSION, 1)) + bomb
    with pytest.raises(UserdataError, match="inflates beyond"):
        decode_subscription(data)


def test_out_of_range_values_are_refused_when_encoding() -> None:
    with pytest.raises(ValueError, match="generation"):
        encode_subscription(SubscriptionUserdata(generation=-2))
    with pytest.raises(ValueError, match="capacity"):
        encode_subscription(SubscriptionUserdata(capacity=0))
    with pytest.raises(ValueError, match="lag"):
        encode_subscription(SubscriptionUserdata(state_lag={CHANGELOG: {0: -1}}))
    with pytest.raises(ValueError, match="partition"):
        encode_subscription(SubscriptionUserdata(active={"t": [MAX_PARTITION + 1]}))
    with pytest.raises(ValueError, match="generation"):
        encode_assignment(AssignmentUserdata(generation=-1))


# --------------------------------------------------------------------------- size


def realistic_member(tasks: list[int], standby: list[int], seed: int) -> SubscriptionUserdata:
    """A worker of a 2-sources-plus-changelog join: owns ``tasks``, stands by for ``standby``."""
    rng = random.Random(seed)
    lag = {p: 0 for p in tasks} | {p: rng.randrange(0, 5_000) for p in standby}
    return SubscriptionUserdata(
        generation=41,
        active={t: tasks for t in GROUP},
        standby={CHANGELOG: standby},
        state_lag={CHANGELOG: lag},
        capacity=1,
        tags={"zone": "eu-west-1a"},
        host="10.0.3.17:6066",
        group_instance_id="worker-17",
    )


def test_a_member_with_twenty_contiguous_ish_tasks_stays_under_200_bytes() -> None:
    # Design: ~60 bytes of identity (host, instance id, tags, topic names), a few bytes per
    # partition set (3 distinct sets here), 1-2 bytes per lag. A fixed-width encoding of the
    # 100 topic partitions and 40 lags would need well over 500 bytes.
    tasks = [*range(100, 112), *range(300, 308)]
    standby = [*range(500, 510), *range(700, 710)]
    data = encode_subscription(realistic_member(tasks, standby, seed=1))
    assert len(data) < 200, len(data)
    assignment = encode_assignment(AssignmentUserdata(generation=42, standby={CHANGELOG: standby}))
    # header 6, epoch and flags 2, topic name 20, one set of two runs ~10, one reference 3
    assert len(assignment) < 50, len(assignment)


def test_scattered_tasks_cost_about_two_bytes_per_partition() -> None:
    rng = random.Random(7)
    tasks = sorted(rng.sample(range(10_000), 20))
    standby = sorted(rng.sample(sorted(set(range(10_000)) - set(tasks)), 20))
    data = encode_subscription(realistic_member(tasks, standby, seed=2))
    # identity ~100 (host, instance id, tags, three topic names) + 2 scattered sets of 20 at
    # ~2 bytes per element (gap varint, gaps ~500) + 40 lags at <= 2 bytes; the lags reference
    # the active and standby sets instead of repeating their union.
    assert len(data) < 100 + 2 * 20 * 2 + 40 * 2 + 20, len(data)


def group_userdata_sizes(members: int, tasks_per_member: int) -> list[int]:
    """Bytes of subscription + assignment userdata of every member of a group (range-assigned)."""
    sizes = []
    for i in range(members):
        tasks = list(range(i * tasks_per_member, (i + 1) * tasks_per_member))
        j = (i + 1) % members
        standby = list(range(j * tasks_per_member, (j + 1) * tasks_per_member))
        sub = encode_subscription(realistic_member(tasks, standby, seed=i))
        assignment = encode_assignment(AssignmentUserdata(42, {CHANGELOG: standby}))
        sizes.append(len(sub) + len(assignment))
    return sizes


def test_a_members_userdata_does_not_grow_with_the_group() -> None:
    small = group_userdata_sizes(members=10, tasks_per_member=20)
    large = group_userdata_sizes(members=1_000, tasks_per_member=20)
    # Only varints of larger partition numbers grow (one byte per partition set and run start).
    assert max(large) <= max(small) + 12, (max(small), max(large))
    assert sum(large) / len(large) <= sum(small) / len(small) + 12


def test_assignment_userdata_never_mentions_other_members() -> None:
    # The same member's assignment userdata is byte-identical whatever the rest of the group owns.
    mine = AssignmentUserdata(9, {CHANGELOG: (3, 4)})
    assert len({encode_assignment(mine) for _ in range(3)}) == 1
    assert set(AssignmentUserdata.__dataclass_fields__) == {
        "generation",
        "standby",
        "followup_rebalance",
        "pending",
        "warmup",
    }


def test_minor_1_fields_round_trip() -> None:
    sub = SubscriptionUserdata(generation=3, owned={"a": (0, 2, 4), "b": (7,)})
    assert decode_subscription(encode_subscription(sub)) == sub
    assignment = AssignmentUserdata(
        4, {CHANGELOG: (1,)}, pending={"a": (5, 6), CHANGELOG: (5, 6)}, warmup={CHANGELOG: (9,)}
    )
    assert decode_assignment(encode_assignment(assignment)) == assignment


def test_a_minor_0_message_decodes_with_empty_minor_1_fields() -> None:
    # what a worker of the previous version sends: the body ends before the minor-1 fields
    body = uncompressed(encode_subscription(SubscriptionUserdata(generation=3)))
    minor0 = with_header(body[:-1], minor=0)
    assert decode_subscription(minor0) == SubscriptionUserdata(generation=3)
    body = uncompressed(encode_assignment(AssignmentUserdata(2, {CHANGELOG: (1,)})))
    minor0 = with_header(body[:-2], minor=0)
    assert decode_assignment(minor0) == AssignmentUserdata(2, {CHANGELOG: (1,)})
