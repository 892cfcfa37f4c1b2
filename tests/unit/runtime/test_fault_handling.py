"""The pure parts of fault handling: record limits, the broker watch filter, log summaries,
and the App settings they need."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.config import AppConfig
from streamjoin.errors import ConfigurationError, RecordRejected, RecordTooLargeError
from streamjoin.log_summary import Summary
from streamjoin.runtime.transport.liveness import BrokerWatch
from streamjoin.runtime.transport.producer import KafkaSender
from streamjoin.runtime.transport.record_limits import (
    RecordLimits,
    TopicLimits,
    single_record_batch_size,
)


def sizes_match_what_aiokafka_builds() -> None:
    """``single_record_batch_size`` is the length of the batch aiokafka builds for one record
    (also checked with the size function's fallback, test_aiokafka_seams.py)."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    for key, value in [(b"k", b"v" * 10), (None, b"x" * 5000), (b"key", None)]:
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=0,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 20,
        )
        builder.append(0, 0, key, value, [])
        assert single_record_batch_size(key, value, ()) == len(builder.build())


def test_single_record_batch_size_is_what_aiokafka_builds() -> None:
    sizes_match_what_aiokafka_builds()


def test_record_limits_refuse_too_large_and_null_keys_on_compacted_topics() -> None:
    limits = RecordLimits({"out": TopicLimits(2000), "table": TopicLimits(10**6, compacted=True)})
    limits.check("out", b"k", b"x" * 1000)
    with pytest.raises(
        RecordTooLargeError, match=r"of 5\d+ bytes .*'out'.*max.message.bytes=2000"
    ) as exc:
        limits.check("out", b"k", b"x" * 5000)
    assert exc.value.limit == 2000 and exc.value.topic == "out" and exc.value.size > 5000
    with pytest.raises(RecordRejected, match="null key"):
        limits.check("table", None, b"v")
    limits.check("unknown", None, b"x" * 10**7)  # not known: the broker decides
    assert limits.smallest_limit() == 2000


def test_a_refused_record_is_refused_before_sending_the_next_time() -> None:
    limits = RecordLimits({})
    limits.check("out", b"k", b"v")
    limits.remember("out", b"k", b"v", ValueError("refused"))
    with pytest.raises(RecordRejected, match="refused this record for topic 'out' before"):
        limits.check("out", b"k", b"v")
    limits.check("out", b"k", b"other")


def test_with_compression_sizes_are_left_to_the_broker() -> None:
    RecordLimits({"out": TopicLimits(100)}, compressed=True).check("out", b"k", b"x" * 1000)


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1_100, 1_300),
    key=st.one_of(st.none(), st.binary(max_size=40)),
    below_limit=st.one_of(st.none(), st.integers(-50, 150), st.integers(150, 1_100)),
    headers=st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=200)), max_size=2),
    compacted=st.booleans(),
    compressed=st.booleans(),
    refused_before=st.booleans(),
)
def test_send_now_refuses_exactly_what_the_limits_refuse(
    limit: int,
    key: bytes | None,
    below_limit: int | None,
    headers: list[tuple[str, bytes]],
    compacted: bool,
    compressed: bool,
    refused_before: bool,
) -> None:
    """The sender checks small records inline and asks RecordLimits.check only near a
    limit: it must refuse exactly what check refuses, and let the rest through."""
    # (the key and value together ``below_limit`` bytes under the topic's limit)
    value = None if below_limit is None else b"v" * max(0, limit - below_limit - len(key or b""))
    limits = RecordLimits({"out": TopicLimits(limit, compacted=compacted)})
    sender = KafkaSender(
        "127.0.0.1:1",
        client_options={},
        producer_options={"compression_type": "gzip"} if compressed else {},
        client_id="test",
        limits=limits,
    )
    if refused_before:
        limits.remember("out", key, value, ValueError("refused"))
    try:
        limits.check("out", key, value, headers)
    except (RecordRejected, RecordTooLargeError) as exc:
        with pytest.raises(type(exc)):
            sender.send_now(("out", key, value, 0, headers, 1))
    else:  # (no producer yet: the record is left to send(), not refused)
        assert sender.send_now(("out", key, value, 0, headers, 1)) is None


def test_broker_watch_swallows_connection_noise_and_reports_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    watch = BrokerWatch("127.0.0.1:9092", interval=10, clock=lambda: now[0])
    noise = logging.LogRecord(
        "aiokafka", logging.ERROR, "", 0, "Unable connect to %s", ("n",), None
    )
    other = logging.LogRecord("aiokafka", logging.ERROR, "", 0, "something else", (), None)
    ours = logging.LogRecord("streamjoin.x", logging.ERROR, "", 0, "Unable connect to", (), None)
    caplog.set_level(logging.INFO, "streamjoin.broker")
    for _ in range(500):
        assert watch.filter(noise) is False
    assert watch.filter(other) and watch.filter(ours)
    now[0] = 5
    watch.tick()
    now[0] = 12
    watch.tick()
    watch.tick()
    watch.recovered()
    messages = [r.getMessage() for r in caplog.records if r.name == "streamjoin.broker"]
    assert messages == [
        "broker 127.0.0.1:9092 unreachable; retrying",
        "broker 127.0.0.1:9092 unreachable for 12 s; retrying",
        "broker 127.0.0.1:9092 reachable again after 12 s",
    ]


def test_summary_logs_the_first_at_once_then_a_count_per_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    summary = Summary(logging.getLogger("streamjoin.test"), period=30, clock=lambda: now[0])
    caplog.set_level(logging.INFO, "streamjoin.test")
    for i in range(100):
        now[0] = i * 0.5  # 50 s
        summary.note("k", lambda: "first", lambda n, s: f"{n} more in {s:.0f} s")
    assert [r.getMessage() for r in caplog.records] == ["first", "60 more in 30 s"]


def test_startup_and_shutdown_timeouts_are_settings() -> None:
    config = AppConfig.from_options("a", startup_timeout=5, shutdown_timeout=2.5)
    assert (config.startup_timeout, config.shutdown_timeout) == (5, 2.5)
    assert AppConfig("a").startup_timeout == 60 and AppConfig("a").shutdown_timeout == 30
    for bad in (0, -1, "x", True):
        with pytest.raises(ConfigurationError, match="shutdown_timeout must be > 0"):
            AppConfig("a", shutdown_timeout=bad)


def test_broker_watch_drops_aiokafkas_retried_metadata_errors_without_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen in CI: right after the worker created its topics, aiokafka's fetcher logged
    ``ERROR ... Failed fetch offsets from 1: [Error 6] NotLeaderForPartitionError`` (the
    leader was not elected yet; aiokafka retries). A normal start logs no ERROR line."""
    watch = BrokerWatch("127.0.0.1:9092", interval=10, clock=lambda: 0.0)
    caplog.set_level(logging.INFO, "streamjoin.broker")
    retried = [
        "Failed fetch offsets from 1: [Error 6] NotLeaderForPartitionError: TopicPartition(...)",
        "Got error [Error 5] LeaderNotAvailableError for topic t",
        "Topic t not found in cluster metadata ([Error 3] UnknownTopicOrPartitionError)",
        # a 3-broker cluster with one broker restarting: the producer retries its batch
        "Got error produce response on topic-partition TopicPartition(topic='t', "
        "partition=0), retrying. Error: <class 'aiokafka.errors.NotEnoughReplicasError'>",
    ]
    for message in retried:
        record = logging.LogRecord(
            "aiokafka.consumer.fetcher", logging.ERROR, "", 0, message, (), None
        )
        assert watch.filter(record) is False, message
    assert watch.since is None  # not an outage: the broker answered
    assert not [r for r in caplog.records if r.name == "streamjoin.broker"]
