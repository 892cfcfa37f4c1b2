"""The ``streamjoin`` command line: arguments in, calls into the package out; no logic here."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TextIO

import click

from streamjoin import __version__
from streamjoin.assignor.plan import plan_with_explanation
from streamjoin.cli_acls import acls_command
from streamjoin.cli_app import agents, assignment, table_group, tables, worker
from streamjoin.cli_group import AppGroup, app_spec_option
from streamjoin.cli_offsets import offsets_group
from streamjoin.cli_send import send_command
from streamjoin.errors import KafkaProvisioningError, ProvisioningError
from streamjoin.local_cluster import LocalKafkaCluster
from streamjoin.local_kafka import KAFKA_VERSION, LocalKafka
from streamjoin.local_registry import LocalRegistry
from streamjoin.spark.cli import backfill_command, bootstrap_command


@click.group(cls=AppGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="streamjoin")
@app_spec_option
def cli() -> None:
    """streamjoin: stateful stream joins over Kafka.

    With -A MODULE:APP before the command, the app's own commands (@app.command) are
    listed and run too, and the commands that take -A get it from there.
    """


@cli.command("dev-broker")
@click.option(
    "--brokers",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help=(
        "Number of brokers. More than one: a local cluster (every node also a KRaft "
        "controller; internal topics replicated min(3, brokers) times, min.insync.replicas=2 "
        "with 3 or more)."
    ),
)
@click.option(
    "--port",
    type=int,
    default=None,
    help=(
        "Broker port on 127.0.0.1 (default: a free one below the ephemeral port range); "
        "a single broker only."
    ),
)
@click.option(
    "--kafka-version", default=KAFKA_VERSION, show_default=True, help="Apache Kafka release to run."
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=(
        "Keep broker data here and restart on it (same cluster id, and the same ports when "
        "free); default: a temporary directory removed on exit."
    ),
)
def dev_broker(brokers: int, port: int | None, kafka_version: str, data_dir: Path | None) -> None:
    """Run a local Apache Kafka broker (or cluster) in the foreground until Ctrl-C.

    Jars are resolved from Maven Central once and cached; brokers listen on
    127.0.0.1 only. Point tests at it with STREAMJOIN_KAFKA_BOOTSTRAP=<address>.
    """
    if port is not None and brokers > 1:
        raise click.UsageError("--port applies to a single broker; drop it with --brokers > 1")

    def say(line: str) -> None:
        click.echo(line, err=True)

    kafka: LocalKafka | LocalKafkaCluster
    if brokers == 1:
        kafka = LocalKafka(version=kafka_version, broker_port=port, data_dir=data_dir, progress=say)
    else:
        kafka = LocalKafkaCluster(brokers, version=kafka_version, data_dir=data_dir, progress=say)
    try:
        kafka.start()
    except KafkaProvisioningError as exc:
        raise click.ClickException(str(exc)) from exc
    _serve_until_ctrl_c(
        kafka, f"bootstrap servers: {kafka.bootstrap_servers}", "a broker", lambda: _logs_of(kafka)
    )


@cli.command("dev-registry")
@click.option(
    "--port",
    type=int,
    default=None,
    help="API port on 127.0.0.1 (default: a free one); health is served on a second free port.",
)
@click.option(
    "--heap", default="256m", show_default=True, help="The registry JVM's maximum heap (-Xmx)."
)
def dev_registry(port: int | None, heap: str) -> None:
    """Run a local Confluent-compatible schema registry in the foreground until Ctrl-C.

    Apicurio Registry (needs a Java 21+ JDK: JAVA_HOME, PATH or /usr/lib/jvm), fetched once
    from Maven Central and cached, storage in memory (empty at every start), on 127.0.0.1
    only. Point tests at it with STREAMJOIN_SCHEMA_REGISTRY_URL=<the printed URL>.
    """

    def say(line: str) -> None:
        click.echo(line, err=True)

    registry = LocalRegistry(port=port, heap=heap, progress=say)
    try:
        registry.start()
    except ProvisioningError as exc:
        raise click.ClickException(str(exc)) from exc
    _serve_until_ctrl_c(
        registry,
        f"schema registry (Confluent API): {registry.ccompat_url}",
        "the registry",
        lambda: str(registry.log_file),
    )


class _Running(Protocol):
    """A local service started by a dev command (a broker, a cluster, a registry)."""

    @property
    def running(self) -> bool: ...

    def stop(self) -> None: ...


def _serve_until_ctrl_c(service: _Running, banner: str, what: str, logs: Callable[[], str]) -> None:
    """Print ``banner`` (the address to use) and wait for Ctrl-C or SIGTERM, or for the
    service to exit by itself (an error naming its logs); stop it either way."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        click.echo(banner)
        click.echo("Press Ctrl-C to stop.", err=True)
        while not stop.is_set() and service.running:
            stop.wait(0.5)
        if not service.running:
            raise click.ClickException(f"{what} exited unexpectedly; see {logs()}")
    finally:
        click.echo("Stopping...", err=True)
        service.stop()


def _logs_of(kafka: LocalKafka | LocalKafkaCluster) -> str:
    if isinstance(kafka, LocalKafka):
        return str(kafka.log_file)
    return ", ".join(str(n.log_file) for n in kafka.nodes.values() if not n.running)


cli.add_command(worker)
cli.add_command(agents)
cli.add_command(assignment)
cli.add_command(tables)
cli.add_command(table_group)
cli.add_command(offsets_group)
cli.add_command(backfill_command)
cli.add_command(bootstrap_command)
cli.add_command(acls_command)
cli.add_command(send_command)


@cli.command("plan")
@click.argument(
    "scenario_files", metavar="FILE|-...", nargs=-1, required=True, type=click.File("r")
)
@click.option("--explain", is_flag=True, help="Also print who got what, and why (on stderr).")
@click.option("--indent", type=int, default=2, show_default=True, help="JSON indent (0: one line).")
def plan_command(scenario_files: tuple[TextIO, ...], explain: bool, indent: int) -> None:
    """Plan a rebalance: read scenario JSON (a file, or - for stdin), print the result JSON.

    With several files, prints one object keyed by file name. The formats are in
    docs/assignor.md; examples/plans/ has scenarios to try with --explain.
    """
    results: dict[str, object] = {}
    for scenario_file in scenario_files:
        try:
            doc = json.load(scenario_file)
            result, table = plan_with_explanation(doc)
        except json.JSONDecodeError as exc:
            raise click.ClickException(f"{scenario_file.name}: not valid JSON: {exc}") from exc
        except ValueError as exc:
            raise click.ClickException(f"{scenario_file.name}: {exc}") from exc
        results[scenario_file.name] = result
        if explain:
            if len(scenario_files) > 1:
                click.echo(f"== {scenario_file.name} ==", err=True)
            click.echo(table, err=True)
    output = results.popitem()[1] if len(results) == 1 else results
    click.echo(json.dumps(output, indent=indent if indent > 0 else None))


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
