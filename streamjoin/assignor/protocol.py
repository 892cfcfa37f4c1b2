"""Versioned userdata carried in the consumer group protocol (pure: bytes in, bytes out).

Kafka's group protocol gives every member an opaque ``user_data`` field in its
subscription (read by the leader) and in its assignment (read by the member).
This module defines what streamjoin puts there and how it is encoded:

* :class:`SubscriptionUserdata` -- what a member tells the leader: the tasks it
  owned (active and standby topic partitions) as of the epoch it last received,
  the lag of each local store, its capacity, tags, routing host and
  ``group_instance_id`` (the leader never sees the latter through aiokafka).
* :class:`AssignmentUserdata` -- what the leader tells one member beyond the
  Kafka-level assignment: the new epoch, its standby partitions and whether a
  follow-up rebalance is wanted.

Both are encoded compactly (varints, partition sets as run-length encoded
deltas, each topic name and each distinct partition set stored once) behind a
six-byte header with a magic, a kind, a major and a minor version, and the
body is deflated only when that makes it smaller. Decoding never lets an
``IndexError`` or ``zlib.error`` escape: unknown major versions raise
:class:`~streamjoin.errors.UnsupportedUserdataVersion`, anything else wrong raises
:class:`~streamjoin.errors.UserdataError` naming what was wrong. ``docs/protocol.md`` has the
byte layout, the compatibility rules and the size measurements.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, NoReturn

from streamjoin.assignor.model import (
    AssignmentResult,
    MemberState,
    TopicPartitions,
    normalize_topic_partitions,
    sorted_by_key,
)
from streamjoin.errors import UnsupportedUserdataVersion, UserdataError

__all__ = [
    "ASSIGNMENT_KIND",
    "MAJOR_VERSION",
    "MINOR_VERSION",
    "SUBSCRIPTION_KIND",
    "AssignmentUserdata",
    "SubscriptionUserdata",
    "assignment_userdata_for",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
    "next_generation",
]

MAGIC: Final = b"SJ"
SUBSCRIPTION_KIND: Final = 0x53  # "S"
ASSIGNMENT_KIND: Final = 0x41  # "A"
#: Bumped for changes older decoders cannot skip; decoders reject other majors.
MAJOR_VERSION: Final = 1
#: Bumped when fields are appended to the body; older decoders skip them.
#: 1: subscriptions append ``owned``; assignments append ``pending`` and ``warmup``.
MINOR_VERSION: Final = 1
HEADER_SIZE: Final = 6
FLAG_DEFLATED: Final = 0x01
_KNOWN_HEADER_FLAGS: Final = FLAG_DEFLATED
ASSIGNMENT_FLAG_FOLLOWUP: Final = 0x01

#: Kafka partition numbers are int32.
MAX_PARTITION: Final = 2**31 - 1
MAX_CAPACITY: Final = 2**31 - 1
MAX_GENERATION: Final = 2**63 - 1
MAX_LAG: Final = 2**63 - 1
#: Decoding limits, so that a few hostile bytes cannot claim gigabytes.
MAX_BODY_BYTES: Final = 16 * 1024 * 1024
MAX_DECODED_PARTITIONS: Final = 1 << 22
_MAX_VARINT_BYTES: Final = 10

_KIND_NAMES: Final = {SUBSCRIPTION_KIND: "subscription", ASSIGNMENT_KIND: "assignment"}


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class SubscriptionUserdata:
    """What one member reports to the leader when it (re)joins the group.

    ``generation`` is the epoch of the last assignment it received (-1: none),
    so that the leader can prefer the newest claim when two members say they
    owned the same partition. ``state_lag`` covers only stores the member holds
    locally. ``active`` is what the member *claims* (for stickiness: what it
    owned, or was promised, even in a previous process); ``owned`` is what this
    process is processing right now, which the cooperative leader must not hand
    to anyone else before the owner revoked it (minor version 1). The Kafka
    member id and the subscribed topics are not repeated here: the group
    protocol already carries them.
    """

    generation: int = -1
    active: TopicPartitions = field(default_factory=dict)
    standby: TopicPartitions = field(default_factory=dict)
    state_lag: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    capacity: int = 1
    tags: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None
    group_instance_id: str | None = None
    owned: TopicPartitions = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "active", normalize_topic_partitions(self.active))
        object.__setattr__(self, "standby", normalize_topic_partitions(self.standby))
        object.__setattr__(self, "owned", normalize_topic_partitions(self.owned))
        lags: dict[str, dict[int, int]] = {}
        for topic in sorted(self.state_lag):
            per_partition = sorted_by_key(self.state_lag[topic])
            if per_partition:
                lags[topic] = per_partition
        object.__setattr__(self, "state_lag", lags)
        object.__setattr__(self, "tags", dict(sorted(self.tags.items())))

    @classmethod
    def from_member_state(
        cls, state: MemberState, group_instance_id: str | None = None
    ) -> SubscriptionUserdata:
        """The userdata a member with this state sends (member id and topics travel elsewhere)."""
        return cls(
            generation=state.generation,
            active=state.active,
            standby=state.standby,
            state_lag=state.state_lag,
            capacity=state.capacity,
            tags=state.tags,
            host=state.host,
            group_instance_id=group_instance_id,
        )

    def to_member_state(self, member_id: str, topics: Iterable[str]) -> MemberState:
        """Combine with what the group protocol carries into the assignor's input.

        Pass ``group_instance_id or kafka_member_id`` as ``member_id`` to keep a
        statically configured worker's tasks across restarts: its Kafka member
        id changes on every restart, its instance id does not.
        """
        return MemberState(
            member_id=member_id,
            topics=frozenset(topics),
            capacity=self.capacity,
            generation=self.generation,
            active=self.active,
            standby=self.standby,
            state_lag=self.state_lag,
            tags=self.tags,
            host=self.host,
        )


@dataclass(frozen=True)
class AssignmentUserdata:
    """What the leader tells one member beyond its Kafka-level (active) assignment.

    ``generation`` is the new epoch (see :func:`next_generation`); the member
    reports it back in its next subscription. Active partitions are not
    repeated: the Kafka assignment already lists them. No routing table is
    carried (it would grow with the group; see docs/protocol.md).

    Minor version 1 appends ``pending`` (active partitions the cooperative
    leader withheld from this member until their current owner revokes them:
    the member claims them in its next subscription and warms their state up
    meanwhile) and ``warmup`` (changelog partitions to restore like standbys so
    that the member can take their task over once caught up, KIP-441).
    """

    generation: int
    standby: TopicPartitions = field(default_factory=dict)
    followup_rebalance: bool = False
    pending: TopicPartitions = field(default_factory=dict)
    warmup: TopicPartitions = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "standby", normalize_topic_partitions(self.standby))
        object.__setattr__(self, "pending", normalize_topic_partitions(self.pending))
        object.__setattr__(self, "warmup", normalize_topic_partitions(self.warmup))


def next_generation(generations: Iterable[int]) -> int:
    """The epoch of a new assignment: one more than any a member reported (fences stale claims)."""
    return max(max(generations, default=-1), -1) + 1


def assignment_userdata_for(
    result: AssignmentResult, member_id: str, generation: int
) -> AssignmentUserdata:
    """The userdata the leader sends to ``member_id`` for this assignment result."""
    member = result.assignments.get(member_id)
    if member is None:
        return AssignmentUserdata(generation=generation)
    return AssignmentUserdata(
        generation=generation,
        standby=member.standby,
        followup_rebalance=result.followup_rebalance,
        pending=member.pending,
        warmup=member.warmup,
    )


# --------------------------------------------------------------------------- encoding


def encode_subscription(userdata: SubscriptionUserdata) -> bytes:
    """Encode a subscription's userdata; :class:`UserdataError` for out-of-range values."""
    if not -1 <= userdata.generation <= MAX_GENERATION:
        raise UserdataError(
            f"generation must be in [-1, {MAX_GENERATION}], got {userdata.generation}"
        )
    if not 1 <= userdata.capacity <= MAX_CAPACITY:
        raise UserdataError(f"capacity must be in [1, {MAX_CAPACITY}], got {userdata.capacity}")
    out = bytearray()
    _put_uvarint(out, _zigzag(userdata.generation))
    _put_uvarint(out, userdata.capacity)
    _put_optional_str(out, userdata.group_instance_id)
    _put_optional_str(out, userdata.host)
    _put_uvarint(out, len(userdata.tags))
    for key, tag in userdata.tags.items():
        _put_str(out, key)
        _put_str(out, tag)
    tables = _Tables()
    active = tables.map_refs(userdata.active)
    standby = tables.map_refs(userdata.standby)
    lags: list[tuple[int, int, list[int]]] = []
    for topic, per_partition in userdata.state_lag.items():
        for partition, lag in per_partition.items():
            if not 0 <= lag <= MAX_LAG:
                raise UserdataError(f"lag for {topic}[{partition}] must be in [0, {MAX_LAG}]")
        for parts in tables.cover(tuple(per_partition)):
            topic_ref, set_ref = tables.refs(topic, parts)
            lags.append((topic_ref, set_ref, [per_partition[p] for p in parts]))
    tables.write(out)
    _put_refs(out, active)
    _put_refs(out, standby)
    _put_uvarint(out, len(lags))
    for topic_ref, set_ref, values in lags:
        _put_uvarint(out, topic_ref)
        _put_uvarint(out, set_ref)
        for value in values:
            _put_uvarint(out, value)
    _put_inline_map(out, userdata.owned)  # minor 1
    return _frame(SUBSCRIPTION_KIND, out)


def encode_assignment(userdata: AssignmentUserdata) -> bytes:
    """Encode one member's assignment userdata; :class:`UserdataError` if out of range."""
    if not 0 <= userdata.generation <= MAX_GENERATION:
        raise UserdataError(
            f"generation must be in [0, {MAX_GENERATION}], got {userdata.generation}"
        )
    out = bytearray()
    _put_uvarint(out, userdata.generation)
    _put_uvarint(out, ASSIGNMENT_FLAG_FOLLOWUP if userdata.followup_rebalance else 0)
    tables = _Tables()
    standby = tables.map_refs(userdata.standby)
    tables.write(out)
    _put_refs(out, standby)
    _put_inline_map(out, userdata.pending)  # minor 1
    _put_inline_map(out, userdata.warmup)  # minor 1
    return _frame(ASSIGNMENT_KIND, out)


class _Tables:
    """The string table of topic names and the table of distinct partition sets.

    Co-partitioned topics usually hold identical partition sets, so storing
    each distinct set once roughly divides the size by the group's width.
    """

    def __init__(self) -> None:
        self.topics: dict[str, int] = {}
        self.sets: dict[tuple[int, ...], int] = {}

    def refs(self, topic: str, partitions: tuple[int, ...]) -> tuple[int, int]:
        topic_ref = self.topics.setdefault(topic, len(self.topics))
        set_ref = self.sets.get(partitions)
        if set_ref is None:
            for partition in partitions:
                if not 0 <= partition <= MAX_PARTITION:
                    raise UserdataError(
                        f"partition {partition} of {topic!r} outside [0, {MAX_PARTITION}]"
                    )
            set_ref = self.sets[partitions] = len(self.sets)
        return topic_ref, set_ref

    def cover(self, partitions: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Split a topic's lag partitions into sets already in the table, plus one remainder.

        A member reports lags for the stores it holds, which are usually exactly
        its active and standby partitions: those sets are then referenced, not
        repeated. Largest sets are tried first; the result is deterministic.
        """
        remaining = set(partitions)
        pieces: list[tuple[int, ...]] = []
        for known in sorted(self.sets, key=lambda s: (-len(s), self.sets[s])):
            if remaining and len(known) <= len(remaining) and remaining.issuperset(known):
                pieces.append(known)
                remaining.difference_update(known)
        if remaining:
            pieces.append(tuple(sorted(remaining)))
        return pieces

    def map_refs(self, value: TopicPartitions) -> list[tuple[int, int]]:
        return [self.refs(topic, parts) for topic, parts in value.items()]

    def write(self, out: bytearray) -> None:
        _put_uvarint(out, len(self.topics))
        for topic in self.topics:
            _put_str(out, topic)
        _put_uvarint(out, len(self.sets))
        for partitions in self.sets:
            _put_partition_set(out, partitions)


def _frame(kind: int, body: bytearray) -> bytes:
    flags = 0
    payload: bytes = bytes(body)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = compressor.compress(payload) + compressor.flush()
    if len(deflated) < len(payload):
        flags |= FLAG_DEFLATED
        payload = deflated
    return MAGIC + bytes((kind, MAJOR_VERSION, MINOR_VERSION, flags)) + payload


def _put_uvarint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _put_str(out: bytearray, value: str) -> None:
    raw = value.encode("utf-8")
    _put_uvarint(out, len(raw))
    out += raw


def _put_optional_str(out: bytearray, value: str | None) -> None:
    if value is None:
        out.append(0)
        return
    raw = value.encode("utf-8")
    _put_uvarint(out, len(raw) + 1)
    out += raw


def _put_inline_map(out: bytearray, value: TopicPartitions) -> None:
    """A topic map appended by a minor version: names inline (the tables come earlier)."""
    _put_uvarint(out, len(value))
    for topic, partitions in value.items():
        for partition in (partitions[0], partitions[-1]) if partitions else ():
            if not 0 <= partition <= MAX_PARTITION:
                raise UserdataError(
                    f"partition {partition} of {topic!r} outside [0, {MAX_PARTITION}]"
                )
        _put_str(out, topic)
        _put_partition_set(out, partitions)


def _put_refs(out: bytearray, refs: list[tuple[int, int]]) -> None:
    _put_uvarint(out, len(refs))
    for topic_ref, set_ref in refs:
        _put_uvarint(out, topic_ref)
        _put_uvarint(out, set_ref)


def _put_partition_set(out: bytearray, partitions: tuple[int, ...]) -> None:
    """Count, first element, then runs of equal gaps between consecutive elements.

    A run is ``(gap - 1) << 1 | repeated``, followed by ``repeat - 2`` when the
    gap repeats. Contiguous ranges and round-robin strides collapse to one run
    of two or three bytes; an isolated element costs just its gap varint.
    """
    _put_uvarint(out, len(partitions))
    if not partitions:
        return
    _put_uvarint(out, partitions[0])
    i, n = 1, len(partitions)
    while i < n:
        delta = partitions[i] - partitions[i - 1]
        j = i + 1
        while j < n and partitions[j] - partitions[j - 1] == delta:
            j += 1
        if j - i == 1:
            _put_uvarint(out, (delta - 1) << 1)
        else:
            _put_uvarint(out, (delta - 1) << 1 | 1)
            _put_uvarint(out, j - i - 2)
        i = j


# --------------------------------------------------------------------------- decoding


def decode_subscription(data: bytes) -> SubscriptionUserdata:
    """Decode a subscription's userdata, or raise a :class:`UserdataError` saying why not."""
    reader, minor = _open(data, SUBSCRIPTION_KIND)
    zigzag = reader.uvarint("generation")
    generation = (zigzag >> 1) ^ -(zigzag & 1)
    if not -1 <= generation <= MAX_GENERATION:
        reader.fail(f"generation {generation} outside [-1, {MAX_GENERATION}]")
    capacity = reader.uvarint("capacity")
    if not 1 <= capacity <= MAX_CAPACITY:
        reader.fail(f"capacity {capacity} outside [1, {MAX_CAPACITY}]")
    group_instance_id = reader.optional_str("group_instance_id")
    host = reader.optional_str("host")
    tags: dict[str, str] = {}
    for _ in range(reader.count("tag count")):
        key = reader.text("tag key")
        if key in tags:
            reader.fail(f"duplicate tag key {key!r}")
        tags[key] = reader.text(f"value of tag {key!r}")
    topics, sets = reader.tables()
    active = reader.topic_map("active", topics, sets)
    standby = reader.topic_map("standby", topics, sets)
    state_lag: dict[str, dict[int, int]] = {}
    for _ in range(reader.count("state_lag entry count")):
        topic = reader.topic_ref("state_lag", topics)
        partitions = reader.set_ref(f"state_lag of {topic!r}", sets)
        per_partition = state_lag.setdefault(topic, {})
        start = reader.pos
        lags = reader.uvarints(len(partitions))
        if (
            lags is None
            or max(lags, default=0) > MAX_LAG
            or not per_partition.keys().isdisjoint(partitions)
        ):
            reader.pos = start  # one by one, to name what is wrong
            _read_lags(reader, topic, partitions, per_partition)
        else:
            per_partition.update(zip(partitions, lags, strict=True))
    owned = reader.inline_map("owned") if minor >= 1 else {}
    reader.finish(minor)
    return SubscriptionUserdata(
        generation=generation,
        active=active,
        standby=standby,
        state_lag=state_lag,
        capacity=capacity,
        tags=tags,
        host=host,
        group_instance_id=group_instance_id,
        owned=owned,
    )


def _read_lags(
    reader: _Reader, topic: str, partitions: tuple[int, ...], per_partition: dict[int, int]
) -> None:
    """Lags of ``partitions`` one by one, failing on the first that is missing or wrong."""
    what = f"a state_lag value of {topic!r}"
    for partition in partitions:
        if partition in per_partition:
            reader.fail(f"two state_lag values for {topic}[{partition}]")
        lag = reader.uvarint(what)
        if lag > MAX_LAG:
            reader.fail(f"state_lag {lag} for {topic}[{partition}] above {MAX_LAG}")
        per_partition[partition] = lag


def decode_assignment(data: bytes) -> AssignmentUserdata:
    """Decode one member's assignment userdata, or raise a :class:`UserdataError` saying why not."""
    reader, minor = _open(data, ASSIGNMENT_KIND)
    generation = reader.uvarint("generation")
    if generation > MAX_GENERATION:
        reader.fail(f"generation {generation} above {MAX_GENERATION}")
    flags = reader.uvarint("flags")
    if flags & ~ASSIGNMENT_FLAG_FOLLOWUP and minor <= MINOR_VERSION:
        reader.fail(f"unknown assignment flags {flags:#x}")
    topics, sets = reader.tables()
    standby = reader.topic_map("standby", topics, sets)
    pending = reader.inline_map("pending") if minor >= 1 else {}
    warmup = reader.inline_map("warmup") if minor >= 1 else {}
    reader.finish(minor)
    return AssignmentUserdata(
        generation=generation,
        standby=standby,
        followup_rebalance=bool(flags & ASSIGNMENT_FLAG_FOLLOWUP),
        pending=pending,
        warmup=warmup,
    )


def _open(data: bytes, kind: int) -> tuple[_Reader, int]:
    """Check the header and return a reader over the (inflated) body and the minor version."""
    name = _KIND_NAMES[kind]
    data = bytes(data)  # also accepts bytearray and memoryview
    if len(data) < HEADER_SIZE:
        raise UserdataError(
            f"{name} userdata truncated: {len(data)} bytes, the header alone is {HEADER_SIZE}"
        )
    if data[:2] != MAGIC:
        raise UserdataError(f"{name} userdata has bad magic {data[:2]!r} (expected {MAGIC!r})")
    if data[2] != kind:
        other = _KIND_NAMES.get(data[2], f"unknown kind {data[2]:#04x}")
        raise UserdataError(f"expected {name} userdata, got {other}")
    major, minor, flags = data[3], data[4], data[5]
    if major != MAJOR_VERSION:
        raise UnsupportedUserdataVersion(
            name, major, minor, reader_major=MAJOR_VERSION, reader_minor=MINOR_VERSION
        )
    if flags & ~_KNOWN_HEADER_FLAGS:
        raise UserdataError(f"{name} userdata has unknown header flags {flags:#04x}")
    body = data[HEADER_SIZE:]
    if flags & FLAG_DEFLATED:
        body = _inflate(name, body)
    return _Reader(name, body), minor


def _inflate(name: str, payload: bytes) -> bytes:
    inflater = zlib.decompressobj(-15)
    try:
        body = inflater.decompress(payload, MAX_BODY_BYTES + 1)
    except zlib.error as exc:
        raise UserdataError(f"{name} userdata: corrupt deflated body ({exc})") from exc
    if len(body) > MAX_BODY_BYTES:
        raise UserdataError(f"{name} userdata inflates beyond {MAX_BODY_BYTES} bytes")
    if not inflater.eof:
        raise UserdataError(f"{name} userdata: deflated body is truncated")
    if inflater.unused_data:
        raise UserdataError(f"{name} userdata: trailing bytes after the deflated body")
    return body


class _Reader:
    """A cursor over a body; every read checks bounds and names the field it reads."""

    def __init__(self, kind: str, body: bytes) -> None:
        self.kind = kind
        self.body = body
        self.pos = 0
        self.partitions_decoded = 0
        #: every non-empty partition set read so far: its encoding and the tuple
        self.sets_read: list[tuple[bytes, tuple[int, ...]]] = []

    def fail(self, what: str) -> NoReturn:
        raise UserdataError(f"{self.kind} userdata: {what} (at body offset {self.pos})")

    def uvarint(self, what: str) -> int:
        body, pos = self.body, self.pos
        if pos < len(body) and body[pos] < 0x80:  # one byte: most counts and references
            self.pos = pos + 1
            return body[pos]
        result = shift = 0
        for i in range(_MAX_VARINT_BYTES):
            if pos + i >= len(body):
                self.fail(f"truncated while reading {what}")
            byte = body[pos + i]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                self.pos = pos + i + 1
                return result
            shift += 7
        self.fail(f"varint for {what} longer than {_MAX_VARINT_BYTES} bytes")

    def uvarints(self, n: int) -> list[int] | None:
        """``n`` varints in a row, or None if they are not all there (the caller then
        reads them one by one with :meth:`uvarint`, which names what is wrong).

        A leader reads a lag per partition of every member: one slice when they all
        fit in a byte (caught-up stores), else one loop without a call per value.
        """
        body, pos = self.body, self.pos
        chunk = body[pos : pos + n]
        if len(chunk) == n and max(chunk, default=0) < 0x80:
            self.pos = pos + n
            return list(chunk)
        out: list[int] = []
        value = shift = 0
        limit = 7 * _MAX_VARINT_BYTES
        for end, byte in enumerate(body[pos:], pos):
            if byte < 0x80:
                out.append(value | byte << shift)
                if len(out) == n:
                    self.pos = end + 1
                    return out
                value = shift = 0
            else:
                value |= (byte & 0x7F) << shift
                shift += 7
                if shift == limit:
                    return None
        return None

    def count(self, what: str) -> int:
        """A count of following items; each takes at least one byte, which bounds it."""
        value = self.uvarint(what)
        if value > len(self.body) - self.pos:
            self.fail(f"{what} {value} exceeds the {len(self.body) - self.pos} bytes left")
        return value

    def raw_str(self, what: str, length: int) -> str:
        end = self.pos + length
        if end > len(self.body):
            self.fail(f"truncated inside {what} ({length} bytes declared)")
        try:
            value = self.body[self.pos : end].decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not valid UTF-8")
        self.pos = end
        return value

    def text(self, what: str) -> str:
        return self.raw_str(what, self.uvarint(f"length of {what}"))

    def optional_str(self, what: str) -> str | None:
        length = self.uvarint(f"length of {what}")
        return None if length == 0 else self.raw_str(what, length - 1)

    def partition_set(self, what: str) -> tuple[int, ...]:
        start = self.pos
        n = self.uvarint(f"size of {what}")
        if n == 0:
            return ()
        self.partitions_decoded += n
        if self.partitions_decoded > MAX_DECODED_PARTITIONS:
            self.fail(f"more than {MAX_DECODED_PARTITIONS} partitions declared")
        current = self.uvarint(f"first partition of {what}")
        out = [current]
        gap_what, run_what = f"gap in {what}", f"run length in {what}"
        while len(out) < n:
            run = self.uvarint(gap_what)
            delta = (run >> 1) + 1
            repeat = self.uvarint(run_what) + 2 if run & 1 else 1
            if repeat > n - len(out):
                self.fail(f"run in {what} overshoots its declared size {n}")
            out.extend(range(current + delta, current + delta * repeat + 1, delta))
            current = out[-1]
        if current > MAX_PARTITION:
            self.fail(f"partition {current} in {what} above {MAX_PARTITION}")
        parts = tuple(out)
        self.sets_read.append((self.body[start : self.pos], parts))
        return parts

    def set_read_before(self) -> tuple[int, ...] | None:
        """The tuple of a partition set encoded here exactly as one read before, or None.

        An encoding is self-delimiting and decodes the same way each time, so the
        bytes match only where reading them would give that tuple again. The
        ``owned`` map repeats its set for every co-partitioned topic (and it is
        the active set of the table): read once, the tuple is shared.
        """
        body, pos = self.body, self.pos
        for raw, parts in self.sets_read:
            if body.startswith(raw, pos):
                if self.partitions_decoded + len(parts) > MAX_DECODED_PARTITIONS:
                    return None  # read it, to fail where it would
                self.partitions_decoded += len(parts)
                self.pos = pos + len(raw)
                return parts
        return None

    def short_text(self) -> str | None:
        """A string whose length fits in one byte, or None (then :meth:`text` reads it and
        says what is wrong, if anything): topic names, without building error labels."""
        body, pos = self.body, self.pos
        if pos >= len(body) or body[pos] >= 0x80:
            return None
        end = pos + 1 + body[pos]
        if end > len(body):
            return None
        try:
            value = body[pos + 1 : end].decode("utf-8")
        except UnicodeDecodeError:
            return None
        self.pos = end
        return value

    def tables(self) -> tuple[list[str], list[tuple[int, ...]]]:
        topics: list[str] = []
        for i in range(self.count("topic count")):
            topic = self.short_text()
            topics.append(self.text(f"topic #{i}") if topic is None else topic)
        if len(set(topics)) != len(topics):
            self.fail("duplicate topic name in the topic table")
        sets = [self.partition_set(f"set #{i}") for i in range(self.count("set count"))]
        return topics, sets

    def topic_ref(self, what: str, topics: list[str]) -> str:
        index = self.uvarint(f"topic reference in {what}")
        if index >= len(topics):
            self.fail(f"topic reference {index} in {what} but only {len(topics)} topics")
        return topics[index]

    def set_ref(self, what: str, sets: list[tuple[int, ...]]) -> tuple[int, ...]:
        index = self.uvarint(f"set reference in {what}")
        if index >= len(sets):
            self.fail(f"set reference {index} in {what} but only {len(sets)} sets")
        return sets[index]

    def topic_map(
        self, what: str, topics: list[str], sets: list[tuple[int, ...]]
    ) -> dict[str, tuple[int, ...]]:
        count = self.count(f"{what} topic count")
        # the usual case at once: one-byte references, in range, no topic twice
        refs = self.body[self.pos : self.pos + 2 * count]
        if (
            len(refs) == 2 * count
            and max(refs, default=0) < 0x80
            and max(refs[::2], default=0) < len(topics)
            and max(refs[1::2], default=0) < len(sets)
        ):
            names = map(topics.__getitem__, refs[::2])
            out = dict(zip(names, map(sets.__getitem__, refs[1::2]), strict=True))
            if len(out) == count:
                self.pos += 2 * count
                return out
        out = {}
        for _ in range(count):
            topic = self.topic_ref(what, topics)
            if topic in out:
                self.fail(f"duplicate topic {topic!r} in {what}")
            out[topic] = self.set_ref(f"{what} of {topic!r}", sets)
        return out

    def inline_map(self, what: str) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for _ in range(self.count(f"{what} topic count")):
            topic = self.short_text()
            if topic is None:
                topic = self.text(f"topic name in {what}")
            if topic in out:
                self.fail(f"duplicate topic {topic!r} in {what}")
            parts = self.set_read_before()
            out[topic] = self.partition_set(f"{what} of {topic!r}") if parts is None else parts
        return out

    def finish(self, minor: int) -> None:
        """Trailing bytes are fields appended by a newer minor version, or corruption."""
        if self.pos < len(self.body) and minor <= MINOR_VERSION:
            self.fail(f"{len(self.body) - self.pos} unexpected trailing bytes")
