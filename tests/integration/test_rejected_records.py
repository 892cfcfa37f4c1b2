"""Records the broker refuses follow the agent's on_error policy, under both guarantees.

They used to stop the worker (``a record sent while processing ... was not acknowledged:
MessageSizeTooLargeError()``), and since nothing was committed past the record, on every
restart again, whatever ``on_error`` said.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

import streamjoin
from streamjoin.errors import AgentFailed
from streamjoin.runtime.tasks.agent_runtime import Stream
from tests.integration.support import committed_offsets, produce, read_all, read_to_end

#: the output topic's max.message.bytes in these tests
LIMIT = 2_000
BIG = "x" * 5_000


def _forwarder(
    bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    *,
    guarantee: str,
    on_error: str,
    sink_limit: int | None = LIMIT,
) -> tuple[streamjoin.App, str, str]:
    app = streamjoin.App(
        unique_topic("app"),
        broker=f"kafka://{bootstrap}",
        commit_interval=0.2,
        processing_guarantee=guarantee,
        state_dir=tmp_path,
    )
    source = app.topic(
        unique_topic("in"), key_serializer="str", value_serializer="str", partitions=1
    )
    config = {} if sink_limit is None else {"max.message.bytes": str(sink_limit)}
    sink = app.topic(
        unique_topic("out"),
        key_serializer="str",
        value_serializer="str",
        partitions=1,
        config=config,
    )

    @app.agent(source, on_error=on_error, name="forward")  # type: ignore[arg-type]
    async def forward(stream: Stream) -> None:
        async for event in stream:
            await sink.send(key=event.key, value=event.value)

    return app, source.name, sink.name


async def _settle(app: streamjoin.App, bootstrap: str, source: str, expected: int) -> None:
    """Until the app committed ``expected`` records of ``source`` (or stopped)."""
    for _ in range(150):
        if not app.running:
            return
        if sum(await committed_offsets(bootstrap, app.id, source, 1)) >= expected:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{app.id} never committed {expected} records of {source}")


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("on_error", ["skip", "dead_letter"])
async def test_a_record_larger_than_the_topic_accepts_follows_on_error(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    guarantee: str,
    on_error: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, source, sink = _forwarder(
        kafka_bootstrap, unique_topic, tmp_path, guarantee=guarantee, on_error=on_error
    )
    async with app:
        await produce(kafka_bootstrap, source, [("a", "one"), ("b", BIG), ("c", "two")])
        await _settle(app, kafka_bootstrap, source, 3)
        assert app.running, "the worker stopped on a record its policy says to " + on_error
    out = await read_to_end(kafka_bootstrap, sink, 1)
    assert out == [("a", "one"), ("c", "two")]
    assert sum(await committed_offsets(kafka_bootstrap, app.id, source, 1)) == 3
    refused = [
        r.getMessage()
        for r in caplog.records
        if "refused" in r.getMessage() or ("larger than topic" in r.getMessage())
    ]
    assert len(refused) == 1, refused
    assert sink in refused[0] and "max.message.bytes=2000" in refused[0], refused[0]
    assert "of 5" in refused[0]  # the record's size (5000-odd bytes)
    if on_error == "dead_letter":
        dead = await read_all(
            kafka_bootstrap,
            f"{app.id}-forward-dead-letters",
            1,
            isolation_level="read_committed",
        )
        assert [k for k, _, _ in dead] == ["b"]
        assert b"max.message.bytes=2000" in dead[0][2]["streamjoin-error"]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_under_stop_a_too_large_record_stops_with_topic_size_and_limit(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    app, source, _ = _forwarder(
        kafka_bootstrap, unique_topic, tmp_path, guarantee=guarantee, on_error="stop"
    )
    await app.start()
    try:
        await produce(kafka_bootstrap, source, [("a", "one"), ("b", BIG)])
        with pytest.raises(AgentFailed) as failed:
            await asyncio.wait_for(app.wait(), timeout=60)
    finally:
        await app.stop()
    message = str(failed.value)
    assert "max.message.bytes=2000" in message and "bytes" in message, message
    assert f"{source}[0]@1" in message
    # nothing past the refused record was committed: a restart meets it again
    assert sum(await committed_offsets(kafka_bootstrap, app.id, source, 1)) <= 1


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_record_the_broker_refuses_while_running_follows_on_error(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    """The limit is lowered after the worker started (so the check before sending does not
    know it): the broker's refusal is what the policy applies to. Under exactly-once the
    transaction holding it aborts once, and the replay refuses the record before sending."""
    app, source, sink = _forwarder(
        kafka_bootstrap,
        unique_topic,
        tmp_path,
        guarantee=guarantee,
        on_error="skip",
        sink_limit=None,
    )
    async with app:
        await produce(kafka_bootstrap, source, [("a", "one")])
        await _settle(app, kafka_bootstrap, source, 1)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, sink, {"max.message.bytes": str(LIMIT)})]
            )
        finally:
            await admin.close()
        await asyncio.sleep(1.0)  # the broker applies topic configs asynchronously
        await produce(kafka_bootstrap, source, [("b", BIG)])
        await asyncio.sleep(0.5)
        await produce(kafka_bootstrap, source, [("c", "two")])
        await _settle(app, kafka_bootstrap, source, 3)
        assert app.running
    out = await read_to_end(kafka_bootstrap, sink, 1)
    assert out == [("a", "one"), ("c", "two")]
