"""App declarations, settings validation, the app loader and the app CLI commands."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import streamjoin
from streamjoin.app import parse_broker_url
from streamjoin.cli import cli
from streamjoin.codecs import STR
from streamjoin.config import AppConfig
from streamjoin.errors import AppNotFound, ConfigurationError, CopartitioningError, LifecycleError
from streamjoin.loader import load_app
from streamjoin.runtime.tasks.agent_runtime import Stream


@pytest.mark.parametrize(
    ("url", "servers"),
    [
        ("kafka://127.0.0.1:9092", "127.0.0.1:9092"),
        ("kafka://a:1,b:2", "a:1,b:2"),
        ("kafka://a:1,kafka://b:2", "a:1,b:2"),
        ("localhost:9092", "localhost:9092"),
    ],
)
def test_broker_urls(url: str, servers: str) -> None:
    assert parse_broker_url(url) == servers


@pytest.mark.parametrize("url", ["", "kafka://", "kafka://host", "kafka://host:port"])
def test_bad_broker_urls_are_named(url: str) -> None:
    with pytest.raises(ConfigurationError, match="broker"):
        parse_broker_url(url)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"id": "has space"}, "app id"),
        ({"id": "x", "processing_guarantee": "exactly-once"}, "not supported"),
        (
            {"id": "x", "processing_guarantee": "exactly_once", "commit_interval": 10},
            "at least twice the commit_interval",
        ),
        ({"id": "x", "transaction_timeout_ms": 10}, "transaction_timeout_ms"),
        ({"id": "x", "commit_interval": 0}, "commit_interval"),
        ({"id": "x", "standby_replicas": -1}, "standby_replicas"),
        ({"id": "x", "align_idle_ms": -5}, "align_idle_ms must be an int >= 0"),
        ({"id": "x", "align_max_idle_ms": 1.5}, "align_max_idle_ms must be an int >= 0"),
    ],
)
def test_bad_settings_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        streamjoin.App(**kwargs)  # type: ignore[arg-type]


def test_an_unknown_setting_is_named_with_the_closest_one() -> None:
    with pytest.raises(ConfigurationError, match=r"brokers \(did you mean 'broker'\?\)"):
        streamjoin.App("x", brokers="kafka://127.0.0.1:9092")  # type: ignore[call-arg]
    app = streamjoin.App("x")
    with pytest.raises(ConfigurationError, match=r"unknown App settings: comit_interval"):
        app.configure(comit_interval=2)


def test_the_app_takes_the_settings_of_app_config() -> None:
    app = streamjoin.App("x", key_serializer="str", value_serializer=Click)
    assert app.config == AppConfig("x", key_serializer="str", value_serializer=Click)
    assert app.config.key_codec is STR and app.config.value_codec.name == "json[Click]"
    app.configure(key_serializer="json")
    assert app.config.key_codec.name == "json" and app.topic("t").key_codec.name == "json"
    # help(App) and IDEs show AppConfig's settings, not (id, **settings)
    app_parameters = inspect.signature(streamjoin.App).parameters
    assert app_parameters == inspect.signature(AppConfig).parameters


def test_exactly_once_commits_every_100ms_unless_told_otherwise() -> None:
    assert streamjoin.App("x").config.commit_interval == 1.0
    eos = streamjoin.App("x", processing_guarantee="exactly_once")
    assert eos.config.commit_interval == 0.1 and eos.config.transaction_timeout_ms == 10_000
    assert eos.config.exactly_once and not streamjoin.App("x").config.exactly_once
    slow = streamjoin.App("x", processing_guarantee="exactly_once", commit_interval=2)
    assert slow.config.commit_interval == 2


def test_repr_hides_client_options() -> None:
    app = streamjoin.App("x", client_options={"sasl_plain_password": "hunter2"})
    assert "hunter2" not in repr(app)


def test_topic_declarations_are_shared_and_conflicts_rejected() -> None:
    app = streamjoin.App("x")
    a = app.topic("a", partitions=4)
    assert app.topic("a") is a
    assert app.topic("a", partitions=4) is a
    with pytest.raises(ConfigurationError, match="declared twice with 4 and 6"):
        app.topic("a", partitions=6)
    with pytest.raises(ConfigurationError, match="partitions must be >= 1"):
        app.topic("b", partitions=0)


def test_unknown_codec_is_a_clear_error() -> None:
    app = streamjoin.App("x")
    with pytest.raises(ValueError, match="avro"):
        app.topic("a", value_serializer="avro")


def test_copartition_check_names_the_counts() -> None:
    app = streamjoin.App("x")
    app.copartition("clicks", "impressions")
    app.check_copartitioning({"clicks": 10, "impressions": 10})
    with pytest.raises(
        CopartitioningError, match=r"10 partitions: clicks; 12 partitions: impressions"
    ):
        app.check_copartitioning({"clicks": 10, "impressions": 12})
    with pytest.raises(ConfigurationError, match="at least two"):
        app.copartition("clicks")


def test_agent_options_are_validated() -> None:
    app = streamjoin.App("x")

    async def f(stream: Stream) -> None:
        async for _ in stream:
            pass

    with pytest.raises(ValueError, match="concurrency"):
        app.agent("t", concurrency=0)(f)
    with pytest.raises(ValueError, match="on_error must be one of"):
        app.agent("t", on_error="retry")(f)  # type: ignore[arg-type]
    app.agent("t", name="one")(f)
    with pytest.raises(ConfigurationError, match="declared twice"):
        app.agent("t", name="one")(f)


@pytest.mark.parametrize("table_kind", ["topic_table", "table"])
def test_a_join_refuses_an_unknown_on_error(table_kind: str) -> None:
    # (refused by the join itself, before a topic table's agent takes the join in)
    app = streamjoin.App("x")
    events = app.topic("events", partitions=2)
    if table_kind == "topic_table":
        rows = app.topic_table(app.topic("rows", partitions=2))
    else:
        rows = app.table("rows", partitions=2)
    with pytest.raises(ConfigurationError, match="join 'enrich': on_error must be one of"):

        @app.join(events, rows, on_error="retry")  # type: ignore[arg-type]
        def enrich(key: object, event: object, row: object) -> object:
            return row


async def test_send_before_start_is_a_clear_error() -> None:
    app = streamjoin.App("x")
    topic = app.topic("t")
    with pytest.raises(LifecycleError, match="not running"):
        await topic.send(value=1)


APP_MODULE = textwrap.dedent(
    """
    import streamjoin

    app = streamjoin.App("cli-test")
    orders = app.topic("orders", partitions=3)
    not_an_app = 42

    @app.agent(orders, on_error="dead_letter", name="totals")
    async def totals(stream):
        async for _ in stream:
            pass
    """
)


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "sj_cli_app.py").write_text(APP_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "sj_cli_app"
    sys.modules.pop("sj_cli_app", None)


def test_load_app(app_module: str) -> None:
    app = load_app(f"{app_module}:app")
    assert app.id == "cli-test"
    assert load_app(app_module) is app  # attribute defaults to "app"
    with pytest.raises(AppNotFound, match="was not found"):
        load_app("no_such_module_xyz:app")
    with pytest.raises(AppNotFound, match="has no attribute 'nope'"):
        load_app(f"{app_module}:nope")
    with pytest.raises(AppNotFound, match=r"is a int, not a streamjoin\.App"):
        load_app(f"{app_module}:not_an_app")


def test_agents_command_lists_agents(app_module: str) -> None:
    result = CliRunner().invoke(cli, ["agents", "-A", f"{app_module}:app"])
    assert result.exit_code == 0, result.output
    assert "totals" in result.output
    assert "orders" in result.output
    assert "dead_letter -> cli-test-totals-dead-letters" in result.output


def test_worker_command_reports_a_bad_app_spec(app_module: str) -> None:
    result = CliRunner().invoke(cli, ["worker", "-A", f"{app_module}:nope"])
    assert result.exit_code != 0
    assert "has no attribute 'nope'" in result.output


def test_worker_help_documents_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["worker", "--help"])
    assert result.exit_code == 0
    assert "--instance-id" in result.output
    assert "Exit codes" in result.output


@dataclasses.dataclass
class Click:
    user: str


def test_redeclaring_a_topic_with_other_settings_is_an_error_naming_them() -> None:
    app = streamjoin.App("x")
    clicks = app.topic("clicks", key_serializer="str", value_serializer=Click, partitions=4)
    # the same settings again, or none (as agents, joins and copartition() name topics): fine
    assert app.topic("clicks", key_serializer="str", value_serializer=Click) is clicks
    assert app.topic("clicks", key_serializer=STR, partitions=4) is clicks
    assert app.topic("clicks") is clicks
    with pytest.raises(ConfigurationError) as caught:
        app.topic("clicks", key_serializer="json", value_serializer="raw")
    message = str(caught.value)
    assert "topic 'clicks'" in message
    assert "key_serializer 'str' and 'json'" in message
    assert "value_serializer 'json[Click]' and 'raw'" in message
    with pytest.raises(ConfigurationError, match=r"topic 'clicks'.*replication_factor auto and 3"):
        app.topic("clicks", replication_factor=3)
    app.topic("audit", config={"retention.ms": "1000"})
    assert app.topic("audit", config={"retention.ms": "1000"}) is app.topics["audit"]
    with pytest.raises(ConfigurationError, match=r"topic 'audit'.*config .*1000.*2000"):
        app.topic("audit", config={"retention.ms": "2000"})
    # a rejected redeclaration changes nothing
    assert clicks.key_codec is STR and clicks.partitions == 4


def test_a_dead_letter_topic_declared_with_other_codecs_is_refused() -> None:
    app = streamjoin.App("x")
    app.topic("parked", value_serializer="json")

    async def f(stream: Stream) -> None:
        async for _ in stream:
            pass

    with pytest.raises(ConfigurationError, match=r"topic 'parked'.*value_serializer"):
        app.agent("t", on_error="dead_letter", dead_letter="parked")(f)


# ------------------------------------------------------------------ interactive queries


def test_the_query_token_is_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMJOIN_QUERY_TOKEN", raising=False)
    app = streamjoin.App("q", query_token="hunter2")
    assert "hunter2" not in repr(app.config) and "hunter2" not in repr(app)
    assert app.config.query_token_value() == "hunter2"
    assert streamjoin.App("q").config.query_token_value() is None
    monkeypatch.setenv("STREAMJOIN_QUERY_TOKEN", "from-env")
    assert streamjoin.App("q").config.query_token_value() == "from-env"
    assert streamjoin.App("q", query_token="given").config.query_token_value() == "given"


@pytest.mark.parametrize("token", ["", "  ", 42])
def test_a_bad_query_token_is_refused(token: object) -> None:
    with pytest.raises(ConfigurationError, match="query_token"):
        streamjoin.App("q", query_token=token)  # type: ignore[arg-type]


def test_the_worker_cli_takes_http_host_and_query_token() -> None:
    result = CliRunner().invoke(cli, ["worker", "--help"])
    assert result.exit_code == 0
    assert "--http-host" in result.output and "--query-token" in result.output
    result = CliRunner().invoke(cli, ["table", "get", "--help"])
    assert "--remote" in result.output and "--allow-stale" in result.output


def test_table_get_needs_an_app_or_a_remote() -> None:
    result = CliRunner().invoke(cli, ["table", "get", "counts", "k1"])
    assert result.exit_code == 2
    assert "-A MODULE:APP (local state) or --remote URL" in result.output
