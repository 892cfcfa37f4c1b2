"""The private parts of aiokafka the producer side uses are checked at start (the batch
builder, the transaction manager, the record size function, the protocol classes the group
offset requests are built on): each seam
broken here (monkeypatched away) fails the start with a message naming the aiokafka version
and what is missing, or falls back to streamjoin's own code with a warning."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import aiokafka
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.protocol import api as aiokafka_api
from aiokafka.protocol import types as aiokafka_types
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.errors import StartupError
from streamjoin.runtime.group import transaction, txn_protocol
from streamjoin.runtime.group.transaction import TransactionalSender, check_transaction_manager
from streamjoin.runtime.transport import producer as producer_module
from streamjoin.runtime.transport import record_limits
from streamjoin.runtime.transport.out_batches import OutBatch, check_batch_builder
from tests.unit.runtime.test_fault_handling import sizes_match_what_aiokafka_builds

VERSION = f"aiokafka {aiokafka.__version__}"


class _OldRecords:
    """A record batch builder whose append takes other arguments than aiokafka 0.14's."""

    def append(self, offset: int, timestamp: int, key: bytes, value: bytes) -> Any:
        return None


class _OldBuilder:
    """aiokafka's BatchBuilder as it might change: its record builder's append differs."""

    _relative_offset = 0

    def __init__(self) -> None:
        self._builder = _OldRecords()

    def close(self) -> None:
        pass

    def record_count(self) -> int:
        return 0


class _StubAccumulator:
    """aiokafka's message accumulator as the sender's flush uses it."""

    async def flush_for_commit(self) -> None:
        return None


class _StubProducer:
    """Stands in for AIOKafkaProducer in the sender's start: records whether it was started
    and stopped; its batch builder and transaction manager are what the test sets."""

    instances: ClassVar[list[_StubProducer]] = []
    builder: ClassVar[Any] = None
    txn_manager: ClassVar[Any] = None
    accumulator: ClassVar[Any] = None

    def __init__(self, **options: Any) -> None:
        self.started = self.stopped = False
        self._txn_manager = _StubProducer.txn_manager
        self._message_accumulator = _StubProducer.accumulator
        _StubProducer.instances.append(self)

    def create_batch(self) -> Any:
        return _StubProducer.builder

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def stub_producer(monkeypatch: pytest.MonkeyPatch) -> type[_StubProducer]:
    _StubProducer.instances.clear()
    _StubProducer.builder = BatchBuilder(16384, 0)
    _StubProducer.txn_manager = None
    _StubProducer.accumulator = _StubAccumulator()
    monkeypatch.setattr(producer_module, "AIOKafkaProducer", _StubProducer)
    return _StubProducer


def _transactional_sender() -> TransactionalSender:
    return TransactionalSender(
        "127.0.0.1:9",
        client_options={},
        producer_options={},
        client_id="test",
        transactional_id="test-txn",
        transaction_timeout_ms=10_000,
        group_id="test-group",
    )


# ------------------------------------------------------------------ the batch builder


def test_aiokafkas_batch_builder_fits_the_send_path() -> None:
    check_batch_builder(BatchBuilder(16384, 0))


def test_a_batch_builder_it_does_not_know_fails_naming_version_and_what_differs() -> None:
    with pytest.raises(StartupError) as failure:
        check_batch_builder(_OldBuilder())
    message = str(failure.value)
    assert VERSION in message and "_builder.append(offset, timestamp, key, value, headers)" in (
        message
    )
    with pytest.raises(StartupError, match="no close"):
        check_batch_builder(object())
    uncounted = _OldBuilder()
    uncounted._relative_offset = None  # type: ignore[assignment]
    with pytest.raises(StartupError, match="_relative_offset"):
        check_batch_builder(uncounted)


class _PositionalBuilder(BatchBuilder):  # type: ignore[misc]
    """A BatchBuilder whose own append no longer takes the keywords the changelog flush
    (``send_many``) passes."""

    def append(self, timestamp: Any, key: Any, value: Any) -> Any:
        return super().append(timestamp=timestamp, key=key, value=value)


def test_a_batch_builder_whose_append_lost_its_keywords_fails_naming_them() -> None:
    with pytest.raises(StartupError) as failure:
        check_batch_builder(_PositionalBuilder(16384, 0))
    message = str(failure.value)
    assert VERSION in message and "append() taking headers=" in message


async def test_a_batch_appended_directly_tells_aiokafka_its_count_and_that_it_is_full() -> None:
    """The send path appends to the record builder itself: what aiokafka reads of the
    BatchBuilder afterwards (record count, closed) is as if BatchBuilder.append had."""
    builder = BatchBuilder(200, 0)
    batch = OutBatch(0, builder, asyncio.get_running_loop().create_future())
    appended = 0
    while batch.append_record(appended, 1_000 + appended, b"k", b"v" * 20, []) is not None:
        batch.records.append(("t", b"k", b"v" * 20, 0, [], 1_000 + appended))
        appended += 1
    assert appended > 1
    batch.full()
    batch.handing_over()
    assert builder.closed() and builder.record_count() == appended
    read = list(DefaultRecordBatch(bytes(builder._build())))
    assert [(r.offset, r.timestamp) for r in read] == [(i, 1_000 + i) for i in range(appended)]


async def test_the_sender_does_not_start_on_a_batch_builder_it_does_not_know(
    stub_producer: type[_StubProducer],
) -> None:
    stub_producer.builder = _OldBuilder()
    sender = producer_module.KafkaSender(
        "127.0.0.1:9", client_options={}, producer_options={}, client_id="test"
    )
    with pytest.raises(StartupError, match=VERSION):
        await sender.on_start()
    [producer] = stub_producer.instances
    assert not producer.started and producer.stopped  # checked before connecting


async def test_aiokafkas_producer_can_flush_without_waiting_out_its_linger() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")
    try:
        producer_module.check_flush_now(producer)
    finally:
        await producer.stop()


async def test_the_sender_does_not_start_on_a_producer_that_cannot_flush_at_once(
    stub_producer: type[_StubProducer],
) -> None:
    stub_producer.accumulator = object()  # (no flush_for_commit)
    sender = producer_module.KafkaSender(
        "127.0.0.1:9", client_options={}, producer_options={}, client_id="test"
    )
    with pytest.raises(StartupError, match=r"_message_accumulator\.flush_for_commit") as failure:
        await sender.on_start()
    assert VERSION in str(failure.value)
    [producer] = stub_producer.instances
    assert not producer.started and producer.stopped


# ------------------------------------------------------------------ the transaction manager


async def test_aiokafkas_transactional_producer_has_the_transaction_manager() -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers="127.0.0.1:9", transactional_id="t", enable_idempotence=True
    )
    try:
        check_transaction_manager(producer)
    finally:
        await producer.stop()


class _ManagerWithoutGroups:
    producer_id = 7
    producer_epoch = 0


class _Manager(_ManagerWithoutGroups):
    def consumer_group_added(self, group_id: str) -> None:
        pass


async def test_a_producer_without_the_transaction_manager_fails_at_start(
    stub_producer: type[_StubProducer],
) -> None:
    sender = _transactional_sender()
    with pytest.raises(StartupError) as failure:
        await sender.on_start()
    message = str(failure.value)
    assert VERSION in message and "_txn_manager" in message and "at_least_once" in message
    [producer] = stub_producer.instances
    assert not producer.started and producer.stopped


async def test_a_transaction_manager_missing_a_part_is_named(
    stub_producer: type[_StubProducer],
) -> None:
    stub_producer.txn_manager = _ManagerWithoutGroups()
    with pytest.raises(StartupError, match=r"_txn_manager\.consumer_group_added") as failure:
        await _transactional_sender().on_start()
    assert "producer_id" not in str(failure.value)
    stub_producer.txn_manager = None
    with pytest.raises(StartupError, match=r"no _txn_manager;"):
        check_transaction_manager(stub_producer())  # type: ignore[arg-type]
    assert transaction._TXN_MANAGER_PARTS == (
        "producer_id",
        "producer_epoch",
        "consumer_group_added",
    )


# ------------------------------------------------------------------ record sizes


def test_record_sizes_use_aiokafkas_size_of_when_it_fits() -> None:
    assert record_limits.record_size_of() == DefaultRecordBatchBuilder.size_of


class _WrongSizes:
    @staticmethod
    def size_of(key: Any, value: Any, headers: Any) -> int:
        return 0


@pytest.mark.parametrize(
    "records_module", [object(), type("M", (), {"DefaultRecordBatchBuilder": _WrongSizes})]
)
def test_record_sizes_fall_back_to_ours_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, records_module: Any
) -> None:
    monkeypatch.setattr(record_limits, "_aiokafka_records", records_module)
    with caplog.at_level(logging.WARNING, record_limits.__name__):
        size_of = record_limits.record_size_of()
    assert size_of is record_limits._record_fields_size
    [warning] = [r.getMessage() for r in caplog.records]
    assert VERSION in warning and "size_of" in warning and "same results" in warning
    # the fallback sizes batches exactly as aiokafka builds them
    monkeypatch.setattr(record_limits, "_size_of", size_of)
    sizes_match_what_aiokafka_builds()


@settings(max_examples=200, deadline=None)
@given(
    key=st.one_of(st.none(), st.binary(max_size=300)),
    value=st.one_of(st.none(), st.binary(max_size=20_000)),
    headers=st.lists(
        st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=200))),
        max_size=4,
    ),
)
def test_our_record_size_is_aiokafkas(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]
) -> None:
    assert record_limits._record_fields_size(
        key, value, headers
    ) == DefaultRecordBatchBuilder.size_of(key, value, headers)


# ------------------------------------------------------------------ the group offset requests


def test_the_offset_requests_encode_as_kafka_defines_them() -> None:
    txn_protocol.check_protocol()


def test_a_changed_protocol_encoder_fails_naming_version_and_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aiokafka_types.Int64, "encode", staticmethod(lambda value: b"\0" * 4))
    with pytest.raises(StartupError, match=f"{VERSION}: TxnOffsetCommitRequest_v3 .* encodes"):
        txn_protocol.check_protocol()


def test_a_protocol_without_prepare_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(aiokafka_api.Request, "prepare")
    with pytest.raises(StartupError, match=f"{VERSION}: a request .*AttributeError"):
        txn_protocol.check_protocol()


async def test_the_transactional_sender_checks_the_requests_at_start(
    stub_producer: type[_StubProducer], monkeypatch: pytest.MonkeyPatch
) -> None:
    stub_producer.txn_manager = _Manager()
    monkeypatch.setattr(aiokafka_types.Int64, "encode", staticmethod(lambda value: b"\0" * 4))
    with pytest.raises(StartupError, match="TxnOffsetCommitRequest_v3"):
        await _transactional_sender().on_start()
