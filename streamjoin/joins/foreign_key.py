"""The foreign-key table-table join's pure core: what each side does with a change, and the
hash check that drops out-of-date responses (Kafka Streams' KIP-213 design).

A left row subscribes to the right row its foreign key names; the right side answers each
subscription, and every later change of that right row, with a response carrying the
right value and the hash of the left value the subscription was made for. Responses of
different right partitions reach a left row in any order, so a response is applied only
if that hash is the hash of the left row's value *now*: a response computed for an older
value (the row changed, or was deleted, since) is dropped, and the response to the newest
subscription is always still on its way.

Everything here is bytes: the declaration (:mod:`streamjoin.joins.foreign_key_api`)
encodes and decodes, stores and sends.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from streamjoin.errors import CorruptJoinState

__all__ = [
    "HASH_BYTES",
    "LeftPlan",
    "Outcome",
    "parse_response",
    "parse_subscription",
    "plan_left_change",
    "response_message",
    "response_outcome",
    "response_to",
    "responses_for",
    "split_subscription_key",
    "subscribe_message",
    "subscribers_range",
    "subscription_key",
    "unsubscribe_message",
    "value_hash",
]

ForeignKeyHow = Literal["inner", "left"]

#: bytes of a left value's hash (BLAKE2b: a collision would apply one stale response)
HASH_BYTES = 16
_LENGTH_BYTES = 4
_SUBSCRIBE = b"S"
_UNSUBSCRIBE = b"U"
_WITH_RIGHT = b"\x01"
_WITHOUT_RIGHT = b"\x00"
_SUBSCRIPTION_BYTES = 1 + HASH_BYTES + _LENGTH_BYTES


def value_hash(value: bytes) -> bytes:
    """The hash a subscription carries for the left value it was made for."""
    return hashlib.blake2b(value, digest_size=HASH_BYTES).digest()


# ---------------------------------------------------------------- the subscription store


def subscription_key(foreign_key: bytes, left_key: bytes) -> bytes:
    """The subscription store's key: length-prefixed so that one foreign key's subscribers
    are one contiguous range whatever bytes the keys hold."""
    return len(foreign_key).to_bytes(_LENGTH_BYTES, "big") + foreign_key + left_key


def subscribers_range(foreign_key: bytes) -> tuple[bytes, bytes]:
    """[start, end) of the subscription keys of ``foreign_key``."""
    start = len(foreign_key).to_bytes(_LENGTH_BYTES, "big") + foreign_key
    # the prefix incremented as a big number: its last byte below 0xff goes up by one
    stripped = start.rstrip(b"\xff")
    if not stripped:
        raise CorruptJoinState("foreign key too long to bound its subscribers")
    return start, stripped[:-1] + bytes([stripped[-1] + 1])


def split_subscription_key(key: bytes) -> tuple[bytes, bytes]:
    """(foreign key, left key) of a subscription key."""
    if len(key) < _LENGTH_BYTES:
        raise CorruptJoinState(f"subscription key {key!r} is shorter than its length prefix")
    size = int.from_bytes(key[:_LENGTH_BYTES], "big")
    if len(key) < _LENGTH_BYTES + size:
        raise CorruptJoinState(f"subscription key {key!r} is shorter than its foreign key")
    return key[_LENGTH_BYTES : _LENGTH_BYTES + size], key[_LENGTH_BYTES + size :]


# ---------------------------------------------------------------- messages


def subscribe_message(left_hash: bytes, left_partition: int) -> bytes:
    """A subscription: the left value's hash and the left row's partition (where its
    responses go: no re-encoded key decides it)."""
    return _SUBSCRIBE + left_hash + left_partition.to_bytes(_LENGTH_BYTES, "big")


def unsubscribe_message() -> bytes:
    return _UNSUBSCRIBE


def parse_subscription(value: bytes | None) -> bytes | None:
    """What the subscription store keeps for a subscription message (its hash and left
    partition); None for an unsubscription."""
    if value == _UNSUBSCRIBE:
        return None
    if value is None or len(value) != _SUBSCRIPTION_BYTES or value[:1] != _SUBSCRIBE:
        raise CorruptJoinState(f"not a subscription message: {value!r}")
    return value[1:]


def response_message(left_hash: bytes, right: bytes | None) -> bytes:
    if right is None:
        return _WITHOUT_RIGHT + left_hash
    return _WITH_RIGHT + left_hash + right


def parse_response(value: bytes | None) -> tuple[bytes, bytes | None]:
    """(left hash, right value or None) of a response message."""
    kinds = (_WITH_RIGHT, _WITHOUT_RIGHT)
    if value is None or len(value) < 1 + HASH_BYTES or value[:1] not in kinds:
        raise CorruptJoinState(f"not a response message: {value!r}")
    left_hash = value[1 : 1 + HASH_BYTES]
    return left_hash, (value[1 + HASH_BYTES :] if value[:1] == _WITH_RIGHT else None)


# ---------------------------------------------------------------- the left side


class Outcome(enum.Enum):
    """What becomes of a left row's join result."""

    #: nothing to do here (the row's answer is on its way, or a response was stale)
    KEEP = "keep"
    #: no result row: delete it (a tombstone if there was one)
    DELETE = "delete"
    #: the result is the join function of the current left value and ``right``
    JOIN = "join"


@dataclass(frozen=True, slots=True)
class LeftPlan:
    """What a change of one left row sends and does."""

    #: the foreign key whose subscription goes (the row left it, or was deleted)
    unsubscribe: bytes | None
    #: the foreign key subscribed to with the hash of the new value (None: none)
    subscribe: bytes | None
    #: the result now: DELETE or JOIN (with no right value) when no response will come
    outcome: Outcome


def plan_left_change(
    old_foreign_key: bytes | None,
    new_value: bytes | None,
    new_foreign_key: bytes | None,
    how: ForeignKeyHow,
) -> LeftPlan:
    """A left row changed from one with ``old_foreign_key`` (None: absent, or no foreign
    key) to ``new_value`` (None: deleted) whose foreign key is ``new_foreign_key``.

    The row resubscribes even when its foreign key stayed: the response carries the new
    value's hash, and only such a response may update its result. Without a foreign key
    (deleted, or a null foreign key) no response will come, so the result is settled here:
    deleted, or (left join, KIP-962) joined with no right value."""
    unsubscribe = (
        old_foreign_key
        if old_foreign_key is not None and old_foreign_key != new_foreign_key
        else None
    )
    if new_value is None:
        return LeftPlan(unsubscribe, None, Outcome.DELETE)
    if new_foreign_key is None:
        return LeftPlan(unsubscribe, None, Outcome.JOIN if how == "left" else Outcome.DELETE)
    return LeftPlan(unsubscribe, new_foreign_key, Outcome.KEEP)


def response_outcome(
    current_left: bytes | None, left_hash: bytes, right: bytes | None, how: ForeignKeyHow
) -> Outcome:
    """What a response does to its left row, whose value is ``current_left`` now."""
    if current_left is None or value_hash(current_left) != left_hash:
        return Outcome.KEEP  # computed for a value the row no longer has
    if right is None and how == "inner":
        return Outcome.DELETE
    return Outcome.JOIN


# ---------------------------------------------------------------- the right side


def responses_for(
    subscribers: Iterable[tuple[bytes, bytes]], right: bytes | None
) -> list[tuple[bytes, int, bytes]]:
    """(left key, left partition, response message) for each ``(subscription key, stored
    subscription)`` under a right row whose value is now ``right`` (None: deleted)."""
    return [response_to(key, stored, right) for key, stored in subscribers]


def response_to(key: bytes, stored: bytes, right: bytes | None) -> tuple[bytes, int, bytes]:
    """:func:`responses_for` of one subscription."""
    if len(stored) != HASH_BYTES + _LENGTH_BYTES:
        raise CorruptJoinState(f"subscription {key!r} holds {stored!r}, not a hash and partition")
    left_key = split_subscription_key(key)[1]
    partition = int.from_bytes(stored[HASH_BYTES:], "big")
    return left_key, partition, response_message(stored[:HASH_BYTES], right)
