"""The query clients' one retry loop, decided without I/O: outcomes in, steps out, on a
clock the test moves by hand."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamjoin.errors import KeyNotFound, QueryFailed, QueryUnauthorized, QueryUnavailable
from streamjoin.query.retries import Answer, Done, ReadRetries, Retry, Unreachable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _retries(
    hosts: list[str], clock: Clock, *, turn: int = 0, retry_for: float = 10.0
) -> ReadRetries:
    return ReadRetries(hosts, turn, retry_for, lambda host: f"http://{host}/t/k", clock=clock)


def _answer(status: int, body: dict[str, Any], retry_after: str | None = None) -> Answer:
    return Answer(status, json.dumps(body).encode(), retry_after, "http://a/t/k")


def _refused() -> Unreachable:
    return Unreachable(ConnectionRefusedError("refused"), "refused")


def test_a_200_is_the_answer() -> None:
    retries = _retries(["a", "b"], Clock())
    assert retries.url == "http://a/t/k"
    assert retries.decide(_answer(200, {"value": 3})) == Done({"value": 3})


def test_a_503_asks_the_same_host_again_after_its_retry_after() -> None:
    clock = Clock()
    retries = _retries(["a", "b"], clock)
    step = retries.decide(_answer(503, {"error": "QueryUnavailable"}, retry_after="2"))
    assert step == Retry("http://a/t/k", 2.0)
    clock.now += 2
    # no Retry-After (or an unreadable one): a second
    assert retries.decide(_answer(503, {}, retry_after="soon")) == Retry("http://a/t/k", 1.0)


def test_503s_give_up_when_the_next_wait_would_pass_the_deadline() -> None:
    clock = Clock()
    retries = _retries(["a"], clock, retry_for=5.0)
    assert retries.decide(_answer(503, {}, retry_after="3")) == Retry("http://a/t/k", 3.0)
    clock.now += 3
    # 3 s in, 2 s left: waiting 2 more is still within the bound, 2.5 is not
    assert retries.decide(_answer(503, {}, retry_after="2")) == Retry("http://a/t/k", 2.0)
    clock.now += 2
    with pytest.raises(QueryUnavailable, match="no answer within 5 s of retries") as raised:
        retries.decide(_answer(503, {"message": "restoring"}, retry_after="0.5"))
    assert raised.value.retry_after == 0.5


def test_an_unreachable_host_moves_on_at_once_and_pauses_after_each_round() -> None:
    clock = Clock()
    retries = _retries(["a", "b", "c"], clock)
    assert retries.decide(_refused()) == Retry("http://b/t/k", None)
    assert retries.decide(_refused()) == Retry("http://c/t/k", None)
    # every host was asked once: a pause before the next round
    assert retries.decide(_refused()) == Retry("http://a/t/k", 0.5)
    clock.now += 9.8
    retries.decide(_refused())
    retries.decide(_refused())
    # the pause never runs past the deadline
    step = retries.decide(_refused())
    assert isinstance(step, Retry) and step.wait == pytest.approx(0.2)


def test_the_turn_carries_over_to_the_next_read() -> None:
    retries = _retries(["a", "b", "c"], Clock(), turn=4)
    assert retries.url == "http://b/t/k"
    assert retries.decide(_refused()) == Retry("http://c/t/k", None)
    assert retries.turn == 5  # the client starts its next read here


def test_no_host_answering_by_the_deadline_is_a_query_failed_naming_the_last_round() -> None:
    clock = Clock()
    retries = _retries(["a", "b"], clock, retry_for=1.0)
    assert retries.decide(Unreachable(OSError("old"), "old")) == Retry("http://b/t/k", None)
    clock.now += 0.5
    assert retries.decide(_refused()) == Retry("http://a/t/k", 0.5)
    clock.now += 0.5
    with pytest.raises(QueryFailed, match=r"no host answered: b: refused; a: timed out") as raised:
        retries.decide(Unreachable(TimeoutError("t"), "timed out"))
    assert isinstance(raised.value.__cause__, TimeoutError)


def test_every_host_is_asked_once_even_past_the_deadline() -> None:
    retries = _retries(["a", "b"], Clock(), retry_for=0.0)
    assert retries.decide(_refused()) == Retry("http://b/t/k", None)
    with pytest.raises(QueryFailed, match="no host answered: a: refused; b: refused"):
        retries.decide(_refused())


def test_a_host_that_answers_ends_the_read_with_its_error() -> None:
    retries = _retries(["a", "b"], Clock())
    with pytest.raises(KeyNotFound, match="no such key"):
        retries.decide(_answer(404, {"error": "KeyNotFound", "message": "no such key"}))
    with pytest.raises(QueryUnauthorized):
        retries.decide(_answer(401, {}))
    with pytest.raises(QueryFailed, match="http://a/t/k: HTTP 500"):
        retries.decide(Answer(500, b"not json", None, "http://a/t/k"))
    assert retries.turn == 0  # an answer, even an error, leaves the turn where it was
