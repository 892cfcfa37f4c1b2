"""Every error streamjoin raises on purpose, under one root: :class:`StreamjoinError`.

This module sits below every other layer and imports nothing from streamjoin, so
any module can raise these and any caller can import them cheaply. Import errors
from here (``from streamjoin.errors import DecodeError``); no other module
re-exports them. ``streamjoin.StreamjoinError`` is the root.

One class per failure a caller handles differently; a failure nobody tells apart
from its family is that family, with a message saying what happened. Where an
error is naturally a built-in exception, that built-in stays a base, so
``except ValueError`` around a declaration or ``except LookupError`` around a
lookup keeps working::

    StreamjoinError
    ├── ConfigurationError (ValueError)     declarations, settings, argument values
    │   ├── CopartitioningError             co-partitioned inputs disagree
    │   └── StateDirInUse                   another worker holds the state dir
    ├── ArgumentTypeError (TypeError)       an argument of the wrong type
    ├── NotFoundError (LookupError)         AppNotFound, UnknownTopicError (KeyError)
    ├── CodecError (ValueError)             EncodeError, DecodeError
    ├── StateError                          StoreError (StoreCorrupted, StoreLocked),
    │                                       KeyEncodingError (IncompatibleWindowState),
    │                                       ChangelogReadError (ChangelogOffsetOutOfRange),
    │                                       CorruptRecordSet
    ├── ProcessingError                     LifecycleError, AgentFailed, TableAccessError,
    │                                       RecordRejected (RecordTooLargeError),
    │                                       GroupMembershipError (FencedInstanceError),
    │                                       TransactionError, TransactionFailed,
    │                                       MissingFieldError
    ├── JoinError (ValueError)              CorruptJoinState
    ├── AssignorError                       InvalidScenarioError, InvalidAssignmentError,
    │                                       UserdataError (UnsupportedUserdataVersion)
    ├── ProvisioningError (RuntimeError)    OffsetMoveRefused,
    │                                       KafkaProvisioningError (BrokerExitedError)
    ├── StartupError                        the worker cannot start (exit code 3)
    │   └── AccessRefused                   the brokers refused the login or an ACL
    ├── SparkJobError                       SparkNotInstalled (ImportError)
    ├── SchemaRegistryError (RuntimeError)  SchemaNotFound (NotFoundError),
    │                                       IncompatibleSchema (ValueError)
    ├── QueryError                          QueryKeyError, UnknownTableError, KeyNotFound,
    │                                       QueryUnauthorized, QueryUnavailable, QueryFailed
    └── InternalError (RuntimeError)        a broken invariant: a streamjoin bug

``docs/app.md`` ("Errors") says which of them a user catches, and when.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiokafka import TopicPartition

__all__ = [
    "AccessRefused",
    "AgentFailed",
    "AppNotFound",
    "ArgumentTypeError",
    "AssignorError",
    "BrokerExitedError",
    "ChangelogOffsetOutOfRange",
    "ChangelogReadError",
    "CodecError",
    "ConfigurationError",
    "CopartitioningError",
    "CorruptJoinState",
    "CorruptRecordSet",
    "DecodeError",
    "EncodeError",
    "FencedInstanceError",
    "GroupMembershipError",
    "HistoryExpired",
    "IncompatibleSchema",
    "IncompatibleWindowState",
    "InternalError",
    "InvalidAssignmentError",
    "InvalidScenarioError",
    "JoinError",
    "KafkaProvisioningError",
    "KeyEncodingError",
    "KeyNotFound",
    "LifecycleError",
    "MissingFieldError",
    "NotFoundError",
    "OffsetMoveRefused",
    "ProcessingError",
    "ProvisioningError",
    "QueryError",
    "QueryFailed",
    "QueryKeyError",
    "QueryUnauthorized",
    "QueryUnavailable",
    "RecordRejected",
    "RecordTooLargeError",
    "SchemaNotFound",
    "SchemaRegistryError",
    "SparkJobError",
    "SparkNotInstalled",
    "StartupError",
    "StateDirInUse",
    "StateError",
    "StoreCorrupted",
    "StoreError",
    "StoreLocked",
    "StreamjoinError",
    "TableAccessError",
    "TimerFailed",
    "TransactionError",
    "TransactionFailed",
    "UnknownTableError",
    "UnknownTopicError",
    "UnsupportedUserdataVersion",
    "UserdataError",
    "Violation",
    "ViolationCode",
]


class StreamjoinError(Exception):
    """Root of every error streamjoin raises on purpose."""


# -- configuration and API use ---------------------------------------------------------------


class ConfigurationError(StreamjoinError, ValueError):
    """Invalid declarations, settings or argument values (app, topics, agents, codecs,
    windows and window timestamps, join definitions, store options...), or a state
    directory that cannot be created or written; the message says how to fix them.
    Raised when the declaration is made or, for what needs the broker or the disk, when
    the app starts."""


class CopartitioningError(ConfigurationError):
    """Inputs that must be co-partitioned are not: topics of one co-partition group (a join,
    a table and its writers, ``app.copartition``) have different partition counts, an
    existing topic has another count than declared, or (Spark jobs) a record is not in the
    partition Kafka's murmur2 of its key gives. Partition *p* of each input would not hold
    the same keys, so joins and tables would silently miss matches."""


class StateDirInUse(ConfigurationError):
    """Another worker process holds the state directory's lock: two workers sharing one
    directory would overwrite each other's stores and membership file."""

    def __init__(self, path: Path | str, pid: int | None) -> None:
        who = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"state dir {path} in use by {who}; give each worker its own --state-dir")
        self.path = Path(path)
        self.pid = pid


class ArgumentTypeError(StreamjoinError, TypeError):
    """An argument has the wrong type: a bug in the calling code, not bad data (a ``str``
    given to ``Codec.loads``, a non-bytes key written to a store, a ``None`` key given to
    the key partitioner, ``num_partitions`` that is not an int, a class no codec can be
    made from...)."""


class NotFoundError(StreamjoinError, LookupError):
    """Something named does not exist: a table or join the app does not declare, a topic
    missing on the broker, a local store missing under the state dir."""


class AppNotFound(NotFoundError):
    """The ``-A module:attribute`` argument does not name a :class:`streamjoin.App`."""


class UnknownTopicError(NotFoundError, KeyError):
    """A topic is not declared by the app (test driver), or does not exist on the broker
    (Spark jobs). A ``KeyError`` too, as the test driver raised before."""

    def __str__(self) -> str:
        # the message itself, not KeyError's repr of it
        return Exception.__str__(self)


# -- codecs ----------------------------------------------------------------------------------


class CodecError(StreamjoinError, ValueError):
    """A value could not be converted to or from record bytes."""


class EncodeError(CodecError):
    """An object could not be serialized (wrong type, not JSON-able, bad text...)."""


class DecodeError(CodecError):
    """Record bytes could not be deserialized (garbage, wrong schema, bad text...); agents
    apply their ``on_error`` policy to the record."""


# -- local state and changelogs --------------------------------------------------------------


class StateError(StreamjoinError):
    """Base class of local-state errors: stores, sortable keys, changelogs."""


class StoreError(StateError):
    """A store (RocksDB or memory) failed or was misused: used after ``close()``, or
    given a changelog offset older than the one it holds (offsets only move forward, so a
    step back means the caller is replaying or mixing partitions)."""


class StoreCorrupted(StoreError):
    """The store on disk cannot be trusted; the caller wipes it and rebuilds from the changelog."""

    def __init__(self, path: Path | str, cause: str) -> None:
        super().__init__(f"local store at {path} is corrupted: {cause}")
        self.path = Path(path)
        self.cause = cause


class StoreLocked(StoreError):
    """Another process (or another handle in this one) has the store open.

    Kept apart from :class:`StoreCorrupted` on purpose: a locked store is in
    use, and wiping it would destroy a live worker's state.
    """

    def __init__(self, path: Path | str, cause: str) -> None:
        super().__init__(f"local store at {path} is in use by another handle: {cause}")
        self.path = Path(path)
        self.cause = cause


class KeyEncodingError(StateError, ValueError):
    """A value cannot be encoded into, or decoded from, a sortable store key or the
    windowed store layout."""


class IncompatibleWindowState(KeyEncodingError):
    """Windowed state written in another layout (by an earlier streamjoin version).

    Such state cannot be read: the table must be reset (its state directory and
    its changelog topic deleted) and rebuilt from its input.
    """


class ChangelogReadError(StateError, RuntimeError):
    """A changelog could not be read (an error that retrying will not fix), or its log
    start and end offsets make no sense (end before start, or negative)."""


class ChangelogOffsetOutOfRange(ChangelogReadError):
    """The broker no longer (or not yet) has the offsets asked for; plan the restore again."""

    def __init__(self, offsets: Mapping[TopicPartition, int]) -> None:
        listed = ", ".join(f"{tp.topic}[{tp.partition}]@{o}" for tp, o in sorted(offsets.items()))
        super().__init__(f"changelog offsets out of range: {listed}")
        self.offsets = dict(offsets)


class CorruptRecordSet(StateError, ValueError):
    """A fetched changelog record batch failed its CRC check or could not be parsed."""


# -- processing ------------------------------------------------------------------------------


class ProcessingError(StreamjoinError):
    """Base class of errors while the app runs: agents, table access, sends, the group and
    transactions."""


class LifecycleError(ProcessingError, RuntimeError):
    """A component was used in the wrong state: before it was started, after it stopped, or
    started twice (the app, a send, the producer, the state service, the test driver...)."""


class AgentFailed(ProcessingError, RuntimeError):
    """An agent hit an error under the ``stop`` policy; the worker must stop."""


class TimerFailed(ProcessingError, RuntimeError):
    """A timer, crontab or app task raised under the ``stop`` policy; the worker stops
    (the function's error is the ``__cause__``)."""


class TableAccessError(ProcessingError, RuntimeError):
    """A table (or a join's state) was used where its partition is not owned or not
    co-partitioned, or outside an agent processing an event."""


class RecordRejected(ProcessingError, ValueError):
    """A record the broker refuses (or would refuse) to store: too large for its topic's
    ``max.message.bytes``, a null key for a compacted topic, or any record the broker
    answered as invalid. Raised by the send inside the agent, so the agent's ``on_error``
    policy applies to the event that sent it (skip, dead-letter or stop) like any other
    processing error. The message names the topic and what is wrong."""

    def __init__(self, message: str, *, topic: str) -> None:
        super().__init__(message)
        self.topic = topic


class RecordTooLargeError(RecordRejected):
    """A record is larger than its topic accepts (``max.message.bytes``) or than one
    producer batch holds; ``size`` and ``limit`` are in bytes."""

    def __init__(self, message: str, *, topic: str, size: int, limit: int) -> None:
        super().__init__(message, topic=topic)
        self.size = size
        self.limit = limit


class GroupMembershipError(ProcessingError, RuntimeError):
    """The consumer group will not have this worker: the worker must stop (one clear line).

    Raised for what retrying cannot fix: the group is used by clients of another
    protocol (INCONSISTENT_GROUP_PROTOCOL), the group is full, or access is denied;
    :class:`FencedInstanceError` when another worker took this worker's place.
    """


class FencedInstanceError(GroupMembershipError):
    """Another worker joined the group with this worker's ``group_instance_id``
    (FENCED_INSTANCE_ID): two workers are configured with one instance id."""


class TransactionError(ProcessingError, RuntimeError):
    """A transaction request (KIP-447 exactly-once) could not be made: the broker answered an
    error where the caller cannot go on (FindCoordinator for a transactional id), or the broker
    does not support the protocol version needed. ``error_code`` is Kafka's error code when
    the broker answered one, else ``None``."""

    def __init__(self, message: str, *, error_code: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code


class TransactionFailed(ProcessingError, RuntimeError):
    """An exactly-once transaction did not commit: it is aborted, and everything processed
    since the last commit is processed again (by this worker or the partitions' next owner).

    ``fenced``: the group or the transaction coordinator no longer takes this worker's
    commits (its partitions moved, or a newer worker took over its transactional id).
    """

    def __init__(self, message: str, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.fenced = fenced


# -- joins -----------------------------------------------------------------------------------


class JoinError(StreamjoinError, ValueError):
    """The join core got an input event it cannot place (bad side, timestamp, seq or
    types). A join *definition* that cannot work is a :class:`ConfigurationError`."""


class CorruptJoinState(JoinError):
    """The view holds join state this code cannot read (wrong format or a foreign store)."""


# -- assignor --------------------------------------------------------------------------------


class AssignorError(StreamjoinError):
    """Base class of everything the assignor raises on purpose."""


class InvalidScenarioError(AssignorError, ValueError):
    """The scenario cannot be assigned: unknown topic in a group, duplicate member, a negative
    capacity or lag... (the message names the field)."""


class ViolationCode(str, Enum):
    """Which rule an assignment breaks (see ``docs/assignor.md``)."""

    UNKNOWN_MEMBER = "unknown_member"
    MISSING_MEMBER = "missing_member"
    UNKNOWN_PARTITION = "unknown_partition"
    NOT_SUBSCRIBED = "not_subscribed"
    DUPLICATE_ACTIVE = "duplicate_active"
    MISSING_ACTIVE = "missing_active"
    SPLIT_TASK = "split_task"
    WRONG_UNASSIGNED = "wrong_unassigned"
    UNBALANCED = "unbalanced"
    NOT_MINIMAL = "not_minimal"
    WRONG_STATS = "wrong_stats"
    STANDBY_NOT_CHANGELOG = "standby_not_changelog"
    STANDBY_ON_ACTIVE = "standby_on_active"
    STANDBY_COUNT = "standby_count"
    STANDBY_UNBALANCED = "standby_unbalanced"
    STANDBY_TAG_SPREAD = "standby_tag_spread"


#: Violations that make an assignment unsafe to apply: a task processed twice or not at
#: all, a join's inputs split over members, a partition its member cannot consume (or that
#: does not exist), a standby restoring over its own active or from a source topic, or an
#: assignment that does not match the group's members. The others (balance, minimal
#: movement, standby count/balance/tag spread, the reported stats and unassigned list) make
#: it worse than promised, not wrong.
SAFETY_CODES: frozenset[ViolationCode] = frozenset(
    {
        ViolationCode.UNKNOWN_MEMBER,
        ViolationCode.MISSING_MEMBER,
        ViolationCode.UNKNOWN_PARTITION,
        ViolationCode.NOT_SUBSCRIBED,
        ViolationCode.DUPLICATE_ACTIVE,
        ViolationCode.MISSING_ACTIVE,
        ViolationCode.SPLIT_TASK,
        ViolationCode.STANDBY_NOT_CHANGELOG,
        ViolationCode.STANDBY_ON_ACTIVE,
    }
)


@dataclass(frozen=True)
class Violation:
    """One broken rule, with a message naming the member/topic/partition involved."""

    code: ViolationCode
    message: str

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"

    @property
    def unsafe(self) -> bool:
        """True for the violations of :data:`SAFETY_CODES`."""
        return self.code in SAFETY_CODES


class InvalidAssignmentError(AssignorError):
    """An assignment breaks at least one rule; ``violations`` lists them all."""

    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations: tuple[Violation, ...] = tuple(violations)
        shown = "\n  ".join(str(v) for v in self.violations[:20])
        more = len(self.violations) - 20
        suffix = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(f"{len(self.violations)} assignment violation(s):\n  {shown}{suffix}")

    @property
    def codes(self) -> frozenset[ViolationCode]:
        return frozenset(v.code for v in self.violations)


class UserdataError(AssignorError, ValueError):
    """Assignor userdata cannot be encoded (a value outside what the protocol carries: a
    generation below -1, a capacity below 1, a negative lag, a partition above 2**31-1...),
    or these bytes cannot be decoded (truncated, corrupt, or not streamjoin userdata)."""


class UnsupportedUserdataVersion(UserdataError):
    """The userdata was written by an incompatible (usually newer) protocol version.

    The runtime can catch this to tell a rolling upgrade apart from corruption.
    ``reader_major``/``reader_minor``: the version this decoder reads.
    """

    def __init__(
        self, kind: str, major: int, minor: int, *, reader_major: int, reader_minor: int
    ) -> None:
        self.kind = kind
        self.major = major
        self.minor = minor
        super().__init__(
            f"unsupported {kind} userdata version {major}.{minor}: this decoder reads "
            f"major version {reader_major} (minors up to {reader_minor} fully, later "
            "minors by skipping appended fields)"
        )


# -- provisioning ----------------------------------------------------------------------------


class ProvisioningError(StreamjoinError, RuntimeError):
    """A Kafka resource could not be set up or inspected: topics could not be created or
    verified, a consumer group could not be described, Spark's Kafka connector could not
    be resolved, the local schema registry could not be fetched or started (the broker's,
    Maven's or the registry's answer is in the message)."""


class OffsetMoveRefused(ProvisioningError):
    """A requested move of a group's committed offsets is not possible or would lose more
    than asked (an offset outside the partition's records, a skip that would also skip
    unprocessed records), or the group still has active members whose next commit would
    overwrite the move; the message says what to do instead."""


class KafkaProvisioningError(ProvisioningError):
    """The local development broker could not be provisioned or started: no usable
    ``java`` (17+), no ``mvn``, resolving its jars from Maven Central failed, or the broker
    did not answer in time; the message says what to do."""


class BrokerExitedError(KafkaProvisioningError):
    """The broker process exited during startup (e.g. a port was taken meanwhile); the
    local broker retries with new ports on it."""


# -- startup -------------------------------------------------------------------------------


class StartupError(StreamjoinError):
    """The worker cannot start: importing the app module (``-A module:app``) raised (the
    message names the file and line), or no bootstrap server answered within the startup
    timeout. ``streamjoin worker`` exits with code 3 on it (and on a
    :class:`ConfigurationError` or :class:`ProvisioningError` raised while starting), so a
    supervisor can tell "will never start as configured" from a processing failure (1)."""


class AccessRefused(StartupError):
    """The brokers refused this client: its login (wrong password, unknown user, a TLS
    certificate it could not verify) or an operation its ACLs do not allow (the message
    names the topic, group or transactional id, and the operation where Kafka says).
    Retrying as configured fails the same way, so it stops the worker with exit code 3,
    while starting or running; ``streamjoin acls -A APP`` lists the ACLs an app needs.
    The message never holds a credential."""


# -- Spark jobs ------------------------------------------------------------------------------


class SparkJobError(StreamjoinError):
    """What the Spark backfill and bootstrap jobs refuse (besides
    :class:`ConfigurationError`, :class:`CopartitioningError` and :class:`NotFoundError`):
    a join that cannot be backfilled (not stream-stream, or a topic joined with itself), a
    table whose state is not a function of one topic, a changelog that already has
    records."""


class SparkNotInstalled(SparkJobError, ImportError):
    """PySpark is missing: the Spark jobs are an optional extra."""


# -- interactive queries ---------------------------------------------------------------------


class QueryError(StreamjoinError):
    """Base class of interactive-query errors (``GET /tables/...``, ``TableClient``); each
    carries the HTTP status the endpoint answers it with."""

    status = 500


class QueryKeyError(QueryError, ValueError):
    """A key's text form the table's key codec cannot parse or encode (HTTP 400)."""

    status = 400


class UnknownTableError(QueryError, NotFoundError):
    """A query names a table the app does not declare (HTTP 404; the message lists them)."""

    status = 404


class KeyNotFound(QueryError, NotFoundError, KeyError):
    """The active owner of the key's partition has no value for it (HTTP 404)."""

    status = 404

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class QueryUnauthorized(QueryError):
    """The endpoint wants a bearer token and got none, or a wrong one (HTTP 401)."""

    status = 401


class QueryUnavailable(QueryError, RuntimeError):
    """No correct answer right now: a rebalance is under way, the partition is restoring,
    or its owner is unknown or unreachable (HTTP 503 with ``Retry-After``)."""

    status = 503

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueryFailed(QueryError, RuntimeError):
    """``TableClient``: no host gave an answer (every host failed, or retries ran out)."""

    status = 502


# -- bugs ------------------------------------------------------------------------------------


class InternalError(StreamjoinError, RuntimeError):
    """An invariant of streamjoin's own code broke: a bug in streamjoin, please report it
    (an offset acknowledged that was never registered, a view written while one of its
    scans was open...)."""


class HistoryExpired(TableAccessError, LookupError):
    """``versioned_table.get(key, as_of=ts)`` asked for a time older than the history the
    table keeps (its stream time - ``history_ms``): that version may have been purged."""


# -- schema registry ---------------------------------------------------------------------------


class SchemaRegistryError(StreamjoinError, RuntimeError):
    """The schema registry refused a request or could not be reached; the message names the
    subject (or schema id), the registry's URL and the registry's own message."""

    def __init__(self, message: str, *, status: int | None = None, code: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class SchemaNotFound(SchemaRegistryError, NotFoundError):
    """The registry has no such subject, schema or schema id (HTTP 404)."""


class IncompatibleSchema(SchemaRegistryError, ValueError):
    """The registry refused a new version of a subject's schema as incompatible with the
    versions it has (HTTP 409); ``reasons`` are the registry's own messages."""

    def __init__(self, message: str, reasons: Sequence[str] = (), *, status: int | None = 409):
        super().__init__(message, status=status, code=409)
        self.reasons = list(reasons)


class MissingFieldError(ProcessingError, LookupError):
    """A record's value has no field a declaration reads from it by name
    (``app.group_by(topic, "field", ...)``); an error of its event (``on_error`` applies)."""
