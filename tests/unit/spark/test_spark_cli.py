"""The backfill/bootstrap click commands: help, argument checks, a file backfill end to end."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import streamjoin
from examples.ad_traffic import generate
from streamjoin.errors import SparkJobError
from streamjoin.spark.bootstrap_job import bootstrap
from streamjoin.spark.cli import backfill_command, bootstrap_command, is_path, parse_time
from streamjoin.spark.sources import FileSource
from tests.unit.spark.history_files import write_records


@click.group()
def cli() -> None:
    """Stand-in for the main CLI group."""


cli.add_command(backfill_command)
cli.add_command(bootstrap_command)


def test_help_documents_both_commands() -> None:
    runner = CliRunner()
    backfill_help = runner.invoke(cli, ["backfill", "--help"]).output
    assert "--from-kafka" in backfill_help and "--output TOPIC|PATH" in backfill_help
    assert "--final-only" in backfill_help and "stream-table" in backfill_help
    bootstrap_help = runner.invoke(cli, ["bootstrap", "--help"]).output
    assert "--mode [changelog|rocksdb]" in bootstrap_help


def test_exactly_one_source_is_required() -> None:
    result = CliRunner().invoke(
        cli, ["backfill", "-A", "examples.ad_monetization:app", "ad_clicks", "--output", "x"]
    )
    assert result.exit_code != 0 and "exactly one of --from-kafka" in result.output


def test_parallelism_must_be_positive() -> None:
    assert "--parallelism" in CliRunner().invoke(cli, ["backfill", "--help"]).output
    result = CliRunner().invoke(
        cli,
        [
            "backfill",
            "-A",
            "examples.ad_monetization:app",
            "ad_clicks",
            "--input",
            "x.json",
            "--output",
            "out/",
            "--parallelism",
            "0",
        ],
    )
    assert result.exit_code == 2 and "--parallelism" in result.output and ">=1" in result.output


def test_parsers() -> None:
    assert parse_time("1767225600000") == 1767225600000
    assert parse_time("2026-01-01T00:00:00") == 1767225600000
    assert is_path("out/joined") and is_path("x.parquet") and not is_path("attributed")


def test_bootstrap_refuses_tables_not_read_from_a_topic() -> None:
    app = streamjoin.App("boot-unit")
    app.table("counts", default=int)
    with pytest.raises(SparkJobError, match="topic_table"):
        bootstrap(app, "counts", source=FileSource(["nowhere.json"]))


def test_bootstrap_says_why_windowed_and_joined_tables_cannot_be_built() -> None:
    from streamjoin.state.windows import TumblingWindows

    app = streamjoin.App("boot-unit-kinds")
    app.table(
        "per-minute", default=int, window=TumblingWindows(size_ms=60_000, retention_ms=120_000)
    )
    left = app.topic_table(app.topic("users", key_serializer="str"))
    right = app.topic_table(app.topic("scores", key_serializer="str"))
    app.join(left, right, name="user-scores")(lambda k, a, b: [a, b])
    written_by_agents = r"windowed table written by agent code.*app\.aggregate"
    with pytest.raises(SparkJobError, match=written_by_agents):
        bootstrap(app, "per-minute", source=FileSource(["nowhere.json"]))
    with pytest.raises(SparkJobError, match="result of table-table join 'user-scores'"):
        bootstrap(app, "user-scores", source=FileSource(["nowhere.json"]))


def test_backfill_refuses_options_of_another_join_kind() -> None:
    from streamjoin.errors import ConfigurationError, SparkJobError
    from streamjoin.spark import FileSink, backfill

    app = streamjoin.App("backfill-kinds")
    clicks = app.topic("clicks", key_serializer="str", partitions=2)
    users = app.topic_table(app.topic("users", key_serializer="str", partitions=2))
    app.join(clicks, users, name="enrich")(lambda k, c, u: u)
    written = app.table("written-by-agents", partitions=2)
    app.join(app.topic("views", key_serializer="str", partitions=2), written, name="agents")(
        lambda k, v, w: w
    )
    source, sink = FileSource(["nowhere.json"]), FileSink("out")
    with pytest.raises(ConfigurationError, match="--close-windows"):
        backfill(app, "enrich", source=source, output=sink, close_windows_at_end=True)
    with pytest.raises(ConfigurationError, match="--final-only"):
        backfill(app, "enrich", source=source, output=sink, final_only=True)
    with pytest.raises(SparkJobError, match="written by agents"):
        backfill(app, "agents", source=source, output=sink)


@pytest.mark.spark
def test_cli_backfill_from_files(tmp_path: Path) -> None:
    from streamjoin.spark.testing import shared_test_session

    shared_test_session()  # the command reuses the active session
    traffic = generate(100, seed=2)
    source = tmp_path / "history.json"
    write_records(source, traffic.records)
    out = tmp_path / "joined"
    result = CliRunner().invoke(
        cli,
        [
            "backfill",
            "-A",
            "examples.ad_monetization:app",
            "ad_clicks",
            "--input",
            str(source),
            "--output",
            str(out),
            "--output-format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"-> {len(traffic.expected_joins)} outputs" in result.output
    got = {
        (v["auction_id"], v["impression_id"], v["click_id"])
        for f in out.glob("*.json")
        for v in (json.loads(json.loads(line)["value"]) for line in f.read_text().splitlines())
    }
    assert got == traffic.expected_joins
