"""A producer whose start fails is stopped before the error goes on (no half-started
aiokafka client left to the garbage collector, which warns "Unclosed AIOKafkaProducer")."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.producer.message_accumulator import BatchBuilder

from streamjoin.runtime.transport import producer as producer_module


class _Accumulator:
    async def flush_for_commit(self) -> None:
        return None


class FailingProducer:
    instances: ClassVar[list[FailingProducer]] = []

    def __init__(self, **options: Any) -> None:
        self.stopped = False
        self._message_accumulator = _Accumulator()
        FailingProducer.instances.append(self)

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(16384, 0)

    async def start(self) -> None:
        raise KafkaConnectionError("no broker")

    async def stop(self) -> None:
        self.stopped = True


async def test_a_producer_that_fails_to_start_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    FailingProducer.instances.clear()
    monkeypatch.setattr(producer_module, "AIOKafkaProducer", FailingProducer)
    with pytest.raises(KafkaConnectionError):
        await producer_module.started_producer({"bootstrap_servers": "127.0.0.1:9"})
    assert [p.stopped for p in FailingProducer.instances] == [True]


async def test_the_sender_stops_the_producer_it_could_not_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FailingProducer.instances.clear()
    monkeypatch.setattr(producer_module, "AIOKafkaProducer", FailingProducer)
    sender = producer_module.KafkaSender(
        "127.0.0.1:9", client_options={}, producer_options={}, client_id="test"
    )
    with pytest.raises(KafkaConnectionError):
        await sender.on_start()
    assert [p.stopped for p in FailingProducer.instances] == [True]
