"""A record batch for a partition without a leader waits LEADER_WAIT, not aiokafka's
request timeout: a cluster down for longer than 40 s stopped at-least-once workers
(tests/integration/test_cluster_faults.py). Checked through aiokafka's own accumulator,
so a change of that private seam fails here."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import LeaderNotAvailableError
from aiokafka.structs import TopicPartition

from streamjoin.runtime.transport.producer import LEADER_WAIT, wait_for_leaders

TP = TopicPartition("t", 0)


class NoLeader:
    """Cluster metadata in which partition ``TP`` has no leader (-1)."""

    def leader_for_partition(self, tp: TopicPartition) -> int:
        return -1


def drained_at(producer: AIOKafkaProducer, age: float) -> Any:
    """A batch for ``TP`` queued ``age`` seconds ago, after one drain while ``TP`` has no
    leader: its delivery future."""
    accumulator = producer._message_accumulator
    accumulator._cluster = NoLeader()
    builder = producer.create_batch()
    builder.append(key=b"k", value=b"v", timestamp=None)
    batch = accumulator._append_batch(builder, TP)
    batch._ctime = time.monotonic() - age
    accumulator.drain_by_nodes(ignore_nodes=set())
    return batch.future


async def test_a_batch_waits_for_a_leader_well_past_the_request_timeout() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", request_timeout_ms=40_000)
    wait_for_leaders(producer)
    assert not drained_at(producer, 60.0).done()
    await producer.stop()


async def test_a_batch_fails_once_it_waited_leader_wait() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", request_timeout_ms=40_000)
    wait_for_leaders(producer)
    delivery = drained_at(producer, LEADER_WAIT + 1)
    assert isinstance(delivery.exception(), LeaderNotAvailableError)
    await producer.stop()


async def test_without_it_aiokafka_fails_the_batch_after_its_request_timeout() -> None:
    """(What the worker met: the reason for wait_for_leaders.)"""
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", request_timeout_ms=40_000)
    assert isinstance(drained_at(producer, 60.0).exception(), LeaderNotAvailableError)
    await producer.stop()


def test_an_aiokafka_without_the_seam_keeps_its_limit_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Elsewhere:
        pass

    with caplog.at_level(logging.WARNING, "streamjoin.producer"):
        wait_for_leaders(Elsewhere())  # type: ignore[arg-type]
    assert "no _message_accumulator._batch_ttl" in caplog.text
