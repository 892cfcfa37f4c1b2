"""``streamjoin send``'s text-to-value rules and refusals that need no broker; the
``group_by`` key that does not fit its codec (in-memory driver); aiokafka's retried
offset-lookup line downgraded."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import click
import pytest
from aiokafka.errors import NotLeaderForPartitionError, UnsupportedVersionError
from click.testing import CliRunner

import streamjoin
from streamjoin.cli import cli
from streamjoin.cli_send import _lines, value_of_text
from streamjoin.codecs import JSON, RAW, STR, resolve_codec
from streamjoin.errors import AgentFailed, DecodeError, EncodeError
from streamjoin.runtime.transport.client_logs import (
    FAILED_OFFSET_LOOKUP,
    FETCHER_LOGGER,
    quiet_retried_offset_lookups,
)
from streamjoin.testing.driver import TestDriver


@dataclasses.dataclass
class Order:
    id: str
    amount: int


class Reversed:
    """A codec whose records are not the text given: JSON, reversed."""

    name = "reversed-json"

    def dumps(self, obj: Any) -> bytes | None:
        if not isinstance(obj, dict):
            raise EncodeError(f"reversed-json takes a dict, got {type(obj).__name__}")
        return json.dumps(obj).encode()[::-1]

    def loads(self, data: bytes) -> Any:
        try:
            return json.loads(data[::-1])
        except ValueError as exc:
            raise DecodeError(f"not reversed JSON: {exc}") from exc


def test_text_is_read_as_the_codec_reads_a_record() -> None:
    assert value_of_text(RAW, "a b") == b"a b"
    assert value_of_text(STR, '{"x": 1}') == '{"x": 1}'
    assert value_of_text(JSON, '{"x": 1}') == {"x": 1}
    assert value_of_text(resolve_codec(Order), '{"id": "o1", "amount": 3}') == Order("o1", 3)


def test_text_a_codec_refuses_is_refused_with_its_error() -> None:
    with pytest.raises(DecodeError, match="json codec could not decode"):
        value_of_text(JSON, "not json")
    # a dict the dataclass codec would write as it is, but does not read back
    with pytest.raises(DecodeError, match="amount"):
        value_of_text(resolve_codec(Order), '{"id": "o1"}')


def test_a_binary_codec_takes_json_text_it_writes_and_reads_back() -> None:
    assert value_of_text(Reversed(), '{"a": 1}') == {"a": 1}
    with pytest.raises(DecodeError, match="not reversed JSON"):
        value_of_text(Reversed(), "[1, 2]")  # JSON, but not what it writes


def test_stdin_lines_with_and_without_a_key_separator() -> None:
    stdin = io.StringIO("a:1\n\n  \nb:2:3\r\n")
    lines = list(_lines(None, None, ":", stdin))
    assert [(x.where, x.key, x.value) for x in lines] == [
        ("stdin line 1", "a", "1"),
        ("stdin line 4", "b", "2:3"),
    ]
    plain = list(_lines(None, "k", None, io.StringIO("x\ny\n")))
    assert [(x.key, x.value) for x in plain] == [("k", "x"), ("k", "y")]
    assert [x.where for x in _lines("v", None, None, io.StringIO("ignored"))] == ["VALUE"]
    with pytest.raises(click.ClickException, match="stdin line 1: no key separator"):
        list(_lines(None, None, "\t", io.StringIO("no tab\n")))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["t", "v", "--key-separator", ":"], "--key-separator reads keys from stdin"),
        (["t", "--tombstone"], "--tombstone sends a null value for --key"),
        (["t", "--header", "novalue", "v"], "expected NAME=VALUE"),
        (["t", "v", "--value-serializer", "nope"], "unknown codec 'nope'"),
    ],
)
def test_send_refuses_bad_arguments_before_connecting(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["send", "-b", "kafka://127.0.0.1:1", *args])
    assert result.exit_code != 0
    assert message in result.output


def test_send_with_an_app_refuses_a_topic_it_does_not_declare(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    (tmp_path / "sj_send_app.py").write_text(
        "import streamjoin\napp = streamjoin.App('s')\napp.topic('orders')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sj_send_app", raising=False)  # (dropped again after)
    result = CliRunner().invoke(cli, ["-A", "sj_send_app:app", "send", "order", "v"])
    assert result.exit_code == 1
    assert "app 's' declares no topic 'order' (its topics: orders)" in result.output
    both = CliRunner().invoke(
        cli, ["send", "-A", "sj_send_app:app", "orders", "v", "--key-serializer", "str"]
    )
    assert both.exit_code == 2 and "apply without -A" in both.output


# -- group_by: a key its codec cannot encode --------------------------------------------------


async def test_a_group_by_key_that_does_not_fit_names_the_topic_and_the_fix() -> None:
    app = streamjoin.App("regroup")
    orders = app.topic("orders", key_serializer="str", value_serializer="json", partitions=2)
    by_amount = app.group_by(orders, lambda e: e.value["amount"], name="by-amount")
    assert by_amount.key_codec.name == "str"
    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value={"amount": 5})
        with pytest.raises(AgentFailed) as failed:
            await driver.drain()
    cause = failed.value.__cause__
    assert isinstance(cause, EncodeError)
    assert "repartition topic 'regroup-by-amount-repartition'" in str(cause)
    assert "the key 5 (int)" in str(cause) and "key_serializer=" in str(cause)
    assert isinstance(cause.__cause__, EncodeError)  # the codec's own words, kept


async def test_group_by_with_a_key_serializer_takes_that_key() -> None:
    app = streamjoin.App("regroup-ok")
    orders = app.topic("orders", key_serializer="str", value_serializer="json", partitions=2)
    app.group_by(orders, lambda e: e.value["amount"], name="by-amount", key_serializer="json")
    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value={"amount": 5})
        await driver.drain()
        assert [e.key for e in driver.records("regroup-ok-by-amount-repartition")] == [5]


# -- aiokafka's retried offset lookups ----------------------------------------------------


@pytest.fixture
def fetcher_log() -> Iterator[list[logging.LogRecord]]:
    logger = logging.getLogger(FETCHER_LOGGER)
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep(level=logging.NOTSET)
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    quiet_retried_offset_lookups()
    quiet_retried_offset_lookups()  # once is enough; twice changes nothing
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


def test_a_retried_offset_lookup_is_dropped_below_debug(
    fetcher_log: list[logging.LogRecord],
) -> None:
    logger = logging.getLogger(FETCHER_LOGGER)
    assert sum(type(f).__name__ == "RetriedOffsetLookups" for f in logger.filters) == 1
    logger.setLevel(logging.INFO)
    logger.error(FAILED_OFFSET_LOOKUP, 1, NotLeaderForPartitionError())
    assert fetcher_log == []
    logger.error(FAILED_OFFSET_LOOKUP, 1, UnsupportedVersionError())  # not retried: kept
    assert [r.levelno for r in fetcher_log] == [logging.ERROR]


def test_a_retried_offset_lookup_is_a_debug_line_saying_so(
    fetcher_log: list[logging.LogRecord],
) -> None:
    logger = logging.getLogger(FETCHER_LOGGER)
    logger.setLevel(logging.DEBUG)
    logger.error(FAILED_OFFSET_LOOKUP, 1, NotLeaderForPartitionError())
    (record,) = fetcher_log
    assert record.levelno == logging.DEBUG and record.levelname == "DEBUG"
    assert "NotLeaderForPartitionError" in record.getMessage()
    assert "retried" in record.getMessage()
