"""One read's retry loop, as decisions without I/O: both query clients drive it.

A client asks :attr:`ReadRetries.url` and hands what came of it (an :class:`Answer`, or
:class:`Unreachable`) to :meth:`ReadRetries.decide`, which says what to do next: the
read is :class:`Done`, or :class:`Retry` (which URL, after how long), or it raises the
:class:`~streamjoin.errors.QueryError` that ends the read. The rules:

* ``200``: the read's answer;
* ``503`` (rebalance, restore): ask the same host again after the ``Retry-After`` it
  names, as long as that stays within ``retry_for`` seconds of the read's start; past it,
  :class:`~streamjoin.errors.QueryUnavailable`;
* a host that cannot be reached: ask the next one at once, pausing (up to half a second)
  after each round of every host; once every host failed and the deadline passed,
  :class:`~streamjoin.errors.QueryFailed`;
* any other answer: the error the endpoint named (404, 400, 401), else
  :class:`~streamjoin.errors.QueryFailed`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamjoin.errors import (
    KeyNotFound,
    QueryError,
    QueryFailed,
    QueryKeyError,
    QueryUnauthorized,
    QueryUnavailable,
    UnknownTableError,
)

#: longest pause after a round of hosts none of which could be reached
ROUND_PAUSE = 0.5

_ERRORS: dict[str, type[QueryError]] = {
    "KeyNotFound": KeyNotFound,
    "UnknownTableError": UnknownTableError,
    "QueryKeyError": QueryKeyError,
    "QueryUnauthorized": QueryUnauthorized,
}


@dataclass(frozen=True)
class Answer:
    """What a host answered: status, body and ``Retry-After``, and the URL that answered."""

    status: int
    body: bytes
    retry_after: str | None
    url: str


@dataclass(frozen=True)
class Unreachable:
    """The host could not be asked (refused, unreachable, timed out): ``reason`` says how."""

    error: BaseException
    reason: str


@dataclass(frozen=True)
class Done:
    """The read's answer: the endpoint's JSON."""

    body: dict[str, Any]


@dataclass(frozen=True)
class Retry:
    """Ask ``url`` next, after ``wait`` seconds (None: at once)."""

    url: str
    wait: float | None


class ReadRetries:
    """One read: which host to ask next, and what each outcome means, within the deadline.

    ``url_of`` makes the read's URL on a host. ``turn`` says where in ``hosts`` to start:
    a client keeps :attr:`turn` after each decision, so its next read starts where this
    one ended (at the host that answered last)."""

    def __init__(
        self,
        hosts: Sequence[str],
        turn: int,
        retry_for: float,
        url_of: Callable[[str], str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hosts = hosts
        self.turn = turn
        self.retry_for = retry_for
        self._url_of = url_of
        self._clock = clock
        self.deadline = clock() + retry_for
        #: ``host: what went wrong``, each failed attempt in order
        self.failures: list[str] = []

    @property
    def host(self) -> str:
        return self.hosts[self.turn % len(self.hosts)]

    @property
    def url(self) -> str:
        """The URL to ask now."""
        return self._url_of(self.host)

    def decide(self, outcome: Answer | Unreachable) -> Done | Retry:
        """What to do after ``outcome``; raises the :class:`QueryError` ending the read."""
        if isinstance(outcome, Unreachable):
            wait = self._unreachable(outcome)
            return Retry(self.url, wait)
        if outcome.status == 200:
            body: dict[str, Any] = json.loads(outcome.body)
            return Done(body)
        error = error_for(outcome.status, outcome.body, outcome.retry_after, outcome.url)
        if not isinstance(error, QueryUnavailable):
            raise error
        return Retry(self.url, self._unavailable(error))

    def _unavailable(self, exc: QueryUnavailable) -> float:
        """Seconds to wait before asking again; raises when that passes the deadline."""
        self.failures.append(f"{self.host}: {exc}")
        if self._clock() + exc.retry_after > self.deadline:
            raise QueryUnavailable(
                f"no answer within {self.retry_for:.0f} s of retries: {exc}", exc.retry_after
            ) from exc
        return exc.retry_after

    def _unreachable(self, outcome: Unreachable) -> float | None:
        """Moves to the next host; seconds to wait first after each round of every host
        (None: ask the next one at once); raises :class:`QueryFailed` once every host
        failed and the deadline passed."""
        self.failures.append(f"{self.host}: {outcome.reason}")
        self.turn += 1
        if len(self.failures) >= len(self.hosts) and self._clock() >= self.deadline:
            raise QueryFailed(
                "no host answered: " + "; ".join(self.failures[-len(self.hosts) :])
            ) from outcome.error
        if self.turn % len(self.hosts) == 0:
            return min(ROUND_PAUSE, max(0.0, self.deadline - self._clock()))
        return None


def error_for(status: int, raw: bytes, retry_after: str | None, url: str) -> QueryError:
    """The :class:`QueryError` an error answer names (its body's ``error``), else one by
    status."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    message = body.get("message") or f"HTTP {status}"
    if status == 503:
        try:
            seconds = float(retry_after or "1")
        except ValueError:
            seconds = 1.0
        return QueryUnavailable(message, seconds)
    kind = _ERRORS.get(body.get("error", ""))
    if kind is not None:
        return kind(message)
    if status == 401:
        return QueryUnauthorized(message)
    return QueryFailed(f"{url}: {message}")
