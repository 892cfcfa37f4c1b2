"""The fetcher: aiokafka's consumer used only to fetch, pause, resume and seek.

Group membership is ours (:mod:`streamjoin.runtime.group.membership`), so the aiokafka
consumer joins no group: it fetches, by manual assignment, the partitions it is pointed
at, from the positions it is given. It knows nothing of tasks or of the group; the
worker's group member (:mod:`streamjoin.runtime.member`) decides what to fetch and from
where, and hands what comes back to the tasks.

A partition may be paused for several reasons at once (its tables are restoring, the
aligner holds enough of it): it is resumed when no reason is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from streamjoin.runtime.transport.fetched_records import RAW_RECORDS
from streamjoin.runtime.transport.fetched_records import install as install_raw_records

log = logging.getLogger("streamjoin.consumer")

TP = tuple[str, int]

#: the longest the broker holds a fetch that finds no data (aiokafka's default is 500 ms).
#: aiokafka keeps one fetch in flight per broker, and a partition paused for alignment is
#: left out of it: while the paused inputs are processed, the fetch asks only for inputs
#: that have nothing new, and the broker holds it this long. Once the paused inputs resume
#: they wait for that fetch to come back, so on a backlog a join stalled about this long
#: after every pause (measured: about 1.2 s of an 8 s enrichment run at 500 ms).
FETCH_MAX_WAIT_MS = 100
#: consumer options that configure group membership (ours), not aiokafka's fetching
GROUP_OPTIONS = frozenset(
    {
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "rebalance_timeout_ms",
        "max_poll_interval_ms",
        "group_id",
        "group_instance_id",
        "partition_assignment_strategy",
        "enable_auto_commit",
        "auto_commit_interval_ms",
    }
)


def fetch_options(
    bootstrap_servers: str,
    *,
    client_id: str,
    client_options: Mapping[str, Any],
    consumer_options: Mapping[str, Any],
    read_committed: bool,
) -> dict[str, Any]:
    """aiokafka consumer options for fetching only (group options are the membership's)."""
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "group_id": None,
        "client_id": client_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_records": 10_000,
        "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
        **client_options,
        **{k: v for k, v in consumer_options.items() if k not in GROUP_OPTIONS},
        "key_deserializer": RAW_RECORDS,  # hands out RawRecord (fetched_records)
    }
    if read_committed:
        # Exactly-once: read only committed input.
        options["isolation_level"] = "read_committed"
    return options


class Fetcher:
    """Fetches the partitions it is pointed at; pauses, resumes and seeks them."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        self._consumer: AIOKafkaConsumer | None = None
        #: why each partition is paused ("restore", "align"); resumed when none is left
        self._pauses: dict[TopicPartition, set[str]] = {}
        #: bumped whenever the fetcher is pointed elsewhere (a batch fetched before is stale)
        self.epoch = 0
        #: given-up partitions still in aiokafka's assignment, paused until the next
        #: :meth:`point_at` replaces it (they may come back, and must then start afresh)
        self._dropped: set[TopicPartition] = set()

    @property
    def resets_to_earliest(self) -> bool:
        return bool(self.options.get("auto_offset_reset") == "earliest")

    async def start(self) -> None:
        install_raw_records()
        self._consumer = AIOKafkaConsumer(**self.options)
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await _stop_consumer(consumer)

    @property
    def started(self) -> bool:
        return self._consumer is not None

    def kafka_client(self) -> Any:
        """The aiokafka client under the consumer (None when not started): the membership
        closes its connections to a broker gone silent
        (:func:`~streamjoin.runtime.transport.connections.drop_connections`)."""
        return getattr(self._consumer, "_client", None)

    async def getmany(self, timeout_ms: int) -> dict[TopicPartition, list[Any]]:
        """The next fetched records of each partition (empty when pointed nowhere yet)."""
        consumer = self._consumer
        if consumer is None:
            return {}
        try:
            batches: dict[TopicPartition, list[Any]] = await consumer.getmany(timeout_ms=timeout_ms)
            return batches
        except IllegalStateError:  # not assigned yet
            await asyncio.sleep(timeout_ms / 1000)
            return {}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if self._consumer is not None:
            self._consumer.seek(tp, offset)

    def pause(self, tp: TopicPartition, reason: str) -> None:
        reasons = self._pauses.setdefault(tp, set())
        if not reasons and self._consumer is not None:
            self._consumer.pause(tp)
        reasons.add(reason)

    def resume(self, tp: TopicPartition, reason: str) -> None:
        reasons = self._pauses.get(tp)
        if reasons is None:
            return
        reasons.discard(reason)
        if not reasons:
            del self._pauses[tp]
            consumer = self._consumer
            if consumer is not None and tp in consumer.assignment() and tp not in self._dropped:
                consumer.resume(tp)

    def paused_for(self, reason: str) -> list[TopicPartition]:
        return [tp for tp, reasons in self._pauses.items() if reason in reasons]

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching ``tps`` (given up). Only paused here: the next :meth:`point_at`
        sets what is fetched. Taking them out of aiokafka's assignment now would reset the
        kept partitions that had handed nothing out yet to the reset policy (earliest: a
        replay onto their state)."""
        gone = set(tps)
        for tp in gone:
            self._pauses.pop(tp, None)
        consumer = self._consumer
        if consumer is not None:
            assigned = consumer.assignment()
            dropped = [tp for tp in gone if tp in assigned]
            consumer.pause(*dropped)
            self._dropped.update(dropped)

    def point_at(self, owned: Iterable[TP], starts: Mapping[TP, int]) -> None:
        """Fetch ``owned``, each from ``starts`` (the reset policy's offset if absent);
        partitions paused for a reason stay paused. Unchanged: nothing is touched (a
        probing rebalance keeps the fetcher's buffers and positions)."""
        consumer = self._consumer
        if consumer is None:
            return
        tps = {TopicPartition(*tp) for tp in owned}
        if tps == consumer.assignment() and not self._dropped:
            return
        self.epoch += 1
        self._dropped.clear()
        consumer.assign(sorted(tps))
        for tp in tps:
            start = starts.get((tp.topic, tp.partition))
            if start is not None:
                consumer.seek(tp, start)
            if self._pauses.get(tp):
                consumer.pause(tp)

    async def fetched_all_at(
        self, waiting: Sequence[TP], handed_out: Mapping[TP, int]
    ) -> dict[TP, float | None]:
        """For each partition in ``waiting``: since when (ms) everything up to its end is
        known to have been handed out; ``inf`` for caught up now, or for a partition not
        fetched here (never wait for it); None when it may have more.

        ``handed_out``: the next offset handed out per partition (aiokafka's own position
        counts records buffered but not handed out yet)."""
        consumer = self._consumer
        out: dict[TP, float | None] = {}
        if consumer is None:
            return {tp: float("inf") for tp in waiting}
        stale: list[TopicPartition] = []
        assigned = consumer.assignment()
        for topic, partition in waiting:
            tp = TopicPartition(topic, partition)
            # highwater() and last_poll_timestamp() assert that the partition is assigned
            if tp not in assigned:
                out[(topic, partition)] = float("inf")
                continue
            try:
                highwater = consumer.highwater(tp)
                polled = consumer.last_poll_timestamp(tp)
                delivered = handed_out.get((topic, partition))
                if delivered is None:  # nothing handed out yet: aiokafka buffers nothing past it
                    delivered = await consumer.position(tp)
            except (IllegalStateError, KafkaError):
                out[(topic, partition)] = float("inf")
                continue
            at_end = highwater is not None and delivered >= highwater
            out[(topic, partition)] = float(polled) if at_end and polled else None
            if at_end:
                stale.append(tp)  # aiokafka may not refresh an idle partition's high watermark
        if stale:
            # Ask the broker directly: a fresh end offset settles whether there is more to read.
            with contextlib.suppress(KafkaError, IllegalStateError):
                ends = await consumer.end_offsets(stale)
                for tp in stale:
                    delivered = handed_out.get((tp.topic, tp.partition))
                    if delivered is None:
                        delivered = await consumer.position(tp)
                    # fresh by construction: caught up now, whenever the wait began
                    out[(tp.topic, tp.partition)] = float("inf") if delivered >= ends[tp] else None
        return out

    async def end_offsets(self, tps: Sequence[TP]) -> dict[TP, int]:
        consumer = self._consumer
        if consumer is None or not tps:
            return {}
        ends = await consumer.end_offsets([TopicPartition(*tp) for tp in tps])
        return {(tp.topic, tp.partition): int(end) for tp, end in ends.items()}

    async def beginning_offsets(self, tps: Sequence[TP]) -> dict[TP, int]:
        consumer = self._consumer
        if consumer is None or not tps:
            return {}
        starts = await consumer.beginning_offsets([TopicPartition(*tp) for tp in tps])
        return {(tp.topic, tp.partition): int(start) for tp, start in starts.items()}


async def _stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """Stop a group-less aiokafka consumer; its stop() can re-raise the cancellation of
    its own fetch task, which is not ours to propagate."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    except KafkaError as exc:
        log.debug("consumer stop: %r", exc)
