"""The ``streamjoin`` command line: arguments in, calls into the package out; no logic here."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from streamjoin import __version__
from streamjoin.cli_app import agents, assignment, worker
from streamjoin.testing.kafka import KAFKA_VERSION, KafkaProvisioningError, LocalKafka


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="streamjoin")
def cli() -> None:
    """streamjoin: stateful stream joins over Kafka."""


@cli.command("dev-broker")
@click.option(
    "--port", type=int, default=None, help="Broker port on 127.0.0.1 (default: a free one)."
)
@click.option(
    "--kafka-version", default=KAFKA_VERSION, show_default=True, help="Apache Kafka release to run."
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep broker data here (default: a temporary directory removed on exit).",
)
def dev_broker(port: int | None, kafka_version: str, data_dir: Path | None) -> None:
    """Run a local single-node Apache Kafka broker in the foreground until Ctrl-C.

    Jars are resolved from Maven Central once and cached; the broker listens on
    127.0.0.1 only. Point tests at it with STREAMJOIN_KAFKA_BOOTSTRAP=<address>.
    """
    broker = LocalKafka(
        version=kafka_version,
        broker_port=port,
        data_dir=data_dir,
        progress=lambda line: click.echo(line, err=True),
    )
    try:
        broker.start()
    except KafkaProvisioningError as exc:
        raise click.ClickException(str(exc)) from exc
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        click.echo(f"bootstrap servers: {broker.bootstrap_servers}")
        click.echo("Press Ctrl-C to stop.", err=True)
        while not stop.is_set() and broker.running:
            stop.wait(0.5)
        if not broker.running:
            raise click.ClickException(f"the broker exited unexpectedly; see {broker.log_file}")
    finally:
        click.echo("Stopping the broker...", err=True)
        broker.stop()


cli.add_command(worker)
cli.add_command(agents)
cli.add_command(assignment)


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
