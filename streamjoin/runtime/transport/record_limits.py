"""What the broker will refuse to store, checked before a record is sent.

A record the broker rejects fails its whole producer batch, and under exactly-once the
transaction holding it; retried, it fails again on every restart. So the worker learns
each written topic's ``max.message.bytes`` and ``cleanup.policy`` when it starts
(DescribeConfigs), and a send that would be rejected raises
:class:`~streamjoin.errors.RecordRejected` inside the agent instead, where the agent's
``on_error`` policy applies to it. The record never enters a batch or a transaction.

What cannot be known in advance (a limit lowered while running, a compressed batch, an
invalid record of another kind) is learnt from the broker's answer: the rejected record's
fingerprint is remembered, and sending the same record again (exactly-once replays the
aborted transaction's events) raises at once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import aiokafka
from aiokafka.errors import (
    CorruptRecordException,
    InvalidMessageError,
    InvalidTimestampError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)
from aiokafka.errors import RecordTooLargeError as KafkaRecordTooLarge

try:  # (a private module: see record_size_of)
    from aiokafka.record import default_records as _aiokafka_records
except ImportError:  # pragma: no cover - an aiokafka without it
    _aiokafka_records = None

from streamjoin.errors import RecordRejected, RecordTooLargeError

__all__ = [
    "REJECTION_ERRORS",
    "RecordLimits",
    "TopicLimits",
    "is_rejection",
    "single_record_batch_size",
]

log = logging.getLogger(__name__)

#: the broker's answers that refuse a record for what it is (retrying cannot help)
REJECTION_ERRORS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    KafkaRecordTooLarge,
    RecordListTooLargeError,
    CorruptRecordException,  # CORRUPT_MESSAGE: also "compacted topic cannot accept a null key"
    InvalidMessageError,
    InvalidTimestampError,
)
#: size of a record batch's header (magic v2: Kafka's RECORD_BATCH_OVERHEAD), before its records
_BATCH_HEADER = 61
#: rejected records remembered (by fingerprint) so that a replay fails at once
_REMEMBERED = 10_000


def is_rejection(exc: BaseException | None) -> bool:
    """Whether the broker (or the producer) refused a record for what it is."""
    return isinstance(exc, (*REJECTION_ERRORS, RecordRejected))


def _varint_size(value: int) -> int:
    zigzag = (value << 1) ^ (value >> 63)
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def _record_fields_size(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> int:
    """Bytes of a record's key, value and headers in Kafka's record format v2: each one
    prefixed with its length as a zigzag varint (-1, one byte, for null), the headers
    with their count."""
    size = 1 if key is None else _varint_size(len(key)) + len(key)
    size += 1 if value is None else _varint_size(len(value)) + len(value)
    size += _varint_size(len(headers))
    for name, data in headers:
        encoded = len(name.encode())
        size += _varint_size(encoded) + encoded
        size += 1 if data is None else _varint_size(len(data)) + len(data)
    return size


#: records whose sizes aiokafka's ``size_of`` must give as the record format says
_SIZE_PROBES: tuple[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]], ...] = (
    (b"key", b"v" * 300, []),
    (None, None, [("h", b"x" * 200), ("\u00e9t\u00e9", None)]),
)

SizeOf = Callable[[bytes | None, bytes | None, list[tuple[str, bytes | None]]], int]


def record_size_of() -> SizeOf:
    """What sizes a record's fields: aiokafka's ``DefaultRecordBatchBuilder.size_of``
    (compiled, about five times faster than ours) when it is there and answers as the
    record format says; else :func:`_record_fields_size`, with a warning naming the
    aiokafka version (a private part of aiokafka, checked once at import)."""
    builder = getattr(_aiokafka_records, "DefaultRecordBatchBuilder", None)
    size_of = getattr(builder, "size_of", None)
    if callable(size_of):
        try:
            fits = all(
                size_of(key, value, headers) == _record_fields_size(key, value, headers)
                for key, value, headers in _SIZE_PROBES
            )
        except Exception:
            fits = False
        if fits:
            return size_of  # type: ignore[no-any-return]
    log.warning(
        "aiokafka %s: its record.default_records.DefaultRecordBatchBuilder.size_of is missing "
        "or sizes records differently from the one streamjoin knows (aiokafka 0.14); record "
        "sizes are computed by streamjoin (slower, same results)",
        aiokafka.__version__,
    )
    return _record_fields_size


_size_of = record_size_of()


def single_record_batch_size(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> int:
    """Bytes of an uncompressed record batch holding just this record: what the broker
    compares with ``max.message.bytes``."""
    body = 1 + 1 + 1  # attributes, timestamp delta 0, offset delta 0
    body += int(_size_of(key, value, list(headers)))
    return _BATCH_HEADER + _varint_size(body) + body


@dataclass(frozen=True)
class TopicLimits:
    """What one topic accepts (from its effective configs)."""

    max_message_bytes: int
    compacted: bool = False


class RecordLimits:
    """The written topics' limits, and the records the broker refused while running."""

    def __init__(self, topics: Mapping[str, TopicLimits], *, compressed: bool = False) -> None:
        self._topics = dict(topics)
        #: per topic, a size below which a record with a key and without headers passes
        #: :meth:`check` unless :attr:`rejected` holds anything (topics not listed: any
        #: size). The sender tests this inline and calls :meth:`check` only past it.
        self.quick: dict[str, int] = {}
        self._compressed = compressed
        self._refresh_quick()
        #: fingerprints of records the broker refused, with why (see :meth:`remember`)
        self.rejected: OrderedDict[int, str] = OrderedDict()

    @property
    def topics(self) -> Mapping[str, TopicLimits]:
        return self._topics

    @property
    def compressed(self) -> bool:
        """With compression the broker checks the compressed batch: sizes are not checked
        here (a rejection is still learnt from the broker's answer)."""
        return self._compressed

    @compressed.setter
    def compressed(self, compressed: bool) -> None:
        self._compressed = compressed
        self._refresh_quick()

    def _refresh_quick(self) -> None:
        # (the key and value far below the limit: see the margin in check)
        self.quick = (
            {}
            if self._compressed
            else {name: t.max_message_bytes - 1024 for name, t in self._topics.items()}
        )

    def smallest_limit(self) -> int | None:
        """The smallest ``max.message.bytes`` of the written topics (a producer batch must
        not be larger, or a batch of small records is rejected as a whole)."""
        return min((t.max_message_bytes for t in self.topics.values()), default=None)

    def check(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> None:
        """Raise :class:`RecordRejected` for a record ``topic`` would refuse."""
        known = self.topics.get(topic)
        if known is not None:
            if known.compacted and key is None:
                raise RecordRejected(
                    f"a record with a null key cannot be written to {topic!r}: the topic is "
                    "compacted (cleanup.policy=compact), and compaction needs a key",
                    topic=topic,
                )
            if not self.compressed and (
                # far below the limit (a batch of one adds under 100 bytes of framing to
                # the key and value, plus the headers): no exact size needed
                headers or len(key or b"") + len(value or b"") + 1024 > known.max_message_bytes
            ):
                size = single_record_batch_size(key, value, headers)
                if size > known.max_message_bytes:
                    raise RecordTooLargeError(
                        f"a record of {size} bytes is larger than topic {topic!r} accepts "
                        f"(max.message.bytes={known.max_message_bytes}; key "
                        f"{len(key or b'')} bytes, value {len(value or b'')} bytes)",
                        topic=topic,
                        size=size,
                        limit=known.max_message_bytes,
                    )
        if self.rejected:
            reason = self.rejected.get(_fingerprint(topic, key, value))
            if reason is not None:
                raise RecordRejected(
                    f"the broker refused this record for topic {topic!r} before: {reason}",
                    topic=topic,
                )

    def remember(
        self, topic: str, key: bytes | None, value: bytes | None, error: BaseException
    ) -> None:
        """The broker refused this record: sending it again fails at once."""
        fingerprint = _fingerprint(topic, key, value)
        self.rejected[fingerprint] = describe_rejection(topic, key, value, error, self)
        self.rejected.move_to_end(fingerprint)
        while len(self.rejected) > _REMEMBERED:
            self.rejected.popitem(last=False)


def describe_rejection(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    error: BaseException,
    limits: RecordLimits | None = None,
) -> str:
    """A message naming the topic, the record's size and the limit the broker applied."""
    size = single_record_batch_size(key, value, ())
    known = None if limits is None else limits.topics.get(topic)
    limit = "" if known is None else f", max.message.bytes={known.max_message_bytes}"
    return f"{type(error).__name__} for a record of {size} bytes to topic {topic!r}{limit}"


def _fingerprint(topic: str, key: bytes | None, value: bytes | None) -> int:
    return hash((topic, key, value))
