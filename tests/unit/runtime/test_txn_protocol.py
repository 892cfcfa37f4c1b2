"""The KIP-447 requests of streamjoin/runtime/group/txn_protocol.py, without a broker.

Requests are checked byte for byte against encodings written out by hand from Kafka's
message definitions (compact strings and arrays are an unsigned varint of length + 1, 0 for
null; every struct ends in its tagged fields), then decoded back through their schema.
Responses are decoded from hand-built bytes. The helpers run against a fake client that
prepares each request from the broker's version ranges, as aiokafka's connection does.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

import pytest
from aiokafka.protocol.api import RequestHeader_v2, ResponseHeader_v1
from aiokafka.protocol.coordination import FindCoordinatorResponse_v1
from aiokafka.protocol.transaction import AddOffsetsToTxnRequest_v0, AddOffsetsToTxnResponse_v0

from streamjoin.errors import TransactionError
from streamjoin.runtime.group.txn_protocol import (
    ErrorCode,
    OffsetFetchRequest_v7,
    OffsetFetchResponse_v7,
    StableOffsetFetchRequest,
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequest_v3,
    TxnOffsetCommitResponse_v3,
    add_offsets_to_txn,
    error_name,
    fetch_committed,
    find_group_coordinator,
    find_transaction_coordinator,
    txn_offset_commit,
)

#: the ranges Apache Kafka 4.3 answers ApiVersions with, for the APIs used here
KAFKA_4_3 = {9: (1, 10), 10: (0, 6), 25: (0, 4), 28: (0, 5)}


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def cstr(s: str | None) -> bytes:
    """A compact (nullable) string of fewer than 127 bytes."""
    if s is None:
        return b"\x00"
    data = s.encode()
    return bytes([len(data) + 1]) + data


def carr(n: int | None) -> bytes:
    """The length prefix of a compact array of fewer than 127 items."""
    return b"\x00" if n is None else bytes([n + 1])


NO_TAGS = b"\x00"


def commit_request(**overrides: Any) -> TxnOffsetCommitRequest:
    args: dict[str, Any] = {
        "transactional_id": "tx",
        "group_id": "g",
        "producer_id": 42,
        "producer_epoch": 3,
        "generation_id": 7,
        "member_id": "m",
        "group_instance_id": None,
        "offsets": {("t", 1): 11, ("t", 0): 10},
    }
    args.update(overrides)
    return TxnOffsetCommitRequest(**args)


# -- TxnOffsetCommit v3 ----------------------------------------------------------------------


def test_txn_offset_commit_v3_encodes_as_kafka_defines_it() -> None:
    built = commit_request().prepare(KAFKA_4_3)
    assert type(built) is TxnOffsetCommitRequest_v3
    expected = (
        cstr("tx")  # transactional_id
        + cstr("g")  # group_id
        + i64(42)  # producer_id
        + i16(3)  # producer_epoch
        + i32(7)  # generation_id
        + cstr("m")  # member_id
        + cstr(None)  # group_instance_id
        + carr(1)  # topics
        + cstr("t")
        + carr(2)  # partitions, in partition order
        + (i32(0) + i64(10) + i32(-1) + cstr(None) + NO_TAGS)
        + (i32(1) + i64(11) + i32(-1) + cstr(None) + NO_TAGS)
        + NO_TAGS  # topic
        + NO_TAGS  # request
    )
    assert built.encode() == expected


def test_txn_offset_commit_v3_round_trips_through_its_schema() -> None:
    request = commit_request(
        group_instance_id="worker-1",
        offsets={("b", 2): 2**40, ("a", 0): 0, ("b", 0): 5},
    )
    built = request.prepare(KAFKA_4_3)
    decoded = TxnOffsetCommitRequest_v3.decode(built.encode())
    assert decoded == built
    assert decoded.to_object() == {
        "transactional_id": "tx",
        "group_id": "g",
        "producer_id": 42,
        "producer_epoch": 3,
        "generation_id": 7,
        "member_id": "m",
        "group_instance_id": "worker-1",
        "topics": [
            {
                "name": "a",
                "partitions": [
                    {
                        "partition_index": 0,
                        "committed_offset": 0,
                        "committed_leader_epoch": -1,
                        "committed_metadata": None,
                        "tags": {},
                    }
                ],
                "tags": {},
            },
            {
                "name": "b",
                "partitions": [
                    {
                        "partition_index": 0,
                        "committed_offset": 5,
                        "committed_leader_epoch": -1,
                        "committed_metadata": None,
                        "tags": {},
                    },
                    {
                        "partition_index": 2,
                        "committed_offset": 2**40,
                        "committed_leader_epoch": -1,
                        "committed_metadata": None,
                        "tags": {},
                    },
                ],
                "tags": {},
            },
        ],
        "tags": {},
    }


def test_txn_offset_commit_v3_response_decodes() -> None:
    data = (
        i32(25)  # throttle_time_ms
        + carr(1)
        + cstr("t")
        + carr(2)
        + (i32(0) + i16(0) + NO_TAGS)
        + (i32(1) + i16(22) + NO_TAGS)
        + NO_TAGS
        + NO_TAGS
    )
    response = TxnOffsetCommitResponse_v3.decode(data)
    assert response.throttle_time_ms == 25
    assert response.topics == [("t", [(0, 0, {}), (1, 22, {})], {})]


# -- OffsetFetch v7 --------------------------------------------------------------------------


def test_offset_fetch_v7_encodes_as_kafka_defines_it() -> None:
    request = StableOffsetFetchRequest(
        group_id="g", partitions=[("t", 1), ("t", 0), ("t", 1)], require_stable=True
    )
    built = request.prepare(KAFKA_4_3)
    assert type(built) is OffsetFetchRequest_v7
    expected = (
        cstr("g")
        + carr(1)
        + cstr("t")
        + carr(2)
        + i32(0)
        + i32(1)
        + NO_TAGS  # topic
        + b"\x01"  # require_stable
        + NO_TAGS
    )
    assert built.encode() == expected
    assert OffsetFetchRequest_v7.decode(expected) == built


def test_offset_fetch_v7_for_all_partitions_sends_null_topics() -> None:
    built = StableOffsetFetchRequest(group_id="g", partitions=None, require_stable=False).prepare(
        KAFKA_4_3
    )
    assert built.encode() == cstr("g") + carr(None) + b"\x00" + NO_TAGS
    decoded = OffsetFetchRequest_v7.decode(built.encode())
    assert decoded.topics is None
    assert decoded.require_stable is False


def test_offset_fetch_v7_response_decodes_including_unknown_tagged_fields() -> None:
    data = (
        i32(0)
        + carr(1)
        + cstr("t")
        + carr(2)
        + (i32(0) + i64(5) + i32(-1) + cstr("") + i16(0) + NO_TAGS)
        # a partition pending in a transaction, with a tagged field this version does not know
        + (i32(1) + i64(-1) + i32(-1) + cstr(None) + i16(88) + b"\x01\x05\x01\x2a")
        + NO_TAGS
        + i16(0)  # top-level error_code
        + NO_TAGS
    )
    response = OffsetFetchResponse_v7.decode(data)
    assert response.error_code == 0
    assert response.topics == [
        ("t", [(0, 5, -1, "", 0, {}), (1, -1, -1, None, 88, {5: b"\x2a"})], {})
    ]


# -- headers and versions --------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        commit_request(),
        StableOffsetFetchRequest(group_id="g", partitions=None, require_stable=True),
    ],
    ids=["TxnOffsetCommit", "OffsetFetch"],
)
def test_flexible_versions_use_the_flexible_headers(request_: Any) -> None:
    built = request_.prepare(KAFKA_4_3)
    assert built.FLEXIBLE_VERSION
    header = built.build_request_header(correlation_id=9, client_id="c")
    assert isinstance(header, RequestHeader_v2)
    # api key, version, correlation id, client id (a plain nullable string), no tagged fields
    assert header.encode() == (
        i16(built.API_KEY) + i16(built.API_VERSION) + i32(9) + i16(1) + b"c" + NO_TAGS
    )
    parsed = built.parse_response_header(i32(9) + NO_TAGS)
    assert isinstance(parsed, ResponseHeader_v1)
    assert parsed.correlation_id == 9


@pytest.mark.parametrize(
    ("request_", "version"),
    [
        (commit_request(), 3),
        (StableOffsetFetchRequest(group_id="g", partitions=None, require_stable=True), 7),
    ],
    ids=["TxnOffsetCommit", "OffsetFetch"],
)
def test_each_wrapper_builds_its_one_version(request_: Any, version: int) -> None:
    key = request_.API_KEY
    built_version = request_.prepare({key: (version, version)}).API_VERSION
    assert built_version == version
    with pytest.raises(NotImplementedError):
        request_.prepare({key: (0, version - 1)})


# -- the helpers, against a fake client ------------------------------------------------------


class FakeClient:
    """Prepares and encodes each request for the broker's version ranges (as aiokafka's
    connection does) and answers from a queue of response structs."""

    def __init__(self, *answers: Any, versions: dict[int, tuple[int, int]] = KAFKA_4_3) -> None:
        self.answers = deque(answers)
        self.versions = versions
        self.sent: list[tuple[int, Any]] = []
        self.nodes = [1]

    def get_random_node(self) -> int | None:
        return self.nodes[0] if self.nodes else None

    async def send(self, node_id: int, request: Any) -> Any:
        built = request.prepare(self.versions)
        built.encode()
        self.sent.append((node_id, built))
        return self.answers.popleft()


async def test_txn_offset_commit_returns_the_error_code_of_every_partition() -> None:
    answer = TxnOffsetCommitResponse_v3(
        0, [("t", [(0, 0, {}), (1, ErrorCode.ILLEGAL_GENERATION, {})], {})], {}
    )
    client = FakeClient(answer)
    codes = await txn_offset_commit(
        client,
        3,
        transactional_id="tx",
        group_id="g",
        producer_id=42,
        producer_epoch=3,
        generation_id=7,
        member_id="m",
        group_instance_id="i",
        offsets={("t", 0): 10, ("t", 1): 11},
    )
    assert codes == {("t", 0): 0, ("t", 1): ErrorCode.ILLEGAL_GENERATION}
    [(node, sent)] = client.sent
    assert node == 3
    assert (sent.generation_id, sent.member_id, sent.group_instance_id) == (7, "m", "i")


async def test_txn_offset_commit_of_nothing_sends_nothing() -> None:
    client = FakeClient()
    codes = await txn_offset_commit(
        client,
        3,
        transactional_id="tx",
        group_id="g",
        producer_id=42,
        producer_epoch=3,
        generation_id=7,
        member_id="m",
        group_instance_id=None,
        offsets={},
    )
    assert codes == {}
    assert client.sent == []


async def test_fetch_committed_keeps_partitions_without_an_offset() -> None:
    answer = OffsetFetchResponse_v7(
        0,
        [
            (
                "t",
                [
                    (0, 5, -1, "", 0, {}),
                    (1, -1, -1, None, 0, {}),
                    (2, -1, -1, None, ErrorCode.UNSTABLE_OFFSET_COMMIT, {}),
                ],
                {},
            )
        ],
        0,
        {},
    )
    client = FakeClient(answer)
    top, offsets = await fetch_committed(
        client, 3, group_id="g", partitions=[("t", 0), ("t", 1), ("t", 2)], require_stable=True
    )
    assert top == ErrorCode.NONE
    assert offsets == {
        ("t", 0): (5, 0),
        ("t", 1): (-1, 0),
        ("t", 2): (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT),
    }
    [(_node, sent)] = client.sent
    assert sent.require_stable is True


async def test_fetch_committed_returns_the_top_level_error() -> None:
    client = FakeClient(OffsetFetchResponse_v7(0, [], ErrorCode.NOT_COORDINATOR, {}))
    assert await fetch_committed(
        client, 3, group_id="g", partitions=[("t", 0)], require_stable=True
    ) == (ErrorCode.NOT_COORDINATOR, {})


async def test_add_offsets_to_txn_uses_aiokafkas_request() -> None:
    client = FakeClient(AddOffsetsToTxnResponse_v0(0, ErrorCode.CONCURRENT_TRANSACTIONS))
    code = await add_offsets_to_txn(
        client, 2, transactional_id="tx", producer_id=42, producer_epoch=3, group_id="g"
    )
    assert code == ErrorCode.CONCURRENT_TRANSACTIONS
    [(node, sent)] = client.sent
    assert node == 2
    assert type(sent) is AddOffsetsToTxnRequest_v0
    assert (sent.transactional_id, sent.group_id) == ("tx", "g")


async def test_find_transaction_coordinator_asks_with_key_type_1() -> None:
    client = FakeClient(FindCoordinatorResponse_v1(0, 0, None, 4, "127.0.0.1", 9092))
    assert await find_transaction_coordinator(client, "tx") == 4
    [(_node, sent)] = client.sent
    assert (sent.API_VERSION, sent.coordinator_key, sent.coordinator_type) == (1, "tx", 1)


async def test_find_group_coordinator_asks_with_key_type_0() -> None:
    client = FakeClient(FindCoordinatorResponse_v1(0, 0, None, 4, "127.0.0.1", 9092))
    assert await find_group_coordinator(client, "g") == 4
    [(_node, sent)] = client.sent
    assert (sent.coordinator_key, sent.coordinator_type) == ("g", 0)


async def test_find_transaction_coordinator_raises_the_brokers_error() -> None:
    answer = FindCoordinatorResponse_v1(0, 15, "not ready yet", -1, "", -1)
    with pytest.raises(TransactionError, match=r"COORDINATOR_NOT_AVAILABLE \(not ready yet\)") as e:
        await find_transaction_coordinator(FakeClient(answer), "tx")
    assert e.value.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE


async def test_find_transaction_coordinator_needs_a_bootstrapped_client() -> None:
    client = FakeClient()
    client.nodes = []
    with pytest.raises(TransactionError, match="bootstrap"):
        await find_transaction_coordinator(client, "tx")


async def test_a_broker_without_the_version_is_a_transaction_error() -> None:
    client = FakeClient(versions={9: (1, 5)})
    with pytest.raises(TransactionError, match="StableOffsetFetchRequest"):
        await fetch_committed(client, 1, group_id="g", partitions=None, require_stable=True)
    client = FakeClient(versions={})
    with pytest.raises(TransactionError, match="TxnOffsetCommitRequest"):
        await txn_offset_commit(
            client,
            1,
            transactional_id="tx",
            group_id="g",
            producer_id=1,
            producer_epoch=0,
            generation_id=1,
            member_id="m",
            group_instance_id=None,
            offsets={("t", 0): 1},
        )


def test_error_names() -> None:
    assert error_name(88) == "UNSTABLE_OFFSET_COMMIT"
    assert error_name(1234) == "error code 1234"
    # the numbers callers rely on (Kafka's Errors.java)
    assert {c.name: c.value for c in ErrorCode}.items() >= {
        "COORDINATOR_LOAD_IN_PROGRESS": 14,
        "COORDINATOR_NOT_AVAILABLE": 15,
        "NOT_COORDINATOR": 16,
        "ILLEGAL_GENERATION": 22,
        "UNKNOWN_MEMBER_ID": 25,
        "REBALANCE_IN_PROGRESS": 27,
        "INVALID_PRODUCER_EPOCH": 47,
        "INVALID_TXN_STATE": 48,
        "CONCURRENT_TRANSACTIONS": 51,
        "FENCED_INSTANCE_ID": 82,
        "UNSTABLE_OFFSET_COMMIT": 88,
        "PRODUCER_FENCED": 90,
    }.items()
