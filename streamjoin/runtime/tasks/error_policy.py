"""What happens to an event its agent could not process: the agent's ``on_error``.

A record that does not decode, an agent function that raises, a record the broker
refuses: ``stop`` stops the worker without counting the event processed, ``skip`` logs
one line, ``dead_letter`` sends the record (each record of a batch) to the agent's
dead-letter topic with headers saying why. The caller then acknowledges the event, so
its offset is committed past it. A corrupted store is not the record's fault: the
policy does not apply (:func:`corrupted_store_behind` finds it, the worker rebuilds the
store and the record is read again), nor is a failing schema registry (the worker stops,
whatever the policy).
"""

from __future__ import annotations

import logging
import traceback

from streamjoin.context import Sender
from streamjoin.errors import (
    AgentFailed,
    DecodeError,
    RecordRejected,
    SchemaRegistryError,
    StoreCorrupted,
)
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.tasks.in_flight import InFlight

log = logging.getLogger("streamjoin.agents")

#: how a failure of each kind reads in the log ("agent X <what> topic[p]@offset: ...")
_WHAT = {
    "decode": "could not decode",
    "processing": "failed on",
    "send": "had a record refused by the broker while processing",
}


class ErrorPolicy:
    """Applies each agent's ``on_error`` to the events it failed on, and counts them."""

    def __init__(self, sender: Sender, counters: WorkerCounters, *, transactional: bool) -> None:
        self.sender = sender
        self.counters = counters
        #: exactly-once: dead letters are not awaited (the commit checks every send)
        self.transactional = transactional

    async def apply(self, inflight: InFlight, exc: BaseException, kind: str) -> None:
        """The agent's ``on_error`` for the event (or the whole batch) ``inflight``, which
        failed with ``exc`` (``kind``: decode, processing or send). Raises
        :class:`AgentFailed` for ``stop``; otherwise the caller acknowledges the event."""
        runner = inflight.runner
        raw = inflight.record
        records = [raw] if inflight.batch is None else inflight.batch
        where = records[0].position
        if len(records) > 1:
            where = f"the batch of {len(records)} events {where} to {records[-1].position}"
        what = _WHAT.get(kind, "failed on")
        policy = runner.agent.on_error
        if policy != "stop" and _registry_failure(exc):
            policy = "stop"  # the schema registry failed, not the record: read it again later
        counters = self.counters
        counters.error(kind)
        if policy != "stop":
            failed = counters.skipped if policy == "skip" else counters.dead_lettered
            failed[runner.agent.name] = failed.get(runner.agent.name, 0) + len(records)
        if policy == "stop":
            # one line, with where the agent raised; the traceback is at DEBUG
            log.error("agent %s %s %s: %s; stopping", runner.name, what, where, _say(exc))
            log.debug("traceback of the failed record %s", where, exc_info=exc)
            raise AgentFailed(f"agent {runner.name} {what} {where}: {_say(exc)}") from exc
        if policy == "skip":
            # one line per skipped record; the traceback is for debugging only
            log.warning("agent %s %s %s: %s; skipped", runner.name, what, where, _say(exc))
            log.debug("traceback of the skipped record %s", where, exc_info=exc)
            return
        dlq = runner.agent.dead_letter
        if dlq is None:  # rejected when the agent is declared; kept for type narrowing
            raise AgentFailed(f"agent {runner.name} has no dead-letter topic") from exc
        error = ("streamjoin-error", f"{kind}: {exc!r}"[:2000].encode())
        agent = ("streamjoin-agent", runner.agent.name.encode())
        futures = []
        for record in records:
            headers = (
                *record.headers,
                error,
                ("streamjoin-source", record.position.encode()),
                agent,
            )
            futures.append(
                await self.sender.send(
                    (dlq.name, record.key, record.value, None, headers, record.timestamp)
                )
            )
        if not self.transactional:  # (exactly-once: the commit checks every send)
            for future in futures:
                await future
        log.warning(
            "agent %s %s %s: %s; sent to dead-letter topic %s",
            runner.name,
            what,
            where,
            _say(exc),
            dlq.name,
        )
        log.debug("traceback of the dead-lettered record %s", where, exc_info=exc)


def corrupted_store_behind(exc: BaseException) -> StoreCorrupted | None:
    """The :class:`StoreCorrupted` behind ``exc`` (itself, or what it was raised from)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, StoreCorrupted):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _registry_failure(exc: BaseException) -> bool:
    """Whether a schema registry's failure is behind ``exc`` (unreachable, refusing a
    schema): skipping or dead-lettering the record would lose it for a fault of the
    registry, so the worker stops instead and a restart reads the record again."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None or isinstance(current, DecodeError):  # (an unknown schema id)
            return False
        if isinstance(current, SchemaRegistryError):
            return True
        current = current.__cause__ or current.__context__
    return False


def _say(exc: BaseException) -> str:
    """``Type: message (file:line)``, the line where the agent's code raised (a refused or
    undecodable record's message says what is wrong with it instead)."""
    if isinstance(exc, RecordRejected | DecodeError):
        return f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{place}"
