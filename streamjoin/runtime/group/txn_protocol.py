"""The Kafka requests exactly-once processing (KIP-447) needs and aiokafka 0.14 lacks.

aiokafka's own ``TxnOffsetCommitRequest`` is v0 only: it cannot carry the committing
member's generation, member id and instance id, so the group coordinator cannot refuse a
commit from a member that was rebalanced out (a "zombie"). Its ``OffsetFetchRequest`` stops
at v3, before ``require_stable``, so a member taking over a partition cannot ask to be told
(UNSTABLE_OFFSET_COMMIT) that an offset is still pending in an open transaction instead of
reading the offset from before it. This module adds:

* :class:`TxnOffsetCommitRequest` (API key 28, v3, flexible) and its response;
* :class:`StableOffsetFetchRequest` (API key 9, v7, flexible) and its response;
* async helpers that send them, aiokafka's ``AddOffsetsToTxnRequest`` and
  ``FindCoordinatorRequest`` through an :class:`aiokafka.AIOKafkaClient` to the node the
  caller names, and return the broker's error codes (:class:`ErrorCode`). They know nothing
  of streamjoin's runtime: retries, backoff and what an error means are the caller's.

The field lists follow Kafka's message definitions (``TxnOffsetCommitRequest.json``,
``TxnOffsetCommitResponse.json``, ``OffsetFetchRequest.json``, ``OffsetFetchResponse.json``
in ``clients/src/main/resources/common/message``). Flexible versions use compact strings
and arrays, end every struct (the message and each array element) in tagged fields, and are
sent with request header v2 (aiokafka picks it from ``FLEXIBLE_VERSION``). Apache Kafka 4.3
answers ApiVersions with TxnOffsetCommit v0-v5, OffsetFetch v1-v10, AddOffsetsToTxn v0-v4
and FindCoordinator v0-v6; each wrapper here builds only the one version it is named for,
which ``Request.prepare`` picks while the broker's range holds it (aiokafka's
AddOffsetsToTxn is v0 only, its FindCoordinator v0-v1: v1 is sent, the first with a key type).

Committing offsets in a transaction, as the Java producer's ``sendOffsetsToTransaction``
does: AddOffsetsToTxn to the *transaction* coordinator (the group's offsets partition joins
the transaction), then TxnOffsetCommit to the *group* coordinator (the offsets stay pending
until the transaction ends), then EndTxn.

With aiokafka's producer running the rest of the transaction, tell its transaction manager
the group was added, ``producer._txn_manager.consumer_group_added(group_id)`` (a private
attribute; the producer id and epoch to send are ``producer._txn_manager.producer_id`` and
``.producer_epoch``). Otherwise a transaction that produced no records looks empty to
aiokafka, whose ``commit_transaction()`` and ``abort_transaction()`` then return without
sending EndTxn: the transaction stays open on the broker with the offsets pending (until the
transaction timeout aborts it), and the producer's next transaction, being the same broker
transaction (same producer epoch), ends them with its own. An offsets-only "abort" followed
by a commit thus commits the aborted offsets. The mark is cleared when the transaction ends.

What Apache Kafka 4.3 answers (classic group; tests/integration/test_txn_protocol.py):

* TxnOffsetCommit, per partition: NONE when pending; ILLEGAL_GENERATION for another
  generation of a known member; UNKNOWN_MEMBER_ID for a member id the group does not have
  (whatever the generation), and for a ``group_instance_id`` the member was not given;
  INVALID_TXN_STATE when the group was not added to the transaction (no AddOffsetsToTxn);
  INVALID_PRODUCER_EPOCH for another producer epoch. Generation -1 with member id ``""`` is
  accepted with no fencing at all (the pre-KIP-447 form).
* OffsetFetch with ``require_stable``: UNSTABLE_OFFSET_COMMIT *per partition* (offset -1;
  the top-level code stays NONE) for each partition with an offset pending in an open
  transaction; the other partitions answer as usual. Without ``require_stable`` the pending
  offset is never shown: the last committed one is (-1 if none). With ``partitions=None``
  a partition whose only offset is pending is left out rather than reported unstable, so
  name the partitions. Right after EndTxn the answer can still be UNSTABLE_OFFSET_COMMIT
  for a moment, until the transaction's marker reaches the offsets partition: retry.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiokafka
from aiokafka import AIOKafkaClient
from aiokafka.errors import IncompatibleBrokerVersion

from streamjoin.errors import StartupError, TransactionError

try:  # aiokafka's protocol classes, undocumented: the requests below are built on them
    from aiokafka.protocol.api import Request, RequestStruct, Response
    from aiokafka.protocol.coordination import FindCoordinatorRequest
    from aiokafka.protocol.transaction import AddOffsetsToTxnRequest
    from aiokafka.protocol.types import (
        Boolean,
        CompactArray,
        CompactString,
        Int16,
        Int32,
        Int64,
        Schema,
        TaggedFields,
    )
except ImportError as missing:  # pragma: no cover - an aiokafka that moved them
    raise StartupError(
        f"aiokafka {aiokafka.__version__}: {missing}; streamjoin's group offset requests "
        "are built on aiokafka 0.14's protocol classes: install a tested aiokafka (see "
        "pyproject.toml)"
    ) from missing

__all__ = [
    "ErrorCode",
    "OffsetFetchRequest_v7",
    "OffsetFetchResponse_v7",
    "StableOffsetFetchRequest",
    "TxnOffsetCommitRequest",
    "TxnOffsetCommitRequest_v3",
    "TxnOffsetCommitResponse_v3",
    "add_offsets_to_txn",
    "check_protocol",
    "error_name",
    "fetch_committed",
    "find_group_coordinator",
    "find_transaction_coordinator",
    "txn_offset_commit",
]

TP = tuple[str, int]

#: FindCoordinator key types
GROUP_KEY = 0
TRANSACTION_KEY = 1

#: "no leader epoch known": the committed leader epoch we send, the one a fetch may return
NO_LEADER_EPOCH = -1


class ErrorCode(enum.IntEnum):
    """Kafka error codes these requests answer with (numbers from Kafka's ``Errors.java``)."""

    NONE = 0
    UNKNOWN_TOPIC_OR_PARTITION = 3
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    ILLEGAL_GENERATION = 22
    UNKNOWN_MEMBER_ID = 25
    REBALANCE_IN_PROGRESS = 27
    GROUP_AUTHORIZATION_FAILED = 30
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    FENCED_INSTANCE_ID = 82
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90


#: answers meaning a newer producer took over this transactional id (or the broker bumped
#: its epoch after a transaction timeout): the producer can commit nothing any more
PRODUCER_FENCED_CODES = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})


def error_name(code: int) -> str:
    """``"ILLEGAL_GENERATION"`` for 22; ``"error code N"`` for a code not in :class:`ErrorCode`."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error code {code}"


# -- TxnOffsetCommit v3 (API key 28) ---------------------------------------------------------


class TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]
    API_KEY = 28
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest_v3(RequestStruct):  # type: ignore[misc]
    """v3 (KIP-447) adds the member's generation, member id and instance id, so the group
    coordinator fences commits from members the group no longer has at that generation."""

    FLEXIBLE_VERSION = True
    API_KEY = 28
    API_VERSION = 3
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),  # nullable
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("committed_metadata", CompactString("utf-8")),  # nullable
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest(Request[TxnOffsetCommitRequest_v3]):  # type: ignore[misc]
    """TxnOffsetCommit with the committing member (v3): ``offsets`` maps ``(topic, partition)``
    to the next offset to consume; no leader epoch (-1) and no metadata (null) are sent."""

    API_KEY = 28

    def __init__(
        self,
        *,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TP, int],
    ) -> None:
        self.transactional_id = transactional_id
        self.group_id = group_id
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.generation_id = generation_id
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.offsets = dict(offsets)

    def build(self, request_struct_class: type[TxnOffsetCommitRequest_v3]) -> Any:
        by_topic: dict[str, list[tuple[int, int, int, str | None, dict[int, bytes]]]] = {}
        for (topic, partition), offset in sorted(self.offsets.items()):
            by_topic.setdefault(topic, []).append((partition, offset, NO_LEADER_EPOCH, None, {}))
        return request_struct_class(
            self.transactional_id,
            self.group_id,
            self.producer_id,
            self.producer_epoch,
            self.generation_id,
            self.member_id,
            self.group_instance_id,
            [(topic, partitions, {}) for topic, partitions in by_topic.items()],
            {},
        )


# -- OffsetFetch v7 (API key 9) --------------------------------------------------------------


class OffsetFetchResponse_v7(Response):  # type: ignore[misc]
    API_KEY = 9
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("metadata", CompactString("utf-8")),  # nullable
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest_v7(RequestStruct):  # type: ignore[misc]
    """v7 (KIP-447) adds ``require_stable``: partitions with offsets pending in an open
    transaction answer UNSTABLE_OFFSET_COMMIT instead of their last stable offset."""

    FLEXIBLE_VERSION = True
    API_KEY = 9
    API_VERSION = 7
    RESPONSE_TYPE = OffsetFetchResponse_v7
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        (
            "topics",  # nullable: null asks for every partition the group has an offset for
            CompactArray(
                ("name", CompactString("utf-8")),
                ("partition_indexes", CompactArray(Int32)),
                ("tags", TaggedFields),
            ),
        ),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class StableOffsetFetchRequest(Request[OffsetFetchRequest_v7]):  # type: ignore[misc]
    """OffsetFetch v7 of ``partitions`` (``None``: all the group's committed partitions)."""

    API_KEY = 9

    def __init__(
        self, *, group_id: str, partitions: Iterable[TP] | None, require_stable: bool
    ) -> None:
        self.group_id = group_id
        self.partitions = None if partitions is None else sorted(set(partitions))
        self.require_stable = require_stable

    def build(self, request_struct_class: type[OffsetFetchRequest_v7]) -> Any:
        topics: list[tuple[str, list[int], dict[int, bytes]]] | None = None
        if self.partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in self.partitions:
                by_topic.setdefault(topic, []).append(partition)
            topics = [(topic, indexes, {}) for topic, indexes in by_topic.items()]
        return request_struct_class(self.group_id, topics, self.require_stable, {})


# -- the seam check --------------------------------------------------------------------------

#: known answers: each request encoded as Kafka's message definitions say (the unit tests
#: spell these bytes out field by field)
_KNOWN_ENCODINGS: tuple[tuple[Callable[[], Any], str], ...] = (
    (
        lambda: TxnOffsetCommitRequest(
            transactional_id="tx",
            group_id="g",
            producer_id=42,
            producer_epoch=3,
            generation_id=7,
            member_id="m",
            group_instance_id=None,
            offsets={("t", 1): 11, ("t", 0): 10},
        ).prepare({28: (3, 3)}),
        "0374780267000000000000002a000300000007026d000202740300000000000000000000000affffffff"
        "000000000001000000000000000bffffffff00000000",
    ),
    (
        lambda: StableOffsetFetchRequest(
            group_id="g", partitions=[("t", 1), ("t", 0)], require_stable=True
        ).prepare({9: (7, 7)}),
        "0267020274030000000000000001000100",
    ),
)


def check_protocol() -> None:
    """Raise :class:`StartupError` unless this aiokafka's protocol classes still encode the
    requests of this module as Kafka defines them (they were written against aiokafka
    0.14): run at start, so a changed encoder stops the worker there, instead of sending
    requests a broker would misread."""
    for build, expected in _KNOWN_ENCODINGS:
        try:
            request = build()
            encoded = bytes(request.encode()).hex()
            problem = None if encoded == expected else f"encodes {encoded}, not {expected}"
        except Exception as exc:
            request, problem = None, repr(exc)
        if problem is not None:
            name = type(request).__name__ if request is not None else "a request"
            raise StartupError(
                f"aiokafka {aiokafka.__version__}: {name} built on its protocol classes "
                f"{problem}; streamjoin's group offset requests were written against "
                "aiokafka 0.14: install a tested aiokafka (see pyproject.toml)"
            )


# -- helpers ---------------------------------------------------------------------------------


async def _send(client: AIOKafkaClient, node_id: int, request: Any) -> Any:
    """Send ``request`` to ``node_id``; a version the broker does not serve is a
    :class:`TransactionError` (network errors are aiokafka's ``KafkaError``, as sent)."""
    try:
        return await client.send(node_id, request)
    except (IncompatibleBrokerVersion, NotImplementedError) as exc:
        # Request.prepare raises NotImplementedError when none of the wrapper's versions is
        # in the broker's range, IncompatibleBrokerVersion when the broker lacks the API
        raise TransactionError(
            f"broker {node_id} does not serve {type(request).__name__} in the version "
            f"streamjoin sends (Kafka 2.5+ is needed for exactly-once): {exc}"
        ) from exc


async def txn_offset_commit(
    client: AIOKafkaClient,
    node_id: int,
    *,
    transactional_id: str,
    group_id: str,
    producer_id: int,
    producer_epoch: int,
    generation_id: int,
    member_id: str,
    group_instance_id: str | None,
    offsets: Mapping[TP, int],
) -> dict[TP, int]:
    """Commit ``offsets`` in the producer's open transaction, as this member at this
    generation (TxnOffsetCommit v3, sent to the *group* coordinator ``node_id``, after
    :func:`add_offsets_to_txn`). Returns the broker's error code per partition (0 = pending
    in the transaction; it is committed or dropped with it)."""
    if not offsets:
        return {}
    request = TxnOffsetCommitRequest(
        transactional_id=transactional_id,
        group_id=group_id,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        generation_id=generation_id,
        member_id=member_id,
        group_instance_id=group_instance_id,
        offsets=offsets,
    )
    response = await _send(client, node_id, request)
    return {
        (topic, partition): code
        for topic, partitions, _tags in response.topics
        for partition, code, _ptags in partitions
    }


async def fetch_committed(
    client: AIOKafkaClient,
    node_id: int,
    *,
    group_id: str,
    partitions: Iterable[TP] | None,
    require_stable: bool,
) -> tuple[int, dict[TP, tuple[int, int]]]:
    """The group's committed offsets (OffsetFetch v7, sent to the group coordinator
    ``node_id``): ``(top-level error code, {tp: (offset, error code)})``. Every partition the
    broker answers for is there, a partition without a committed offset with offset -1.
    With ``require_stable``, a partition whose offset is pending in an open transaction
    answers UNSTABLE_OFFSET_COMMIT (retriable: ask again once the transaction ended).
    ``partitions=None`` asks for every partition the group has an offset for."""
    request = StableOffsetFetchRequest(
        group_id=group_id, partitions=partitions, require_stable=require_stable
    )
    response = await _send(client, node_id, request)
    out = {
        (topic, partition): (offset, code)
        for topic, answered, _tags in response.topics
        for partition, offset, _epoch, _metadata, code, _ptags in answered
    }
    return response.error_code, out


async def add_offsets_to_txn(
    client: AIOKafkaClient,
    node_id: int,
    *,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    group_id: str,
) -> int:
    """Add ``group_id``'s offsets partition to the producer's open transaction
    (AddOffsetsToTxn, aiokafka's v0, sent to the *transaction* coordinator ``node_id``);
    the broker's error code (0 = added). Needed before :func:`txn_offset_commit`."""
    request = AddOffsetsToTxnRequest(transactional_id, producer_id, producer_epoch, group_id)
    response = await _send(client, node_id, request)
    code: int = response.error_code
    return code


async def find_transaction_coordinator(client: AIOKafkaClient, transactional_id: str) -> int:
    """Node id of ``transactional_id``'s transaction coordinator (FindCoordinator v1+, key
    type 1). Raises :class:`TransactionError` (with ``error_code``) when the broker answers an
    error: COORDINATOR_NOT_AVAILABLE, for one, while the transaction state topic is being
    created or loaded, which a caller may retry."""
    return await _find_coordinator(client, transactional_id, TRANSACTION_KEY)


async def find_group_coordinator(client: AIOKafkaClient, group_id: str) -> int:
    """Node id of ``group_id``'s group coordinator (FindCoordinator, key type 0); errors as
    :func:`find_transaction_coordinator`."""
    return await _find_coordinator(client, group_id, GROUP_KEY)


async def _find_coordinator(client: AIOKafkaClient, key: str, key_type: int) -> int:
    node_id = client.get_random_node()
    if node_id is None:
        raise TransactionError("the client knows no broker yet: bootstrap it first")
    response = await _send(client, node_id, FindCoordinatorRequest(key, key_type))
    what = "transaction" if key_type == TRANSACTION_KEY else "group"
    if response.error_code != ErrorCode.NONE:
        message = getattr(response, "error_message", None)
        raise TransactionError(
            f"finding the {what} coordinator of {key!r}: {error_name(response.error_code)}"
            + (f" ({message})" if message else ""),
            error_code=response.error_code,
        )
    coordinator: int = response.coordinator_id
    return coordinator
