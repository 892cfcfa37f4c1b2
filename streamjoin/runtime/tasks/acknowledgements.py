"""When a processed event counts in its task's offset ledger: once the records sent while
processing it were acknowledged by the broker (at-least-once), or at once (exactly-once:
its sends belong to the open transaction, which commits them all or none).

Sends are awaited by what the broker acknowledges together (a record batch, see
:class:`~streamjoin.context.Delivery`): the events waiting on one batch are listed under
it, and one callback per batch acknowledges them in order. A send the broker refused
for what the record is (:class:`~streamjoin.errors.RecordRejected`) gets the agent's
error policy, as if the agent had raised; any other failed send stops the worker
without committing past the event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from streamjoin.context import Delivery
from streamjoin.errors import AgentFailed, RecordRejected
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.tasks.error_policy import ErrorPolicy
from streamjoin.runtime.tasks.in_flight import InFlight
from streamjoin.runtime.transport.out_batches import Sent

#: (``Final``: a C static when compiled, not a module dict lookup per use)
_SENT: Final = Sent


class Acknowledgements:
    """Acknowledges finished events to their tasks' offset ledgers once their sends were."""

    def __init__(
        self,
        errors: ErrorPolicy,
        counters: WorkerCounters,
        *,
        on_crash: Callable[[BaseException], None],
        transactional: bool,
    ) -> None:
        #: exactly-once: an event counts as processed as soon as its function is done with
        #: it (its sends belong to the open transaction, which commits them all or none)
        self.transactional = transactional
        self._errors = errors
        self._counters = counters
        self._on_crash = on_crash
        #: events waiting for the acknowledgement of a record batch (or a lone send)
        self._waiting: dict[Any, list[InFlight]] = {}
        #: on_error policies being applied to events whose sends the broker refused
        self._policies: set[asyncio.Future[None]] = set()

    def complete(self, inflight: InFlight) -> None:
        """Acknowledge an event once its sends are acknowledged (at once when
        transactional: the commit checks every send of the transaction)."""
        sends = inflight.sends
        if not sends or self.transactional:
            self.acknowledge(inflight)
            return
        if len(sends) == 1:
            delivery = _acknowledged_by(sends[0])
            if not delivery.done():
                # the usual case (one send, its batch not yet acknowledged), without the
                # general loops below
                inflight.pending = 1
                inflight.task.awaiting_sends += 1
                events = self._waiting.get(delivery)
                if events is None:
                    self._waiting[delivery] = [inflight]
                    delivery.add_done_callback(self._delivered)
                else:
                    events.append(inflight)
                return
            awaited = [delivery]
        else:
            awaited = _acknowledgements(sends)
        pending = 0
        for delivery in awaited:
            if not delivery.done():
                pending += 1
            elif _failed(delivery) and inflight.batch is not None:
                self._batch_sends_failed(inflight, delivery)
            elif _failed(delivery):
                failed = _failed_send(inflight, delivery)
                if failed is not None:
                    self._send_failed(inflight, failed)
                    return
        if not pending:
            self.acknowledge(inflight)
            return
        inflight.pending = pending
        inflight.task.awaiting_sends += 1
        waiting = self._waiting
        for delivery in awaited:
            if delivery.done():
                continue
            events = waiting.get(delivery)
            if events is None:
                waiting[delivery] = [inflight]
                delivery.add_done_callback(self._delivered)
            else:
                events.append(inflight)

    def _delivered(self, delivery: Any) -> None:
        """A batch (or a lone send) was acknowledged or failed: so are the events waiting
        on it, in order."""
        events = self._waiting.pop(delivery, ())
        failed = _failed(delivery)
        for inflight in events:
            if inflight.pending <= 0:
                continue  # one of its sends failed already
            if failed and inflight.batch is not None:
                self._batch_sends_failed(inflight, delivery)
            elif failed:
                sent = _failed_send(inflight, delivery)
                if sent is not None:
                    inflight.pending = 0
                    inflight.task.awaiting_sends -= 1
                    self._send_failed(inflight, sent)
                    continue
            inflight.pending -= 1
            if inflight.pending == 0:
                inflight.task.awaiting_sends -= 1
                self.acknowledge(inflight)

    def acknowledge(self, inflight: InFlight) -> None:
        """Count the event processed in its task's offset ledger (if its task still takes
        acknowledgements)."""
        task = inflight.task
        if task.accepts_acks:
            batch = inflight.batch
            if batch is None:
                task.tracker.ack_records((inflight.record,))
                return
            settled = inflight.settled
            task.tracker.ack_records(
                batch if not settled else [raw for raw in batch if id(raw) not in settled]
            )

    def _batch_sends_failed(self, inflight: InFlight, delivery: Delivery) -> None:
        """Sends of a batch that ``delivery`` (failed) failed: the error policy applies to
        the whole batch, or (``per_event_errors``) to each event that made one, as if it had
        come alone; what it acknowledges is left out when the batch is acknowledged."""
        settled = inflight.settled
        batch = inflight.batch
        assert batch is not None
        if not inflight.split_errors:
            # the batch is the unit: the policy applies to all of it, once
            refused = next(
                (s for s in inflight.sends if _acknowledged_by(s) is delivery and _failed(s)), None
            )
            rest = [raw for raw in batch if id(raw) not in settled]
            if refused is None or not rest:
                return
            settled.update(map(id, rest))
            whole = InFlight(rest[0], inflight.task, inflight.join_stats, inflight.runner)
            whole.batch = rest
            self._send_failed(whole, refused)
            return
        for sent, record in zip(inflight.sends, inflight.senders, strict=True):
            if _acknowledged_by(sent) is delivery and _failed(sent) and id(record) not in settled:
                settled.add(id(record))
                alone = InFlight(record, inflight.task, inflight.join_stats, inflight.runner)
                self._send_failed(alone, sent)

    def _send_failed(self, inflight: InFlight, sent: Delivery) -> None:
        self._counters.error("send")
        raw = inflight.record
        exc = sent.exception() if not sent.cancelled() else asyncio.CancelledError()
        if isinstance(exc, RecordRejected):
            # The broker refused the record for what it is: the agent's on_error policy
            # applies to the event that sent it, as if the send had raised there.
            policy = asyncio.ensure_future(self._refused(inflight, exc))
            self._policies.add(policy)
            policy.add_done_callback(self._policies.discard)
            return
        failed = AgentFailed(
            f"a record sent while processing {raw.position} "
            f"was not acknowledged: {exc!r}; stopping without committing past it"
        )
        failed.__cause__ = exc  # (a refused ACL in it stops the worker with exit code 3)
        self._on_crash(failed)

    async def _refused(self, inflight: InFlight, exc: RecordRejected) -> None:
        try:
            await self._errors.apply(inflight, exc, "send")
            self.acknowledge(inflight)
        except Exception as failure:
            self._on_crash(failure)


def _failed(future: Delivery) -> bool:
    return future.cancelled() or future.exception() is not None


def _acknowledgements(sends: list[Delivery]) -> list[Delivery]:
    """The distinct deliveries that acknowledge ``sends``, in order: :func:`_acknowledged_by`
    of each, inlined for our own sends (a batch of events sends hundreds per call)."""
    found: dict[int, Delivery] = {}
    last: Delivery | None = None
    for sent in sends:
        delivery = sent.batch.future if type(sent) is _SENT else _acknowledged_by(sent)
        if delivery is not last:  # (consecutive sends usually share a record batch)
            found[id(delivery)] = last = delivery
    return list(found.values())


def _acknowledged_by(sent: Delivery) -> Delivery:
    """What acknowledges ``sent``: its record batch's future, or ``sent`` itself."""
    acknowledged: Delivery = getattr(sent, "acknowledged", sent)
    return acknowledged


def _failed_send(inflight: InFlight, delivery: Delivery) -> Delivery | None:
    """The event's first send that ``delivery`` (failed) failed: a batch may fail some of
    its records and not others (those sent again after a refusal)."""
    for sent in inflight.sends:
        if _acknowledged_by(sent) is delivery and _failed(sent):
            return sent
    return None
