"""The group's committed offsets: OffsetCommit, TxnOffsetCommit and OffsetFetch.

A commit carries this member's generation and member id, so the group refuses one from a
member it rebalanced out. Both come from the membership at the moment of the request,
through :class:`MemberLink` (this module never imports the membership service), as does
the group coordinator's node: a commit or fetch that finds the coordinator moved tells the
membership to look it up again, and a commit refused because the member was removed asks
it to rejoin.

One OffsetFetch loop serves both processing guarantees. At least once, it sends aiokafka's
OffsetFetch; exactly once, OffsetFetch v7 with ``require_stable`` (KIP-447), which answers
UNSTABLE_OFFSET_COMMIT while an open transaction holds an offset of the partition: a
previous owner's transaction either commits it (and we start after its events) or aborts
(and we start before them), so the loop waits. The answer is read by one pure function,
:func:`read_fetch_answer`, for both.

What an answer means is decided by the pure functions :func:`read_commit_answer`,
:func:`read_txn_commit_answer` and :func:`read_fetch_answer`; the class only sends, sleeps
and logs.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from aiokafka import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest

from streamjoin.errors import GroupMembershipError, TransactionFailed
from streamjoin.runtime.group.protocol import (
    COORDINATOR_GONE,
    FATAL,
    MEMBER_GONE,
    GroupErrorCode,
    code_of,
)
from streamjoin.runtime.group.txn_protocol import (
    PRODUCER_FENCED_CODES,
    ErrorCode,
    fetch_committed,
    txn_offset_commit,
)
from streamjoin.runtime.group.txn_protocol import error_name as txn_error_name

if TYPE_CHECKING:
    from streamjoin.runtime.group.transaction import TransactionIds

__all__ = [
    "UNSTABLE_WARNING_EVERY",
    "CommitVerdict",
    "FetchVerdict",
    "GroupOffsets",
    "MemberLink",
    "TxnCommitVerdict",
    "read_commit_answer",
    "read_fetch_answer",
    "read_txn_commit_answer",
]

log = logging.getLogger("streamjoin.membership")

TP = tuple[str, int]

#: how often a wait for offsets held by an open transaction is reported past the first minute
UNSTABLE_WARNING_EVERY = 60.0
#: how long a TxnOffsetCommit is retried (well within any transaction's timeout)
TXN_COMMIT_RETRY_FOR = 5.0

#: TxnOffsetCommit answers: this member's partitions moved (the commit is a zombie's)
TXN_MEMBER_GONE = MEMBER_GONE | {GroupErrorCode.FENCED_INSTANCE_ID}
#: TxnOffsetCommit answers a retry fixes (within the transaction's lifetime)
TXN_RETRIABLE = COORDINATOR_GONE | {
    ErrorCode.CONCURRENT_TRANSACTIONS,
    GroupErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
}


def error_name(code: int) -> str:
    """The name of a group or transaction error code (``"error code N"`` if neither)."""
    named = code_of(code)
    return named.name if isinstance(named, GroupErrorCode) else txn_error_name(code)


def _names(codes: Iterable[int]) -> str:
    return ", ".join(sorted({error_name(c) for c in codes}))


class MemberLink(Protocol):
    """What group offsets need of the membership: who commits, and where the coordinator is."""

    @property
    def generation(self) -> int: ...

    @property
    def member_id(self) -> str: ...

    @property
    def coordinator(self) -> int | None: ...

    @property
    def owned(self) -> frozenset[TP]:
        """The partitions this member owns now."""

    async def ensure_coordinator(self) -> int | None:
        """The coordinator's node, looked up if needed (None only while stopping)."""

    def forget_coordinator(self) -> None:
        """The coordinator moved or cannot be reached: look it up again."""

    def request_rejoin(self, reason: str) -> None:
        """The group no longer has this member at its generation: rejoin."""


# ---------------------------------------------------------------------- pure decisions


@dataclass(frozen=True)
class CommitVerdict:
    """What an OffsetCommit answer means."""

    committed: bool
    #: refused only because the group is completing a rebalance this member already joined:
    #: the next commit, at the new generation, carries the offsets (no rejoin: that would
    #: start yet another rebalance, whose commits would be refused the same way)
    deferred: bool = False
    forget_coordinator: bool = False
    #: the group no longer has this member at that generation
    member_gone: bool = False


def read_commit_answer(codes: Iterable[int]) -> CommitVerdict:
    """The verdict on an OffsetCommit answered with ``codes`` (one per partition)."""
    failed = {code_of(c) for c in codes if c != 0}
    if not failed:
        return CommitVerdict(committed=True)
    if failed == {GroupErrorCode.REBALANCE_IN_PROGRESS}:
        return CommitVerdict(committed=False, deferred=True)
    return CommitVerdict(
        committed=False,
        forget_coordinator=bool(failed & COORDINATOR_GONE),
        member_gone=bool(failed & MEMBER_GONE),
    )


class TxnCommitStep(enum.Enum):
    DONE = "done"
    RETRY = "retry after backoff"
    #: the commit is a zombie's (partitions moved) or its producer was fenced
    FENCED = "fenced"
    FAILED = "failed"


@dataclass(frozen=True)
class TxnCommitVerdict:
    """What a TxnOffsetCommit answer means."""

    step: TxnCommitStep
    reason: str = ""
    forget_coordinator: bool = False
    #: the group no longer has this member at that generation (rejoin)
    member_gone: bool = False


def read_txn_commit_answer(codes: Iterable[int], *, out_of_time: bool) -> TxnCommitVerdict:
    """The verdict on a TxnOffsetCommit answered with ``codes``; ``out_of_time``: no retry
    is left."""
    failed = {c for c in codes if c != 0}
    if not failed:
        return TxnCommitVerdict(TxnCommitStep.DONE)
    names = _names(failed)
    if failed & TXN_MEMBER_GONE:
        return TxnCommitVerdict(
            TxnCommitStep.FENCED,
            f"the group refused this worker's offsets ({names}): its partitions moved",
            member_gone=True,
        )
    if failed & PRODUCER_FENCED_CODES:
        return TxnCommitVerdict(
            TxnCommitStep.FENCED,
            f"the group refused this worker's offsets ({names}): its producer was fenced",
        )
    if not failed <= TXN_RETRIABLE or out_of_time:
        return TxnCommitVerdict(
            TxnCommitStep.FAILED, f"the group refused this worker's offsets ({names})"
        )
    return TxnCommitVerdict(
        TxnCommitStep.RETRY, names, forget_coordinator=bool(failed & COORDINATOR_GONE)
    )


class FetchStep(enum.Enum):
    DONE = "done"
    #: the coordinator moved, is loading or cannot be reached: look it up, ask again
    COORDINATOR_GONE = "find the coordinator, then retry"
    #: an open transaction holds offsets of these partitions: ask again once it ended
    UNSTABLE = "wait for an open transaction"
    FAILED = "failed"


@dataclass(frozen=True)
class FetchVerdict:
    """What an OffsetFetch answer means."""

    step: FetchStep
    #: DONE: the committed offsets (partitions without one are left out)
    offsets: dict[TP, int] = field(default_factory=dict)
    #: DONE, at least once: partitions answered with an error, left out
    skipped: dict[TP, int] = field(default_factory=dict)
    #: COORDINATOR_GONE, FAILED: the codes that say so
    codes: frozenset[int] = frozenset()


def read_fetch_answer(
    top: int, answered: Mapping[TP, tuple[int, int]], *, stable: bool
) -> FetchVerdict:
    """The verdict on an OffsetFetch answered with top-level error code ``top`` and
    ``{tp: (offset, error code)}``.

    Both guarantees: a coordinator that moved or is loading (at the top, or for a
    partition) means ask again. OffsetFetch v2+ reports it, or a refusal, at the top with no
    partitions at all: never "nothing committed" (which would restart every partition from
    the reset policy's offset). Any other top-level error fails. A partition's other error
    fails when reading ``stable`` (exactly once must not guess where to start), and leaves
    that partition out otherwise (as the Java consumer does).
    """
    partition_codes = {code for _offset, code in answered.values() if code != 0}
    codes = partition_codes | ({top} if top != 0 else set())
    if not codes:
        return FetchVerdict(
            FetchStep.DONE,
            offsets={tp: offset for tp, (offset, _code) in answered.items() if offset >= 0},
        )
    gone = {c for c in codes if c in COORDINATOR_GONE}
    if gone:
        return FetchVerdict(FetchStep.COORDINATOR_GONE, codes=frozenset(gone))
    unstable = ErrorCode.UNSTABLE_OFFSET_COMMIT
    refused = {top} - {0, unstable}
    if stable:
        refused |= partition_codes - {unstable}
    if refused:
        return FetchVerdict(FetchStep.FAILED, codes=frozenset(refused))
    if unstable in codes:
        return FetchVerdict(FetchStep.UNSTABLE, codes=frozenset({unstable}))
    return FetchVerdict(
        FetchStep.DONE,
        offsets={tp: off for tp, (off, code) in answered.items() if code == 0 and off >= 0},
        skipped={tp: code for tp, (_off, code) in answered.items() if code != 0},
    )


# ---------------------------------------------------------------------- the requests


class GroupOffsets:
    """Commits and reads the group's offsets as the member ``link`` describes."""

    def __init__(
        self,
        client: AIOKafkaClient,
        link: MemberLink,
        *,
        group_id: str,
        group_instance_id: str | None,
        exactly_once: bool,
        retry_backoff: float,
        clock: Callable[[], float],
    ) -> None:
        self._client = client
        self._link = link
        self.group_id = group_id
        self._group_instance_id = group_instance_id
        #: read committed offsets "stable" (waiting for open transactions, KIP-447)
        self.exactly_once = exactly_once
        self._backoff = retry_backoff
        self._clock = clock

    async def commit(self, offsets: Mapping[TP, int]) -> bool:
        """Commit ``offsets`` of the partitions this member owns, as this member at this
        generation; False if the group refused (rebalanced, member removed) or could not be
        reached: the next commit retries."""
        if not offsets:
            return True
        link = self._link
        generation, node = link.generation, link.coordinator
        if generation < 0 or node is None:
            return False
        # (a partition given up meanwhile is its next owner's to commit)
        owned = link.owned
        offsets = {tp: offset for tp, offset in offsets.items() if tp in owned}
        if not offsets:
            return True
        by_topic: dict[str, list[tuple[int, int, str]]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append((partition, offset, ""))
        request = OffsetCommitRequest(
            self.group_id,
            generation,
            link.member_id,
            OffsetCommitRequest.DEFAULT_RETENTION_TIME,
            sorted(by_topic.items()),
        )
        try:
            response = await self._client.send(node, request)
        except KafkaError as exc:
            log.warning("commit of %d partitions failed: %r", len(offsets), exc)
            link.forget_coordinator()
            return False
        codes = [code for _topic, partitions in response.topics for _p, code in partitions]
        verdict = read_commit_answer(codes)
        if verdict.committed:
            return True
        if verdict.deferred:
            log.info("commit of %d partitions deferred: the group is rebalancing", len(offsets))
            return False
        log.warning("commit of %d partitions refused: %s", len(offsets), _names(codes))
        if verdict.forget_coordinator:
            link.forget_coordinator()
        if verdict.member_gone and generation == link.generation:
            # (a join that completed meanwhile already answered this)
            link.request_rejoin("the group refused a commit: this member was removed")
        return False

    async def commit_in_transaction(self, ids: TransactionIds, offsets: Mapping[TP, int]) -> None:
        """Commit ``offsets`` inside the transaction ``ids`` as this member at this generation
        (TxnOffsetCommit v3, KIP-447): a worker whose partitions moved is refused by the
        group, whatever its producer. Raises :class:`TransactionFailed`."""
        link = self._link
        deadline = self._clock() + TXN_COMMIT_RETRY_FOR
        while True:
            generation, member_id = link.generation, link.member_id
            if generation < 0 or not member_id:
                raise TransactionFailed("this worker is not in the group", fenced=True)
            node = await link.ensure_coordinator()
            if node is None:
                raise TransactionFailed("the group coordinator is not known: stopping")
            try:
                codes = await txn_offset_commit(
                    self._client,
                    node,
                    transactional_id=ids.transactional_id,
                    group_id=self.group_id,
                    producer_id=ids.producer_id,
                    producer_epoch=ids.producer_epoch,
                    generation_id=generation,
                    member_id=member_id,
                    group_instance_id=self._group_instance_id,
                    offsets=offsets,
                )
            except KafkaError as exc:
                codes = {tp: int(GroupErrorCode.NOT_COORDINATOR) for tp in offsets}
                log.info("offsets in transaction: %r; retrying", exc)
            verdict = read_txn_commit_answer(codes.values(), out_of_time=self._clock() >= deadline)
            if verdict.step is TxnCommitStep.DONE:
                return
            if verdict.member_gone and generation == link.generation:
                link.request_rejoin("the group refused offsets in a transaction")
            if verdict.step is TxnCommitStep.FENCED:
                raise TransactionFailed(verdict.reason, fenced=True)
            if verdict.step is TxnCommitStep.FAILED:
                raise TransactionFailed(verdict.reason)
            if verdict.forget_coordinator:
                link.forget_coordinator()
            await asyncio.sleep(self._backoff)

    async def committed(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The group's committed offsets of ``tps`` (partitions without one are left out).

        Exactly once, only once no open transaction holds offsets of ``tps``. The broker
        ends any transaction within its timeout; one it never ends is waited for with a
        warning every minute (starting from offsets it may still commit would process
        events twice)."""
        wanted = sorted(set(tps))
        if not wanted:
            return {}
        stable = self.exactly_once
        waited_since: float | None = None
        warned_at = 0.0
        while True:
            node = await self._link.ensure_coordinator()
            verdict: FetchVerdict | None = None
            if node is not None:
                try:
                    top, answered = await self._fetch(node, wanted, stable=stable)
                except KafkaError as exc:
                    log.info("committed offsets: %r; retrying", exc)
                else:
                    verdict = read_fetch_answer(top, answered, stable=stable)
            if verdict is not None and verdict.step is FetchStep.DONE:
                for (topic, partition), code in sorted(verdict.skipped.items()):
                    log.warning(
                        "committed offset of %s[%d]: %s", topic, partition, error_name(code)
                    )
                return verdict.offsets
            if verdict is not None and verdict.step is FetchStep.FAILED:
                [code, *_] = sorted(verdict.codes)
                reason = FATAL[GroupErrorCode(code)] if code in FATAL else "refused"
                raise GroupMembershipError(
                    f"cannot read the committed offsets of group {self.group_id!r}: "
                    f"{reason} ({_names(verdict.codes)} from OffsetFetch)"
                )
            if verdict is not None and verdict.step is FetchStep.UNSTABLE:
                now = self._clock()
                if waited_since is None:
                    waited_since = warned_at = now
                    log.info(
                        "committed offsets: a transaction of a previous owner is still open; "
                        "waiting for it to commit or abort"
                    )
                elif now - warned_at >= UNSTABLE_WARNING_EVERY:
                    # Longer than any transaction timeout: the broker holds offsets of a
                    # transaction it never completes (seen after a broker restart that lost
                    # a transaction marker of the group's offsets partition).
                    warned_at = now
                    log.warning(
                        "committed offsets of group %s still held by an open transaction "
                        "after %.0f s; not processing %d partitions until the broker "
                        "completes it",
                        self.group_id,
                        now - waited_since,
                        len(wanted),
                    )
            else:
                if verdict is not None:
                    log.info("committed offsets: %s; retrying", _names(verdict.codes))
                self._link.forget_coordinator()
            await asyncio.sleep(self._backoff)

    async def _fetch(
        self, node: int, wanted: list[TP], *, stable: bool
    ) -> tuple[int, dict[TP, tuple[int, int]]]:
        """One OffsetFetch: ``(top-level error code, {tp: (offset, error code)})``."""
        if stable:
            return await fetch_committed(
                self._client, node, group_id=self.group_id, partitions=wanted, require_stable=True
            )
        by_topic: dict[str, list[int]] = {}
        for topic, partition in wanted:
            by_topic.setdefault(topic, []).append(partition)
        request = OffsetFetchRequest(self.group_id, sorted(by_topic.items()))
        response = await self._client.send(node, request)
        answered = {
            (topic, partition): (offset, code)
            for topic, partitions in response.topics
            for partition, offset, _metadata, code in partitions
        }
        return getattr(response, "error_code", 0), answered
