"""Agents through the in-memory test driver: ordering, sends, error policies, offsets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streamjoin import App
from streamjoin.context import OutgoingRecord
from streamjoin.errors import AgentFailed, ArgumentTypeError, ConfigurationError, RecordRejected
from streamjoin.events import RawRecord
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.testing.driver import TestDriver
from tests.unit.runtime.agent_support import ManualSender, running


def make_app(**kwargs: Any) -> App:
    return App("unit-app", topic_partitions=4, **kwargs)


async def test_agent_transforms_events_in_partition_order() -> None:
    app = make_app()
    source = app.topic("words", key_serializer="str", value_serializer="json")
    sink = app.topic("upper", key_serializer="str", value_serializer="json")
    seen: list[tuple[int, int]] = []

    @app.agent(source)
    async def shout(stream: Stream) -> None:
        async for event in stream:
            seen.append((event.partition, event.offset))
            await sink.send(key=event.key, value=event.value.upper())

    async with TestDriver(app) as driver:
        for i in range(20):
            await driver.put("words", key=f"k{i % 5}", value=f"w{i}")
        await driver.drain()
        out = driver.records("upper")
        assert sorted(e.value for e in out) == sorted(f"W{i}" for i in range(20))
        # every key keeps its partition (murmur2) and per-partition order is kept
        for e in out:
            assert e.partition == partition_for_key(e.key.encode(), 4)
        for p in range(4):
            offsets = [o for part, o in seen if part == p]
            assert offsets == sorted(offsets)
        committed = driver.committable()
        assert sum(committed.values()) == 20


async def test_items_yields_key_value_pairs() -> None:
    app = make_app()
    topic = app.topic("t", key_serializer="str")
    got: list[tuple[str, Any]] = []

    @app.agent(topic)
    async def collect(stream: Stream) -> None:
        async for key, value in stream.items():
            got.append((key, value))

    async with TestDriver(app) as driver:
        await driver.put("t", key="a", value={"n": 1})
        await driver.drain()
    assert got == [("a", {"n": 1})]


async def test_concurrency_splits_partitions_and_keeps_order() -> None:
    app = make_app()
    topic = app.topic("t", partitions=4)
    by_actor: dict[int, list[tuple[int, int]]] = {}

    @app.agent(topic, concurrency=2)
    async def work(stream: Stream) -> None:
        async for event in stream:
            await asyncio.sleep(0)
            actor = id(asyncio.current_task())
            by_actor.setdefault(actor, []).append((event.partition, event.value))

    async with TestDriver(app) as driver:
        for i in range(40):
            await driver.put("t", value=i, partition=i % 4)
        await driver.drain()
    assert len(by_actor) == 2
    for events in by_actor.values():
        parities = {p % 2 for p, _ in events}
        assert len(parities) == 1  # an actor owns partitions of one residue
        for p in {p for p, _ in events}:
            values = [v for part, v in events if part == p]
            assert values == sorted(values)


async def test_chained_agents() -> None:
    app = make_app()
    a = app.topic("a")
    b = app.topic("b")
    c = app.topic("c")

    @app.agent(a)
    async def first(stream: Stream) -> None:
        async for event in stream:
            await b.send(value=event.value + 1)

    @app.agent(b)
    async def second(stream: Stream) -> None:
        async for event in stream:
            await c.send(value=event.value * 10)

    async with TestDriver(app) as driver:
        await driver.put("a", value=1)
        await driver.drain()
        await driver.drain()
        assert [e.value for e in driver.records("c")] == [20]


async def test_stop_policy_fails_and_does_not_commit_past_the_event() -> None:
    app = make_app()
    topic = app.topic("t", partitions=1)

    @app.agent(topic)
    async def fragile(stream: Stream) -> None:
        async for event in stream:
            if event.value == "boom":
                raise ValueError("cannot handle boom")

    async with TestDriver(app) as driver:
        await driver.put("t", value="ok")
        await driver.put("t", value="boom")
        await driver.put("t", value="after")
        with pytest.raises(AgentFailed, match=r"t\[0\]@1.*cannot handle boom"):
            await driver.drain()
        assert driver.committable() == {("t", 0): 1}


async def test_skip_policy_goes_on() -> None:
    app = make_app()
    topic = app.topic("t", partitions=1)
    done: list[str] = []

    @app.agent(topic, on_error="skip")
    async def tolerant(stream: Stream) -> None:
        async for event in stream:
            if event.value == "boom":
                raise ValueError("boom")
            done.append(event.value)

    async with TestDriver(app) as driver:
        for v in ("a", "boom", "b"):
            await driver.put("t", value=v)
        await driver.drain()
        assert done == ["a", "b"]
        assert driver.committable() == {("t", 0): 3}


async def test_dead_letter_policy_keeps_the_raw_record_and_the_error() -> None:
    app = make_app()
    topic = app.topic("t", partitions=1)

    @app.agent(topic, on_error="dead_letter", name="checker")
    async def checker(stream: Stream) -> None:
        async for event in stream:
            if event.value < 0:
                raise ValueError(f"negative amount {event.value}")

    assert app.agents["checker"].dead_letter is not None
    dlq = app.agents["checker"].dead_letter.name
    assert dlq == "unit-app-checker-dead-letters"
    async with TestDriver(app) as driver:
        for v in (1, -5, 2):
            await driver.put("t", value=v)
        await driver.drain()
        dead = driver.raw_records(dlq)
        assert [r.value for r in dead] == [b"-5"]
        headers = dict(dead[0].headers)
        assert headers["streamjoin-source"] == b"t[0]@1"
        assert b"negative amount -5" in headers["streamjoin-error"]
        assert driver.committable() == {("t", 0): 3}


@pytest.mark.parametrize("policy", ["stop", "skip", "dead_letter"])
async def test_undecodable_records_follow_the_policy(policy: str) -> None:
    app = make_app()
    topic = app.topic("t", partitions=1, value_serializer="json")
    good: list[Any] = []

    @app.agent(topic, on_error=policy, name="decoder")  # type: ignore[arg-type]
    async def decoder(stream: Stream) -> None:
        async for event in stream:
            good.append(event.value)

    async with TestDriver(app) as driver:
        await driver.put("t", value={"ok": 1})
        await driver.put_raw("t", None, b"\xff not json")
        await driver.put("t", value={"ok": 2})
        if policy == "stop":
            with pytest.raises(AgentFailed, match=r"could not decode t\[0\]@1"):
                await driver.drain()
            assert good == [{"ok": 1}]
            assert driver.committable() == {("t", 0): 1}
            return
        await driver.drain()
        assert good == [{"ok": 1}, {"ok": 2}]
        assert driver.committable() == {("t", 0): 3}
        if policy == "dead_letter":
            assert [r.value for r in driver.raw_records("unit-app-decoder-dead-letters")] == [
                b"\xff not json"
            ]


async def test_agent_that_returns_is_an_error() -> None:
    app = make_app()
    topic = app.topic("t", partitions=1)

    @app.agent(topic)
    async def quitter(stream: Stream) -> None:
        async for _ in stream:
            return

    async with TestDriver(app) as driver:
        await driver.put("t", value=1)
        with pytest.raises(AgentFailed, match="returned"):
            await driver.drain()


async def test_offsets_wait_for_send_acknowledgements() -> None:
    app = make_app()
    source = app.topic("in", partitions=1)
    sink = app.topic("out", partitions=1)

    @app.agent(source)
    async def forward(stream: Stream) -> None:
        async for event in stream:
            await sink.send(value=event.value)

    sender = ManualSender()
    crashes: list[BaseException] = []
    async with running(app, sender, "in", crashes.append) as (runtime, _manager, task):
        for offset in range(3):
            await runtime.dispatch_many([RawRecord("in", 0, offset, 0, None, b"1")], task)
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(sender.futures) == 3
        assert task.tracker.committable() == {}
        sender.futures[1].set_result(None)  # out of order: still nothing committable
        await asyncio.sleep(0)
        assert task.tracker.committable() == {}
        sender.futures[0].set_result(None)
        await asyncio.sleep(0)
        assert task.tracker.committable() == {("in", 0): 2}
        sender.futures[2].set_exception(RuntimeError("broker said no"))
        await asyncio.sleep(0)
        assert crashes and "was not acknowledged" in str(crashes[0])
        assert task.tracker.committable() == {("in", 0): 2}


class _BatchedSend:
    """A send acknowledged with its batch (like the Kafka producer's ``Sent``): the batch's
    future says when; the record's own outcome may differ (a refusal names each record)."""

    def __init__(self, batch: asyncio.Future[Any], error: BaseException | None = None) -> None:
        self.acknowledged = batch
        self.error = error

    def done(self) -> bool:
        return self.acknowledged.done()

    def cancelled(self) -> bool:
        return self.acknowledged.cancelled()

    def exception(self) -> BaseException | None:
        if self.acknowledged.exception() is None:
            return None
        return self.error

    def result(self) -> Any:
        return None

    def add_done_callback(self, fn: Any, *, context: Any = None) -> None:
        self.acknowledged.add_done_callback(lambda _: fn(self), context=context)

    def __await__(self) -> Any:
        yield from self.acknowledged.__await__()


class _BatchingSender:
    """Sends go into the current batch; the test starts a new one, and settles them."""

    def __init__(self) -> None:
        self.batches: list[asyncio.Future[Any]] = []
        self.sends: list[_BatchedSend] = []
        self.new_batch()

    def new_batch(self) -> None:
        self.batches.append(asyncio.get_running_loop().create_future())

    async def send(self, record: OutgoingRecord) -> _BatchedSend:
        topic, _, value, _, _, _ = record
        error = RecordRejected(f"refused {value!r}", topic=topic)
        sent = _BatchedSend(self.batches[-1], error)
        self.sends.append(sent)
        return sent

    async def partition_count(self, topic: str) -> int:
        return 1


async def test_events_are_acknowledged_by_record_batch_with_one_callback_per_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app()
    source = app.topic("in", partitions=1)
    sink = app.topic("out", partitions=1)

    @app.agent(source, on_error="skip")
    async def forward(stream: Stream) -> None:
        async for event in stream:
            await sink.send(value=event.value)
            if event.offset == 2:
                await sink.send(value="2 again")

    sender = _BatchingSender()
    crashes: list[BaseException] = []

    async def settle() -> None:
        for _ in range(10):
            await asyncio.sleep(0)

    async with running(app, sender, "in", crashes.append) as (runtime, _manager, task):
        records = [RawRecord("in", 0, offset, 0, None, str(offset).encode()) for offset in range(6)]
        await runtime.dispatch_many(records[:2], task)  # 0 and 1: batch 0
        await settle()
        sender.new_batch()
        await runtime.dispatch_many(records[2:4], task)  # 2 and 3: batch 1 (2 sends twice)
        await settle()
        sender.new_batch()
        await runtime.dispatch_many(records[4:], task)  # 4 and 5: batch 2
        await settle()
        assert len(sender.sends) == 7
        assert task.awaiting_sends == 6
        # one callback per batch, whatever its number of records and events
        assert [len(b._callbacks) for b in sender.batches] == [1, 1, 1]  # type: ignore[attr-defined]
        sender.batches[1].set_result(None)  # out of order: still nothing committable
        await settle()
        assert task.tracker.committable() == {}
        sender.batches[0].set_result(None)
        await settle()
        assert task.tracker.committable() == {("in", 0): 4}
        assert task.awaiting_sends == 2
        # the broker refuses batch 2: the policy (skip) applies to each of its events, and
        # skipped events count as processed
        sender.batches[2].set_exception(RecordRejected("refused", topic="out"))
        await settle()
        assert task.tracker.committable() == {("in", 0): 6}
        assert task.awaiting_sends == 0
        assert sum(runtime.counters.skipped.values()) == 2
        # each event's log line names its own refused record
        lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(lines) == 2 and "refused b'4'" in lines[0] and "refused b'5'" in lines[1]
        assert not crashes


async def test_a_commit_counts_the_events_finished_before_one_that_awaits() -> None:
    """Finished events that sent nothing are acknowledged together, when the actor next
    waits for records; a commit made while the agent awaits inside a later event still
    counts the events before it."""
    app = make_app()
    topic = app.topic("t", partitions=1)
    inside, release = asyncio.Event(), asyncio.Event()

    @app.agent(topic)
    async def work(stream: Stream) -> None:
        async for event in stream:
            if event.value == "wait":
                inside.set()
                await release.wait()

    async with TestDriver(app) as driver:
        runtime = driver.runtime
        assert runtime is not None
        task = driver.tasks.task_for("t", 0) if driver.tasks is not None else None
        assert task is not None
        # six records in one chunk: the actor takes them without waiting in between
        raws = [RawRecord("t", 0, offset, 0, None, b'"x"') for offset in range(5)]
        raws.append(RawRecord("t", 0, 5, 0, None, b'"wait"'))
        await runtime.dispatch_many(raws, task)
        await asyncio.wait_for(inside.wait(), 5)
        assert await driver.commit() == {("t", 0): 5}
        release.set()
        await driver.drain()
        assert driver.committable() == {("t", 0): 6}


async def test_revoke_drops_buffered_records() -> None:
    app = make_app()
    topic = app.topic("t", partitions=1)
    seen: list[int] = []
    gate = asyncio.Event()

    @app.agent(topic)
    async def slow(stream: Stream) -> None:
        async for event in stream:
            await gate.wait()
            seen.append(event.offset)

    sender = ManualSender()
    async with running(app, sender, "t", lambda e: None) as (runtime, manager, task):
        for offset in range(5):
            await runtime.dispatch_many([RawRecord("t", 0, offset, 0, None, b"0")], task)
        await asyncio.sleep(0)
        manager.suspend([task])  # revocation begins while offset 0 is being processed
        gate.set()
        assert await runtime.barrier.wait_idle([task], 1.0)
        assert seen == [0]  # the in-flight event finished; buffered ones were dropped
        # ...and it counts: the revocation commit covers it, so its next owner does not
        # process it again (acknowledgements after revocation began used to be dropped)
        assert manager.committable([task]) == {("t", 0): 1}
        await runtime.dispatch_many([RawRecord("t", 0, 5, 0, None, b"0")], task)
        await asyncio.sleep(0.01)
        assert seen == [0]  # nothing new reaches a suspended task
        manager.close([task])
        assert manager.task_for("t", 0) is None


async def test_put_raw_partitions_by_the_key_like_everything_else() -> None:
    app = make_app()
    app.topic("t", key_serializer="str", value_serializer="raw", partitions=8)

    async with TestDriver(app) as driver:
        keys = [f"user-{i}" for i in range(20)]
        for key in keys:
            raw = await driver.put_raw("t", key.encode(), b"v")
            coded = await driver.put("t", key=key, value=b"v")
            assert raw.partition == coded.partition == partition_for_key(key.encode(), 8), key
        assert len({partition_for_key(k.encode(), 8) for k in keys}) > 1  # not all on one
        # an explicit partition still wins; keyless records go to partition 0
        assert (await driver.put_raw("t", b"user-1", b"v", partition=5)).partition == 5
        assert (await driver.put_raw("t", None, b"v")).partition == 0
        # headers and the record time can be given as with put
        meta = await driver.put_raw("t", b"k", b"v", headers=[("h", b"1")], timestamp_ms=42)
        (record,) = [
            r
            for r in driver.raw_records("t")
            if (r.partition, r.offset) == (meta.partition, meta.offset)
        ]
        assert (meta.timestamp, record.timestamp, record.headers) == (42, 42, (("h", b"1"),))


async def test_the_record_time_is_timestamp_ms_everywhere() -> None:
    app = make_app()
    source = app.topic("t", key_serializer="str", partitions=1)
    sink = app.topic("out", key_serializer="str", partitions=1)
    seen: list[int] = []

    @app.agent(source)
    async def forward(stream: Stream) -> None:
        async for event in stream:
            seen.append(event.timestamp)
            await sink.send(key=event.key, value=event.value, timestamp_ms=event.timestamp + 1)

    async with TestDriver(app) as driver:
        meta = await driver.put("t", key="k", value=1, timestamp_ms=1_000)
        assert meta.timestamp == 1_000
        await driver.drain()
        assert seen == [1_000]
        assert [e.timestamp for e in driver.records("out")] == [1_001]
        # `timestamp=` (the name of the event's field) is refused with the right spelling
        for call in (
            driver.put("t", key="k", value=1, timestamp=5),  # type: ignore[arg-type]
            driver.put_raw("t", b"k", b"1", timestamp=5),  # type: ignore[arg-type]
            sink.send(key="k", value=1, timestamp=5),  # type: ignore[arg-type]
        ):
            with pytest.raises(ArgumentTypeError, match=r"timestamp_ms=.*milliseconds"):
                await call
        with pytest.raises(ArgumentTypeError, match=r"timestamp_ms must be an int.*float"):
            await driver.put("t", key="k", value=1, timestamp_ms=1.5)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=r"timestamp_ms must be >= 0, got -1"):
            await driver.put("t", key="k", value=1, timestamp_ms=-1)
        assert len(driver.raw_records("t")) == 1  # nothing refused was written


@pytest.mark.parametrize("failure", ["processing", "decode"])
async def test_an_actor_sending_a_dead_letter_counts_as_inside_its_event(failure: str) -> None:
    """A transaction's snapshot waits for every actor to be between two events. Seen in CI
    (exactly-once, an injected abort): the dead letter of a failed event was sent while the
    actor already counted as outside it, so the abort ran meanwhile and the dead letter was
    sent outside any transaction ("Can't send messages while not in transaction"), which
    stopped the worker. The actor stays inside the event until its dead letter is sent."""
    app = make_app()
    topic = app.topic("t", partitions=1, value_serializer="json")

    @app.agent(topic, on_error="dead_letter", name="checker")
    async def checker(stream: Stream) -> None:
        async for event in stream:
            if event.value < 0:
                raise ValueError(f"negative amount {event.value}")

    dlq = app.agents["checker"].dead_letter
    assert dlq is not None
    async with TestDriver(app) as driver:
        runtime = driver.processing.runtime if driver.processing is not None else None
        assert runtime is not None
        seen: list[list[str]] = []
        send = driver.send

        async def watching_send(record: OutgoingRecord) -> asyncio.Future[Any]:
            if record[0] == dlq.name:
                seen.append(runtime.barrier.inside_events())
            return await send(record)

        driver.send = watching_send  # type: ignore[method-assign]
        if failure == "processing":
            await driver.put("t", value=-5)
        else:
            await driver.put_raw("t", key=None, value=b"{not json")
        await driver.drain()
        assert len(driver.raw_records(dlq.name)) == 1
        assert seen == [["checker#0"]]
        assert runtime.barrier.inside_events() == []
