"""A connection that goes silent (half-open) or a broker that answers nothing for a while:
the membership gives up the group coordinator's connections after a session timeout without
a heartbeat answer, and the producer waits on for room rather than fail a batch it never
sent, and a client routine that dies of a lost connection is an outage in the log, not a
traceback. Over fakes of aiokafka; tests/integration/test_network_faults.py does it for real."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.protocol.group import HeartbeatRequest, JoinGroupRequest, SyncGroupRequest
from aiokafka.structs import RecordMetadata

from streamjoin.runtime.group.membership import GroupMembership, MembershipSettings
from streamjoin.runtime.transport import connections
from streamjoin.runtime.transport.connections import drop_connections
from streamjoin.runtime.transport.liveness import BrokerWatch
from streamjoin.runtime.transport.out_batches import Sent
from streamjoin.runtime.transport.producer import KafkaSender
from tests.unit.runtime.group_support import (
    TOPIC,
    FakeAssignor,
    FakeClient,
    FakeListener,
    eventually,
    join_ok,
    sync_ok,
    tps,
)


class FakeConnection:
    def __init__(self) -> None:
        self.closed_for: Any = None

    def close(self, reason: Any = None, exc: Any = None) -> None:
        self.closed_for = reason


class ConnectedClient(FakeClient):
    """The fake client with aiokafka's connection table: (node id, group) -> connection."""

    def __init__(self, events: list[tuple[Any, ...]], partitions: dict[str, int]) -> None:
        super().__init__(events, partitions)
        self._conns: dict[Any, Any] = {(1, 0): FakeConnection(), (1, 1): FakeConnection()}


def test_drop_connections_closes_every_connection_to_that_node_only() -> None:
    client = ConnectedClient([], {})
    conns = {(1, 0): FakeConnection(), (1, 1): FakeConnection(), (2, 0): FakeConnection()}
    client._conns = {**conns, ("1", "x"): None}  # (a key of another shape is left alone)
    assert drop_connections(client, 1) == 2
    assert [c.closed_for is not None for c in conns.values()] == [True, True, False]


def test_without_aiokafkas_connection_table_nothing_is_closed_and_it_says_so_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connections, "_warned_seam", False)
    with caplog.at_level(logging.WARNING, "streamjoin.consumer"):
        assert drop_connections(object(), 1) == 0
        assert drop_connections(object(), 1) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "this aiokafka keeps no connection table streamjoin knows: connections to a silent "
        "broker are given up only after request_timeout_ms"
    ]


#: the membership, its client, and the fetcher's client
SilentCoordinator = tuple[GroupMembership, ConnectedClient, ConnectedClient]


@pytest.fixture
async def silent_coordinator() -> AsyncIterator[SilentCoordinator]:
    """A member whose first heartbeats are never answered (its connection went silent)."""
    events: list[tuple[Any, ...]] = []
    client = ConnectedClient(events, {TOPIC: 4})
    membership = GroupMembership(
        client,
        MembershipSettings(
            group_id="g", heartbeat_interval_ms=10, session_timeout_ms=200, retry_backoff_ms=5
        ),
        topics=[TOPIC],
        assignor=FakeAssignor(),
        listener=FakeListener(events),
        on_fatal=lambda exc: None,
    )
    fetchers = ConnectedClient(events, {})
    fetchers._conns = {(1, 0): FakeConnection(), (2, 0): FakeConnection()}
    membership.other_clients = lambda: (fetchers, None)  # (a producer not started: None)
    client.script(JoinGroupRequest, join_ok())
    client.script(SyncGroupRequest, sync_ok([0, 1]))
    membership.start()
    await eventually(lambda: membership.owned == tps(0, 1))
    yield membership, client, fetchers
    await membership.stop()


async def _never_answered(_request: Any) -> Any:
    await asyncio.Event().wait()


async def test_a_heartbeat_unanswered_for_a_session_drops_the_coordinators_connections(
    silent_coordinator: SilentCoordinator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, client, fetchers = silent_coordinator
    conns = [*client._conns.values(), fetchers._conns[(1, 0)]]
    lookups = client.lookups
    with caplog.at_level(logging.WARNING, "streamjoin.membership"):
        client.script(HeartbeatRequest, _never_answered)
        await eventually(lambda: client.lookups > lookups)
    # every connection of the worker to the coordinator closed (what waited on them fails
    # and is retried), the fetcher's too; not those to another broker
    assert all(c.closed_for is not None for c in conns)
    assert fetchers._conns[(2, 0)].closed_for is None
    assert any(
        "answered no heartbeat in 0s (session timeout): closed the worker's 3 connections"
        in r.getMessage()
        for r in caplog.records
    )
    beats = client.count(HeartbeatRequest)
    await eventually(lambda: client.count(HeartbeatRequest) > beats + 2)  # heartbeating on


class RoomlessProducer:
    """Enough of AIOKafkaProducer for the sender: ``full`` times no room for a batch
    (aiokafka's KafkaTimeoutError after request_timeout_ms), then batches are taken."""

    def __init__(self, full: int) -> None:
        self.full = full
        self.taken: list[tuple[str, int, int]] = []
        self.delivered: list[asyncio.Future[Any]] = []

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(16384, 0)

    async def send_batch(self, builder: BatchBuilder, topic: str, *, partition: int) -> Any:
        if self.full:
            self.full -= 1
            raise KafkaTimeoutError()
        self.taken.append((topic, partition, builder.record_count()))
        future = asyncio.get_running_loop().create_future()
        future.set_result(RecordMetadata(topic, partition, None, 41, -1, -1, -1))
        self.delivered.append(future)
        return future

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1}


def _sender(producer: RoomlessProducer) -> KafkaSender:
    sender = KafkaSender("127.0.0.1:1", client_options={}, producer_options={}, client_id="t")
    sender._producer = producer
    return sender


async def test_a_batch_that_finds_no_room_waits_on_and_is_delivered_not_failed() -> None:
    producer = RoomlessProducer(full=2)
    sender = _sender(producer)
    delivery = await sender.send(("out", b"k", b"v", 1, (), 1))
    await sender._submit_all()
    assert isinstance(delivery, Sent)
    await asyncio.wait_for(asyncio.shield(delivery.acknowledged), 5)
    assert delivery.exception() is None
    assert producer.taken == [("out", 1, 1)]
    assert producer.full == 0


async def test_a_changelog_flush_that_finds_no_room_waits_on() -> None:
    producer = RoomlessProducer(full=3)
    sender = _sender(producer)
    done = await sender.send_many("changelog", 0, [(b"k1", b"1"), (b"k2", b"2")])
    assert await done == 42  # the last record's offset
    assert producer.taken == [("changelog", 0, 2)]


def _logged_with(exc: BaseException) -> logging.LogRecord:
    return logging.LogRecord(
        "aiokafka.producer.sender",
        logging.ERROR,
        "",
        0,
        "Unexpected error in sender routine",
        (),
        (type(exc), exc, None),
    )


def test_a_client_routine_dying_of_a_lost_connection_is_an_outage_not_a_traceback() -> None:
    watch = BrokerWatch("127.0.0.1:9092", interval=10, clock=lambda: 0.0)
    lost = KafkaError("KafkaConnectionError('Connection at 127.0.0.1:9092 closed')")
    lost.__cause__ = KafkaConnectionError("Connection at 127.0.0.1:9092 closed")
    assert watch.filter(_logged_with(lost)) is False
    assert watch.since is not None
    other = _logged_with(ValueError("a bug"))
    assert watch.filter(other) is True  # anything else is still logged, traceback and all
