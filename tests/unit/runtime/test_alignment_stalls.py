"""The aligner's max idle wait must measure waiting, not event-loop stalls.

A bug found by review: ``TimestampAligner.release(caught_up, now_ms)`` compared
``now_ms`` with the time the group started waiting, so when the event loop stalled
longer than ``max_idle_ms`` between two release calls (a long burst of processing, a
GC pause, a throttled or stopped process), the next call forced the group although the
consumer never got a chance to fetch the other side, which is known to have more data.
``test_a_stall_between_two_releases_does_not_force`` failed on that code; the
steady-polling test pins the behavior the fix keeps (waits grow by bounded steps).
"""

from __future__ import annotations

from streamjoin.events import RawRecord
from streamjoin.runtime.tasks.alignment import TimestampAligner

MAX_IDLE_MS = 5_000
POLL_MS = 100  # the consumer's getmany timeout: the fetch loop releases about this often


def rec(topic: str, offset: int, ts: int) -> RawRecord:
    return RawRecord(topic, 0, offset, ts, b"k", b"v")


def more_to_fetch(topic: str, partition: int, since: float) -> bool:
    """``caught_up`` for a side known to have more data (never caught up)."""
    return False


def blocked_aligner() -> TimestampAligner:
    """clk has a buffered record; imp, which has more data to fetch, has none yet."""
    aligner = TimestampAligner([("imp", "clk")], max_idle_ms=MAX_IDLE_MS)
    aligner.add([rec("clk", 0, 1_000), rec("clk", 1, 2_000)])
    return aligner


def test_a_stall_between_two_releases_does_not_force() -> None:
    """The group starts waiting for imp at t=0 and is polled for a second; then the event
    loop stalls for 6 s (> max_idle_ms) and the next release comes at t=7,000.

    The consumer fetched nothing during the stall, so imp was not idle for 5 s: it was not
    asked. Forcing clk through now processes clk@1000 without the impressions that may
    precede it (they will be late for the join when they arrive).
    FAILS on the current code: the call after the stall forces clk@1000.
    """
    aligner = blocked_aligner()
    for now in range(0, 1_000 + 1, POLL_MS):
        assert aligner.release(more_to_fetch, now) == []
    after_stall = aligner.release(more_to_fetch, 7_000)
    assert after_stall == [] and aligner.forced == [], (
        f"a 6 s stall between two release calls counted as {MAX_IDLE_MS} ms without data "
        f"from imp: forced {[(r.topic, r.offset) for r in after_stall]} "
        f"(forced={aligner.forced})"
    )
    # Once the consumer polls again, a side that stays empty is still not waited for
    # forever: steady polling for max_idle_ms after the stall forces the group.
    released = []
    for now in range(7_000 + POLL_MS, 7_000 + MAX_IDLE_MS + POLL_MS + 1, POLL_MS):
        released += aligner.release(more_to_fetch, now)
    assert [r.offset for r in released][:1] == [0]
    assert aligner.forced[:1] == [("imp", 0)]


def test_steady_polling_longer_than_max_idle_still_forces() -> None:
    """Polled every 100 ms with imp known to have more data and never delivering any,
    the group waits max_idle_ms and then goes ahead without imp (logged as forced)."""
    aligner = blocked_aligner()
    first_forced_at = None
    for now in range(0, 2 * MAX_IDLE_MS + 1, POLL_MS):
        released = aligner.release(more_to_fetch, now)
        if released:
            first_forced_at = now
            assert [(r.topic, r.offset) for r in released] == [("clk", 0)]
            assert aligner.forced == [("imp", 0)]
            break
    assert first_forced_at is not None, "never forced although imp delivered nothing"
    assert MAX_IDLE_MS <= first_forced_at <= MAX_IDLE_MS + POLL_MS


def test_data_arriving_within_max_idle_is_waited_for() -> None:
    """The point of waiting: imp@500 arrives after 3 s of polling and goes first (then
    the group waits for imp again)."""
    aligner = blocked_aligner()
    for now in range(0, 3_000 + 1, POLL_MS):
        assert aligner.release(more_to_fetch, now) == []
    aligner.add([rec("imp", 0, 500)])
    out = aligner.release(more_to_fetch, 3_100)
    assert [(r.topic, r.timestamp) for r in out] == [("imp", 500)]
    assert aligner.forced == []
