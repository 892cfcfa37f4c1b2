"""A record appended to its partition's open batch without awaiting: the per-record part
of :meth:`KafkaSender.send_now <streamjoin.runtime.transport.producer.KafkaSender>`.

Compiled with mypyc (:mod:`streamjoin.compiled`): every record a worker sends passes
here. The sender (a mode service, interpreted) holds one :class:`QuickAppend` sharing its
outboxes and partition counts, and tells it when sends close (a transaction ending) or
the producer is being replaced; everything that has to wait stays in the sender, which
takes a record this declines (None) the long way.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from streamjoin.quick_partition import partition_of
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.transport.out_batches import Outbox, Sent
from streamjoin.runtime.transport.record_limits import RecordLimits

__all__ = ["NO_HEADERS", "AnyRecord", "BatchStarter", "QuickAppend"]

#: a topic without a size limit (RecordLimits.quick)
_ANY: Final = sys.maxsize
#: the headers of a record without any (the batch builder wants a list; it only reads it)
NO_HEADERS: Final[list[tuple[str, bytes]]] = []

#: an :data:`~streamjoin.context.OutgoingRecord`, its parts unchecked (a user's codec
#: may give a bytearray: the record limits word what is wrong with a record)
AnyRecord = tuple[Any, Any, Any, Any, Any, Any]

#: the sender's way to start a batch for a record, or to append it to a full batch's
#: successor: ``(outbox, record, headers as a list)`` to its Sent, or None (not now)
BatchStarter = Callable[[Outbox, Any, list[tuple[str, bytes]]], Sent | None]

#: (``Final``: a C static when compiled, not a module dict lookup per use)
_SENT: Final = Sent
#: the records of no batch (never appended to)
_NO_RECORDS: Final[list[Any]] = []


class QuickAppend:
    """Appends a record to an open batch of a partition already sent to; None for every
    other case (a new partition, a record without key or partition starting a batch, a
    producer being replaced, sends closed, too many full batches waiting)."""

    def __init__(
        self,
        outboxes: dict[tuple[str, int], Outbox],
        sticky: dict[str, Outbox],
        partition_counts: dict[str, int],
        limits: RecordLimits,
        counters: WorkerCounters,
        check_each_size: bool,
        start_batch: BatchStarter,
    ) -> None:
        self.outboxes = outboxes
        self.sticky = sticky
        self.partition_counts = partition_counts
        #: what the written topics accept (its ``quick`` limits are replaced as topics
        #: become known: read through this object each time)
        self.limits = limits
        #: ``records_out`` counts each record appended (the worker may swap the counters)
        self.counters = counters
        #: every record is checked against the request size: none is appended here
        self.check_each_size = check_each_size
        self.start_batch = start_batch
        #: sends are closed (a transactional sender ending its transaction)
        self.closed = False
        #: the new producer being started after a refusal (sends wait for it), or None
        self.replacing: asyncio.Future[None] | None = None

    def send_now(self, record: AnyRecord, check: bool = True) -> Sent | None:
        """The sender's ``send_now``: :meth:`append_now` unless sends are closed (then
        the caller awaits ``send()``, which holds the record for the next transaction)."""
        if self.closed:
            return None
        return self.append_now(record, check)

    def append_now(self, record: AnyRecord, check: bool) -> Sent | None:
        """Append ``record`` and count it in ``records_out``; None when it needs the long
        way. ``check``: the record has not passed :meth:`RecordLimits.check` yet (then
        only a record near its topic's limit, or with headers or without key, is checked
        in full)."""
        if self.replacing is not None:
            return None
        topic, key, value, partition, headers, timestamp_ms = record
        if check:
            limits = self.limits
            if (
                key is None
                or headers
                or limits.rejected
                or len(key) + (0 if value is None else len(value)) >= limits.quick.get(topic, _ANY)
            ):
                limits.check(topic, key, value, headers)
        outbox: Outbox | None
        if partition is None:
            if key is None:
                outbox = self.sticky.get(topic)
            else:
                count = self.partition_counts.get(topic)
                if count is None:
                    return None
                outbox = self.outboxes.get((topic, partition_of(key, count)))
        else:
            outbox = self.outboxes.get((topic, partition))
        if outbox is None or self.check_each_size:
            return None
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
            record = (topic, key, value, partition, headers, timestamp_ms)
        listed: Any = headers if type(headers) is list else list(headers) if headers else NO_HEADERS
        batch = outbox.open
        # (a list typed as one: appended to and measured natively)
        records: list[Any] = _NO_RECORDS if batch is None else batch.records
        if (
            batch is None
            or not records
            or batch.append_record(len(records), timestamp_ms, key, value, listed) is None
        ):
            # a batch's first record, or a full batch: a new one opens (a record with neither
            # key nor partition picks its partition again, the long way)
            if partition is None and key is None:
                return None
            sent = self.start_batch(outbox, record, listed)
            if sent is None:
                return None
        else:
            records.append(record)  # (kept as given: it describes a refusal, or is sent again)
            sent = _SENT(topic, batch, len(records) - 1)
        out = self.counters.records_out
        out[topic] = out.get(topic, 0) + 1
        return sent
