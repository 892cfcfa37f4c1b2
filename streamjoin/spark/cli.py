"""``streamjoin backfill`` and ``streamjoin bootstrap``: arguments in, calls into the Spark jobs.

Registered on the main CLI with ``cli.add_command(backfill_command)`` and
``cli.add_command(bootstrap_command)``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from streamjoin.errors import StreamjoinError
from streamjoin.spark.sources import FileSource, KafkaSource, OffsetSpec, Source

__all__ = ["backfill_command", "bootstrap_command"]

_PATH_SUFFIXES = (".json", ".jsonl", ".parquet")


def parse_time(text: str | None) -> int | None:
    """Epoch milliseconds, or an ISO-8601 time (UTC when no offset is given)."""
    if text is None:
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise click.BadParameter(f"{text!r} is neither epoch ms nor an ISO-8601 time") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp() * 1000)


def parse_offsets(text: str, default: str) -> OffsetSpec:
    """``earliest``/``latest`` or Spark's JSON ``{"topic": {"0": 42}}``."""
    if text in ("earliest", "latest"):
        return text  # type: ignore[return-value]
    try:
        raw = json.loads(text)
        return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in raw.items()}
    except (ValueError, AttributeError) as exc:
        raise click.BadParameter(
            f'{text!r}: expected earliest, latest or JSON like \'{{"topic": {{"0": 42}}}}\' '
            f"(default {default})"
        ) from exc


def is_path(target: str) -> bool:
    return "/" in target or target.startswith(".") or target.endswith(_PATH_SUFFIXES)


def _conf(items: tuple[str, ...]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"--conf {item!r}: expected key=value")
        conf[key] = value
    return conf


def _source(
    from_kafka: str | None,
    inputs: tuple[str, ...],
    input_format: str | None,
    starting: str,
    ending: str,
    from_time: str | None,
    until_time: str | None,
) -> Source:
    if bool(from_kafka) == bool(inputs):
        raise click.UsageError("give exactly one of --from-kafka BOOTSTRAP or --input PATH")
    start_ms, end_ms = parse_time(from_time), parse_time(until_time)
    if from_kafka:
        return KafkaSource(
            from_kafka.removeprefix("kafka://"),
            parse_offsets(starting, "earliest"),
            parse_offsets(ending, "latest"),
            start_ms,
            end_ms,
        )
    return FileSource(list(inputs), input_format, start_ms, end_ms)  # type: ignore[arg-type]


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "-A", "--app", "app_spec", required=True, help="The app, as 'package.module:app'."
        ),
        click.option(
            "--from-kafka",
            metavar="BOOTSTRAP",
            help="Read the input topics from this Kafka cluster (host:port[,...]).",
        ),
        click.option(
            "--input",
            "inputs",
            multiple=True,
            metavar="PATH",
            help="Read exported records (Parquet or JSON lines: topic, key, value, timestamp "
            "[, partition, offset]); repeatable.",
        ),
        click.option(
            "--input-format", type=click.Choice(["parquet", "json"]), help="Default: guessed."
        ),
        click.option(
            "--starting-offsets",
            default="earliest",
            show_default=True,
            help='earliest, or JSON {"topic": {"0": 42}} (Kafka input).',
        ),
        click.option(
            "--ending-offsets",
            default="latest",
            show_default=True,
            help="latest (pinned at submit time), or JSON; exclusive (Kafka input).",
        ),
        click.option("--from-time", help="Only records at or after this time (epoch ms / ISO)."),
        click.option("--until-time", help="Only records before this time (epoch ms / ISO)."),
        click.option(
            "--partitions",
            type=int,
            help="Partition count when reading files and the app does not declare it.",
        ),
        click.option(
            "--master",
            default="local[*]",
            show_default=True,
            help="Spark master: local[N], spark://host:7077, yarn, k8s://...",
        ),
        click.option(
            "--kafka-packages",
            help="Maven coordinates of the Spark Kafka connector "
            "(default: spark-sql-kafka-0-10 of the installed PySpark; env "
            "STREAMJOIN_SPARK_KAFKA_PACKAGES).",
        ),
        click.option(
            "--conf", "conf", multiple=True, metavar="KEY=VALUE", help="Extra Spark setting."
        ),
        click.option("--quiet", is_flag=True, help="No progress line."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _progress(quiet: bool) -> Callable[[Any], None] | None:
    if quiet:
        return None
    return lambda p: click.echo(p.line(), err=True)


def _load(app_spec: str) -> Any:
    from streamjoin.cli_app import _add_env_client_options
    from streamjoin.errors import AppNotFound
    from streamjoin.loader import load_app

    try:
        app = load_app(app_spec)
        _add_env_client_options(app)  # STREAMJOIN_CLIENT_* credentials, as every command
    except AppNotFound as exc:
        raise click.ClickException(str(exc)) from exc
    return app


def _secured(source: Source, app: Any) -> Source:
    """A Kafka source logging in as the app's client options say (Spark's JVM client)."""
    if not isinstance(source, KafkaSource):
        return source
    from dataclasses import replace

    from streamjoin.client_security import spark_kafka_options
    from streamjoin.config import reveal

    login = spark_kafka_options(reveal(app.config.client_options))
    return replace(source, options={**login, **source.options})


def _fail(exc: Exception) -> click.ClickException:
    from streamjoin.cli_app import _kafka_failure

    failure = _kafka_failure(exc)
    if failure.exit_code != 1:  # a refused login or ACL: exit 3, as for every command
        return failure
    return click.ClickException(f"{type(exc).__name__}: {exc}")


@click.command("backfill")
@click.argument("join_name", metavar="JOIN")
@_common
@click.option(
    "--output",
    required=True,
    metavar="TOPIC|PATH",
    help="A Kafka topic (keyed partitions, join timestamps) or a directory of files "
    "(anything with '/' or ending .json/.jsonl/.parquet is a path).",
)
@click.option("--output-format", type=click.Choice(["json", "parquet"]), help="For a path.")
@click.option("--output-bootstrap", help="Kafka cluster of the output topic (default: input's).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@click.option(
    "--close-windows",
    is_flag=True,
    help="Stream-stream left/outer joins: also emit unmatched events whose window is open at "
    "the end; emit='close' aggregations: also the final results of windows open at the end.",
)
@click.option(
    "--final-only",
    is_flag=True,
    help="Table-table joins: only the last change of each key (its final row), not every "
    "change (foreign-key joins: required); emit='update' aggregations: only the last result "
    "of each window.",
)
@click.option(
    "--parallelism",
    type=click.IntRange(min=1),
    help="Spark tasks for the join; above the partition count each partition is split by "
    "key (default: Spark's default parallelism, at least the partition count).",
)
def backfill_command(
    join_name: str,
    app_spec: str,
    from_kafka: str | None,
    inputs: tuple[str, ...],
    input_format: str | None,
    starting_offsets: str,
    ending_offsets: str,
    from_time: str | None,
    until_time: str | None,
    partitions: int | None,
    master: str,
    kafka_packages: str | None,
    conf: tuple[str, ...],
    quiet: bool,
    output: str,
    output_format: str | None,
    output_bootstrap: str | None,
    overwrite: bool,
    close_windows: bool,
    final_only: bool,
    parallelism: int | None,
) -> None:
    """Run the app's JOIN (or aggregation) over history on Spark, as the workers do.

    \b
    Any declared join: stream-stream (the workers' windowed join core),
    stream-table (each stream record with its key's row as of the record's
    timestamp; the table's topic is read from its beginning) and table-table
    (the joined table's changes, or --final-only its final rows; a foreign-key
    join: its final rows only, with --final-only). An
    aggregation (app.aggregate) writes the results its workers send, through
    the workers' window code (docs/spark.md, "Aggregations").
    Records are grouped by Kafka partition (murmur2 of the key) and joined per
    partition in event-time order. Progress is printed every few seconds; the
    Spark UI (http://localhost:4040 when local) shows stages and tasks.

    \b
    Examples:
      streamjoin backfill -A examples.ad_monetization:app ad_clicks \\
          --from-kafka 127.0.0.1:9092 --output attributed-clicks-backfill
      streamjoin backfill -A examples.ad_monetization:app ad_clicks \\
          --input history.json --output out/joined --output-format json
    """
    from streamjoin.spark.backfill_job import FileSink, KafkaSink, Sink, backfill

    source = _source(
        from_kafka, inputs, input_format, starting_offsets, ending_offsets, from_time, until_time
    )
    app = _load(app_spec)
    source = _secured(source, app)
    sink: Sink
    if output_format is not None or is_path(output):
        sink = FileSink(
            output,
            output_format,  # type: ignore[arg-type]
            "overwrite" if overwrite else "error",
        )
    else:
        sink = KafkaSink(
            output, output_bootstrap.removeprefix("kafka://") if output_bootstrap else None
        )
    try:
        result = backfill(
            app,
            join_name,
            source=source,
            output=sink,
            master=master,
            partitions=partitions,
            parallelism=parallelism,
            close_windows_at_end=close_windows,
            final_only=final_only,
            kafka_packages=kafka_packages,
            spark_conf=_conf(conf),
            progress=_progress(quiet),
        )
    except (StreamjoinError, LookupError, ValueError, FileExistsError, RuntimeError) as exc:
        raise _fail(exc) from exc
    click.echo(
        f"backfill {result.join}: {result.records_read} records in {result.partitions} "
        f"partitions ({result.tasks} tasks) -> {result.outputs} outputs to {result.output} "
        f"({result.late} late) in {result.elapsed_s:.1f}s"
    )


@click.command("bootstrap")
@click.argument("table_name", metavar="TABLE")
@_common
@click.option(
    "--mode",
    type=click.Choice(["changelog", "rocksdb"]),
    default="changelog",
    show_default=True,
    help="changelog: produce the state to the table's changelog; rocksdb: also write the "
    "per-partition stores (with their changelog offsets) into --state-dir.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where --mode rocksdb writes stores (default: the app's state dir).",
)
@click.option("--changelog-bootstrap", help="Kafka cluster of the changelog (default: input's).")
@click.option(
    "--no-commit-offsets",
    is_flag=True,
    help="Do not commit the app's group offsets at the end of the history read.",
)
def bootstrap_command(
    table_name: str,
    app_spec: str,
    from_kafka: str | None,
    inputs: tuple[str, ...],
    input_format: str | None,
    starting_offsets: str,
    ending_offsets: str,
    from_time: str | None,
    until_time: str | None,
    partitions: int | None,
    master: str,
    kafka_packages: str | None,
    conf: tuple[str, ...],
    quiet: bool,
    mode: str,
    state_dir: Path | None,
    changelog_bootstrap: str | None,
    no_commit_offsets: bool,
) -> None:
    """Build TABLE (an app.topic_table) from its topic's history on Spark, so workers start warm.

    \b
    TABLE may also be an aggregation (app.aggregate): its windowed table is
    built with the workers' window code, in their store layout.
    The changelog must be empty. With --mode rocksdb the stores are written with
    the offsets of the records just produced: a worker using that state dir
    replays nothing. With --from-kafka the app's group is committed at the end
    of what was read, so the table's agent continues from there.

    \b
    Example:
      streamjoin bootstrap -A myapp:app profiles-table --from-kafka 127.0.0.1:9092 \\
          --mode rocksdb --state-dir ./myapp-data
    """
    from streamjoin.spark.bootstrap_job import bootstrap

    source = _source(
        from_kafka, inputs, input_format, starting_offsets, ending_offsets, from_time, until_time
    )
    app = _load(app_spec)
    source = _secured(source, app)
    try:
        result = bootstrap(
            app,
            table_name,
            source=source,
            mode=mode,  # type: ignore[arg-type]
            state_dir=state_dir,
            changelog_bootstrap=changelog_bootstrap,
            partitions=partitions,
            commit_source_offsets=not no_commit_offsets,
            master=master,
            kafka_packages=kafka_packages,
            spark_conf=_conf(conf),
            progress=_progress(quiet),
        )
    except (StreamjoinError, LookupError, ValueError, FileExistsError, RuntimeError) as exc:
        raise _fail(exc) from exc
    where = f", stores in {result.state_dir}" if result.state_dir else ""
    click.echo(
        f"bootstrap {result.table}: {result.records_read} records -> {result.keys} keys in "
        f"{result.changelog} (offsets {result.changelog_offsets}){where} "
        f"in {result.elapsed_s:.1f}s"
    )
