"""Raw changelog reads for restoring and following table partitions (imperative shell).

Restoring a store replays millions of changelog records, and aiokafka's consumer
builds a ``ConsumerRecord`` for each one: about half of the restore's CPU. The
:class:`ChangelogReader` talks to the brokers through aiokafka's
``AIOKafkaClient`` with its own Fetch and ListOffsets requests and returns
``(offset, key, value)`` triples decoded by :mod:`streamjoin.runtime.table_state.changelog_records`
(which holds every decision that needs no I/O).

* The caller assigns partitions with a start offset and, for a restore, the end
  offset captured when the restore was planned (the reader stops fetching there);
  a partition without an end is followed continuously (standbys).
* One Fetch per leader with all of its partitions; one request in flight per
  leader. A partition is fetched again as soon as at most one answer of it is
  buffered, so the next answer travels while the caller applies the current one.
* :meth:`ChangelogReader.read` returns up to about ``max_records`` records (whole
  batches) per call, round-robin over partitions, each with the partition's new
  position (gaps from compaction and transaction markers included).
* Errors: a moved or unknown leader refreshes metadata and retries; transient
  errors retry after a backoff; ``OFFSET_OUT_OF_RANGE`` drops the partition and
  raises :class:`ChangelogOffsetOutOfRange` (the caller plans again); anything
  else raises :class:`ChangelogReadError`. No record is ever skipped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaClient, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest

from streamjoin.errors import (
    ChangelogOffsetOutOfRange,
    ChangelogReadError,
    ConfigurationError,
    CorruptRecordSet,
    LifecycleError,
)
from streamjoin.runtime.table_state.changelog_records import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ErrorAction,
    Record,
    RecordBatch,
    batch_records,
    error_action,
    error_name,
    plan_fetches,
    scan_record_set,
    split_partition_answer,
)

log = logging.getLogger("streamjoin.state.reader")

_EARLIEST = -2
_LATEST = -1


@dataclass
class ChangelogChunk:
    """Records read from one partition, and its position after them."""

    records: list[Record]
    #: offset of the next record to read; everything below it has been read or skipped
    next_offset: int


@dataclass
class _Buffered:
    """One fetch answer of a partition not yet handed out."""

    start: int
    batches: deque[RecordBatch]
    next_offset: int


@dataclass
class _Partition:
    position: int  # next offset the caller has not been given
    until: int | None  # stop fetching here (None: follow)
    sets: deque[_Buffered] = field(default_factory=deque)
    fetch_offset: int = -1  # where the next fetch starts (end of what is buffered)
    retry_at: float = 0.0
    last_error: str | None = None

    def __post_init__(self) -> None:
        self.fetch_offset = self.position

    def wants_fetch(self, now: float) -> bool:
        if len(self.sets) > 1 or now < self.retry_at:
            return False
        return self.until is None or self.fetch_offset < self.until

    def has_unread(self) -> bool:
        return bool(self.sets)


@dataclass
class _InFlight:
    task: asyncio.Task[Any]
    offsets: dict[TopicPartition, int]  # the fetch offset of each partition asked for


class ChangelogReader:
    """Fetches changelog partitions from given offsets and returns raw records."""

    def __init__(
        self,
        bootstrap_servers: str,
        client_options: Mapping[str, Any] | None = None,
        *,
        isolation_level: int = READ_UNCOMMITTED,
        max_wait_ms: int = 200,
        fetch_max_bytes: int = 32 * 1024 * 1024,
        partition_max_bytes: int = 8 * 1024 * 1024,
        retry_backoff: float = 0.1,
        offsets_timeout: float = 40.0,
        check_crcs: bool = True,
    ) -> None:
        if isolation_level not in (READ_UNCOMMITTED, READ_COMMITTED):
            raise ConfigurationError(f"isolation_level must be 0 or 1, got {isolation_level}")
        self._bootstrap = bootstrap_servers
        self._client_options = dict(client_options or {})
        self._isolation_level = isolation_level
        self._max_wait_ms = max_wait_ms
        self._fetch_max_bytes = fetch_max_bytes
        self._partition_max_bytes = partition_max_bytes
        self._retry_backoff = retry_backoff
        self._offsets_timeout = offsets_timeout
        self._check_crcs = check_crcs
        self._client: AIOKafkaClient | None = None
        self._topics: set[str] = set()
        self._parts: dict[TopicPartition, _Partition] = {}
        self._inflight: dict[int, _InFlight] = {}
        self._metadata: asyncio.Future[Any] | None = None
        self._fetch_rotation = 0
        self._drain_rotation = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self, client: AIOKafkaClient | None = None) -> None:
        """Bootstrap a client of our own, or use ``client`` (already bootstrapped; tests)."""
        if client is None:
            client = AIOKafkaClient(bootstrap_servers=self._bootstrap, **self._client_options)
            await client.bootstrap()
        self._client = client

    async def close(self) -> None:
        tasks = [f.task for f in self._inflight.values()]
        self._inflight.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._parts.clear()
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    # ------------------------------------------------------------------ assignment

    def assign(self, ranges: Mapping[TopicPartition, tuple[int, int | None]]) -> None:
        """Read exactly these partitions from now on: ``{tp: (start offset, end or None)}``.

        Buffered data is dropped; an answer still in flight is used only where its
        offsets match the new start offsets.
        """
        self._parts = {tp: _Partition(start, until) for tp, (start, until) in ranges.items()}
        self._track({tp.topic for tp in ranges})

    def unassign(self, tp: TopicPartition) -> None:
        """Stop reading one partition."""
        self._parts.pop(tp, None)

    def assigned(self) -> list[TopicPartition]:
        return sorted(self._parts)

    def position(self, tp: TopicPartition) -> int | None:
        part = self._parts.get(tp)
        return None if part is None else part.position

    # ------------------------------------------------------------------ offsets

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._list_offsets(tps, _EARLIEST)

    async def end_offsets(
        self, tps: Iterable[TopicPartition], *, high_watermark: bool = False
    ) -> dict[TopicPartition, int]:
        """The high watermark (``read_uncommitted``, or ``high_watermark``) or else the last
        stable offset (``read_committed``: before the first open transaction)."""
        isolation = READ_UNCOMMITTED if high_watermark else self._isolation_level
        return await self._list_offsets(tps, _LATEST, isolation)

    async def _list_offsets(
        self, tps: Iterable[TopicPartition], timestamp: int, isolation: int | None = None
    ) -> dict[TopicPartition, int]:
        isolation = self._isolation_level if isolation is None else isolation
        remaining = set(tps)
        out: dict[TopicPartition, int] = {}
        if not remaining:
            return out
        self._track({tp.topic for tp in remaining})
        deadline = time.monotonic() + self._offsets_timeout
        problem = ""
        while True:
            await self._await_metadata(deadline)
            plan = plan_fetches([(tp, 0) for tp in sorted(remaining)], self._leader_of)
            if plan.leaderless:
                problem = f"no leader known for {_names(plan.leaderless)}"
            answers = await asyncio.gather(
                *(
                    self._list_offsets_at(node, [tp for tp, _ in parts], timestamp, isolation)
                    for node, parts in plan.by_node.items()
                ),
                return_exceptions=True,
            )
            stale = bool(plan.leaderless)
            for answer in answers:
                if isinstance(answer, KafkaError) and answer.retriable:
                    problem, stale = repr(answer), True
                elif isinstance(answer, ChangelogReadError):
                    raise answer
                elif isinstance(answer, BaseException):
                    raise ChangelogReadError(f"listing offsets failed: {answer!r}") from answer
                else:
                    found, retry = answer
                    out.update(found)
                    remaining.difference_update(found)
                    if retry:
                        problem, stale = retry, True
            if not remaining:
                return out
            if time.monotonic() >= deadline:
                raise ChangelogReadError(
                    f"listing offsets of {_names(remaining)} timed out after "
                    f"{self._offsets_timeout:.0f}s: {problem}"
                )
            if stale:
                self._request_metadata()
            await asyncio.sleep(self._retry_backoff)

    async def _list_offsets_at(
        self, node: int, tps: list[TopicPartition], timestamp: int, isolation: int
    ) -> tuple[dict[TopicPartition, int], str]:
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append((tp.partition, timestamp))
        request = OffsetRequest(-1, isolation, list(by_topic.items()))
        response = await self._require().send(node, request)
        if response.API_VERSION < 1:
            raise ChangelogReadError("the broker only speaks ListOffsets v0 (Kafka < 0.10.1)")
        found: dict[TopicPartition, int] = {}
        retry = ""
        for topic, partitions in response.topics:
            for partition, error_code, *rest in partitions:
                tp = TopicPartition(topic, partition)
                if error_code == 0:
                    found[tp] = int(rest[1])  # [timestamp, offset, ...]
                elif error_action(error_code) is ErrorAction.FAIL:
                    raise ChangelogReadError(
                        f"listing offsets of {_names([tp])}: {error_name(error_code)}"
                    )
                else:
                    retry = f"{_names([tp])}: {error_name(error_code)}"
        return found, retry

    # ------------------------------------------------------------------ reading

    async def read(self, max_records: int, timeout: float) -> dict[TopicPartition, ChangelogChunk]:
        """Records of the assigned partitions, waiting up to ``timeout`` seconds for some.

        Returns one chunk per partition that has records or moved forward (nothing once
        the reader is closed). Raises :class:`ChangelogOffsetOutOfRange` (those
        partitions are no longer read) or :class:`ChangelogReadError`.
        """
        # Yield once: answers arriving are read off the sockets and other tasks run.
        await asyncio.sleep(0)
        if self._client is None:
            return {}
        self._collect()
        self._send_fetches()
        if not any(part.has_unread() for part in self._parts.values()):
            await self._wait(timeout)
            if self._client is None:  # closed meanwhile
                return {}
            self._collect()
            self._send_fetches()
        return self._drain(max_records)

    async def _wait(self, timeout: float) -> None:
        waits: list[asyncio.Future[Any]] = [f.task for f in self._inflight.values()]
        if self._metadata is not None and not self._metadata.done():
            waits.append(self._metadata)
        if waits:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            return
        # nothing under way: every partition is at its end, waiting out a backoff, or none
        now = time.monotonic()
        retry_at = [p.retry_at for p in self._parts.values() if p.retry_at > now]
        await asyncio.sleep(min([timeout, *(t - now for t in retry_at)]))

    def _send_fetches(self) -> None:
        client = self._require()
        now = time.monotonic()
        wanted = [(tp, p.fetch_offset) for tp, p in self._parts.items() if p.wants_fetch(now)]
        if not wanted:
            return
        plan = plan_fetches(wanted, self._leader_of, self._inflight, self._fetch_rotation)
        self._fetch_rotation += 1
        if plan.leaderless:
            for tp in plan.leaderless:
                self._note_error(tp, "no leader known", now)
            self._request_metadata()
        for node, parts in plan.by_node.items():
            by_topic: dict[str, list[tuple[int, int, int]]] = {}
            for tp, offset in parts:
                by_topic.setdefault(tp.topic, []).append(
                    (tp.partition, offset, self._partition_max_bytes)
                )
            request = FetchRequest(
                self._max_wait_ms,
                1,  # min_bytes: answer as soon as there is anything
                self._fetch_max_bytes,
                self._isolation_level,
                list(by_topic.items()),
            )
            task = asyncio.ensure_future(client.send(node, request))
            self._inflight[node] = _InFlight(task, dict(parts))

    def _collect(self) -> None:
        """Take in every answer that arrived; raise after all of them were taken in."""
        out_of_range: dict[TopicPartition, int] = {}
        for node, inflight in list(self._inflight.items()):
            if not inflight.task.done():
                continue
            del self._inflight[node]
            failure = (
                asyncio.CancelledError() if inflight.task.cancelled() else inflight.task.exception()
            )
            if failure is None:
                self._absorb(inflight.task.result(), inflight.offsets, out_of_range)
                continue
            if isinstance(failure, KafkaError) and not failure.retriable:
                raise ChangelogReadError(
                    f"fetching from node {node} failed: {failure!r}"
                ) from failure
            if not isinstance(failure, KafkaError | asyncio.CancelledError):
                raise failure
            now = time.monotonic()
            for tp in inflight.offsets:
                self._note_error(tp, f"fetch from node {node} failed: {failure!r}", now)
            self._request_metadata()
        if out_of_range:
            for tp in out_of_range:
                self._parts.pop(tp, None)
            raise ChangelogOffsetOutOfRange(out_of_range)

    def _absorb(
        self,
        response: Any,
        offsets: Mapping[TopicPartition, int],
        out_of_range: dict[TopicPartition, int],
    ) -> None:
        version = response.API_VERSION
        read_committed = self._isolation_level == READ_COMMITTED
        now = time.monotonic()
        for topic, partitions in response.topics:
            for partition, error_code, _high_watermark, *rest in partitions:
                tp = TopicPartition(topic, partition)
                part = self._parts.get(tp)
                offset = offsets.get(tp)
                if part is None or offset is None or offset != part.fetch_offset:
                    continue  # unassigned or moved since: a stale answer
                if error_code != 0:
                    self._partition_error(tp, offset, error_code, now, out_of_range)
                    continue
                aborted, data = split_partition_answer(version, rest)
                try:
                    records = scan_record_set(
                        data,
                        offset,
                        aborted if read_committed else None,
                        check_crcs=self._check_crcs,
                    )
                except CorruptRecordSet as exc:
                    raise ChangelogReadError(f"{_names([tp])} at offset {offset}: {exc}") from exc
                if part.last_error is not None:
                    log.info("reading %s again", _names([tp]))
                    part.last_error = None
                if records.advanced:
                    part.sets.append(
                        _Buffered(records.start, deque(records.batches), records.next_offset)
                    )
                    part.fetch_offset = records.next_offset

    def _partition_error(
        self,
        tp: TopicPartition,
        offset: int,
        error_code: int,
        now: float,
        out_of_range: dict[TopicPartition, int],
    ) -> None:
        action = error_action(error_code)
        if action is ErrorAction.OUT_OF_RANGE:
            out_of_range[tp] = offset
        elif action is ErrorAction.FAIL:
            raise ChangelogReadError(
                f"fetching {_names([tp])} at offset {offset}: {error_name(error_code)}"
            )
        else:
            self._note_error(tp, error_name(error_code), now)
            if action is ErrorAction.REFRESH_METADATA:
                self._request_metadata()

    def _note_error(self, tp: TopicPartition, problem: str, now: float) -> None:
        part = self._parts.get(tp)
        if part is None:
            return
        part.retry_at = now + self._retry_backoff
        if part.last_error != problem:  # log each new problem once, not every retry
            log.warning("reading %s: %s; retrying", _names([tp]), problem)
            part.last_error = problem

    def _drain(self, max_records: int) -> dict[TopicPartition, ChangelogChunk]:
        out: dict[TopicPartition, ChangelogChunk] = {}
        tps = [tp for tp, part in self._parts.items() if part.has_unread()]
        if not tps:
            return out
        shift = self._drain_rotation % len(tps)
        self._drain_rotation += 1
        budget = max_records
        for tp in tps[shift:] + tps[:shift]:
            if budget <= 0:
                break
            part = self._parts[tp]
            records: list[Record] = []
            while part.sets and budget > 0:
                current = part.sets[0]
                batches = current.batches
                while batches and budget > 0:
                    batch = batches.popleft()
                    got = batch_records(batch, current.start)
                    records += got
                    budget -= len(got)
                    part.position = batch.next_offset
                if not batches:
                    part.position = current.next_offset
                    part.sets.popleft()
            out[tp] = ChangelogChunk(records, part.position)
        return out

    # ------------------------------------------------------------------ metadata

    def _leader_of(self, tp: TopicPartition) -> int | None:
        leader = self._require().cluster.leader_for_partition(tp)
        return None if leader is None else int(leader)

    def _track(self, topics: set[str]) -> None:
        """Keep metadata for these topics (the client tracks all topics until told)."""
        if topics <= self._topics:
            return
        self._topics |= topics
        self._metadata = self._require().set_topics(sorted(self._topics))

    def _request_metadata(self) -> None:
        if self._metadata is None or self._metadata.done():
            self._metadata = self._require().force_metadata_update()

    async def _await_metadata(self, deadline: float) -> None:
        pending = self._metadata
        if pending is None or pending.done():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(pending), max(0.0, deadline - time.monotonic()))

    def _require(self) -> AIOKafkaClient:
        if self._client is None:
            raise LifecycleError("the changelog reader is not started")
        return self._client


def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps))
