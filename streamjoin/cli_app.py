"""CLI commands that operate on a user's App (``-A module:app``): worker, agents, assignment."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from streamjoin.app import App
from streamjoin.errors import AppNotFound, ConfigurationError, StartupError, StreamjoinError
from streamjoin.loader import load_app

if TYPE_CHECKING:
    from streamjoin.runtime.group.group_info import GroupInfo
    from streamjoin.runtime.ops.offset_moves import PartitionOffsets

#: where ``streamjoin -A module:app <command>`` keeps the ``-A`` given before the command
APP_SPEC = "streamjoin.app_spec"


def app_spec_given_before() -> str | None:
    """The ``-A`` given before the subcommand (``streamjoin -A myproj.app worker``, as
    Faust's ``faust -A app worker``), the default of the subcommands' own ``-A``."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(APP_SPEC)


def _required_app_spec(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """``-A`` given after the subcommand or before it; else click's "Missing option"."""
    if value is None:
        raise click.MissingParameter(ctx=ctx, param=param)
    return value


F = TypeVar("F", bound=Callable[..., Any])


def optional_app_option(help: str) -> Callable[[F], F]:
    """``-A`` of a command that also works without an app (default: the one given before
    the command)."""
    return click.option(
        "-A", "--app", "app_spec", default=app_spec_given_before, metavar="MODULE:APP", help=help
    )


app_option = click.option(
    "-A",
    "--app",
    "app_spec",
    default=app_spec_given_before,
    callback=_required_app_spec,
    metavar="MODULE:APP",
    help="The App to use, e.g. myproj.app:app (the current directory is importable; "
    "may also come before the command: streamjoin -A myproj.app:app worker).",
)
broker_option = click.option(
    "-b", "--broker", default=None, help="Override the app's broker, e.g. kafka://127.0.0.1:9092."
)


def _load(app_spec: str, broker: str | None) -> App:
    try:
        app = load_app(app_spec)
        _add_env_client_options(app)
        if broker:
            app.configure(broker=broker)
    except (AppNotFound, StartupError, ConfigurationError) as exc:
        raise click.ClickException(str(exc)) from exc
    return app


def _add_env_client_options(app: App) -> None:
    """``STREAMJOIN_CLIENT_*`` variables over the app's client options (credentials reach
    the CLI from the environment or files, never from its command line)."""
    from streamjoin.client_security import client_options_from_env

    from_env = client_options_from_env()
    if from_env:
        app.configure(client_options={**app.config.client_options, **from_env})


def _kafka_failure(exc: BaseException, doing: str | None = None) -> click.ClickException:
    """A command's Kafka error as one line: a refused login or ACL exits 3 (like a worker
    that cannot start), anything else 1."""
    from streamjoin.runtime.transport.access import refusal_of

    refused = refusal_of(exc)
    if refused is not None:
        return _cannot_start(str(refused))
    return click.ClickException(f"{doing}: {exc}" if doing else str(exc))


def _cannot_start(message: str) -> click.ClickException:
    """The worker cannot start: ``Error: <message>`` and exit code 3 (see ``EXIT_CODES``)."""
    from streamjoin.runtime.run import EXIT_CANNOT_START

    error = click.ClickException(message)
    # click reads exit_code from the instance it catches
    error.exit_code = EXIT_CANNOT_START  # type: ignore[misc]
    return error


def _worker_help() -> str:
    from streamjoin.runtime.run import EXIT_CODES

    codes = "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items())
    return f"Run the app's agents and timers until SIGINT/SIGTERM.\n\n\b\nExit codes:\n{codes}"


@click.command("worker", help=_worker_help())
@app_option
@broker_option
@click.option(
    "-l",
    "--loglevel",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where local state lives (default: the app's state_dir).",
)
@click.option(
    "--instance-id",
    default=None,
    help="Static group membership id: restart with the same id to keep the partitions.",
)
@click.option(
    "--metrics-port",
    "--web-port",
    "web_port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve the status page (/), /status.json and Prometheus /metrics on this port "
    "(default: the app's web_port; 0: any free port).",
)
@click.option(
    "--http-host",
    "--web-host",
    "web_host",
    default=None,
    help="The address the status page and table queries listen on (default: the app's "
    "web_host, 127.0.0.1: this machine only; 0.0.0.0 exposes them).",
)
@click.option(
    "--query-token",
    default=None,
    envvar="STREAMJOIN_QUERY_TOKEN",
    help="Bearer token table queries (GET /tables/...) must carry (default: the app's "
    "query_token; env STREAMJOIN_QUERY_TOKEN).",
)
@click.option(
    "--web-tls-cert",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="STREAMJOIN_WEB_TLS_CERT",
    help="Serve HTTPS only, with this certificate (PEM, then its chain; with --web-tls-key; "
    "env STREAMJOIN_WEB_TLS_CERT). An encrypted key's password is read from env "
    "STREAMJOIN_WEB_TLS_KEY_PASSWORD.",
)
@click.option(
    "--web-tls-key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="STREAMJOIN_WEB_TLS_KEY",
    help="The private key (PEM) of --web-tls-cert (env STREAMJOIN_WEB_TLS_KEY).",
)
@click.option(
    "--web-tls-client-ca",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="STREAMJOIN_WEB_TLS_CLIENT_CA",
    help="Mutual TLS: clients (other workers too) must present a certificate this CA (PEM) "
    "signed (env STREAMJOIN_WEB_TLS_CLIENT_CA).",
)
@click.option(
    "--web-tls-ca",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="STREAMJOIN_WEB_TLS_CA",
    help="The CA (PEM) other workers' HTTPS servers are verified against when a table read "
    "is forwarded (default: the system's CAs; env STREAMJOIN_WEB_TLS_CA).",
)
@click.option(
    "--startup-timeout",
    type=float,
    default=None,
    help="Seconds to keep trying to reach the broker at start (default: the app's "
    "startup_timeout, 60).",
)
@click.option(
    "--shutdown-timeout",
    type=float,
    default=None,
    help="Longest a stop may take before the worker exits anyway (default: the app's "
    "shutdown_timeout, 30).",
)
@click.option(
    "--processes",
    type=click.IntRange(1, 512),
    default=1,
    show_default=True,
    help="Run this many worker processes, each a member of the group with its own event "
    "loop (a worker uses about one core): state in <state dir>/process-<i>, instance id "
    "<instance id>-<i>, web port <web port>+<i>. If one ends on its own, the others are "
    "stopped and the command exits with its code.",
)
def worker(
    app_spec: str,
    broker: str | None,
    loglevel: str,
    state_dir: Path | None,
    instance_id: str | None,
    web_port: int | None,
    web_host: str | None,
    query_token: str | None,
    web_tls_cert: Path | None,
    web_tls_key: Path | None,
    web_tls_client_ca: Path | None,
    web_tls_ca: Path | None,
    startup_timeout: float | None,
    shutdown_timeout: float | None,
    processes: int,
) -> None:
    import os

    from streamjoin.runtime.run import run_worker

    overrides: dict[str, object] = {}
    if broker:
        overrides["broker"] = broker
    if state_dir is not None:
        overrides["state_dir"] = state_dir
    if instance_id is not None:
        overrides["group_instance_id"] = instance_id
    if web_port is not None:
        overrides["web_port"] = web_port
    if web_host is not None:
        overrides["web_host"] = web_host
    if query_token:
        overrides["query_token"] = query_token
    tls_files = {
        "web_tls_cert": web_tls_cert,
        "web_tls_key": web_tls_key,
        "web_tls_client_ca": web_tls_client_ca,
        "web_tls_ca": web_tls_ca,
    }
    overrides.update({name: path for name, path in tls_files.items() if path is not None})
    if os.environ.get("STREAMJOIN_WEB_TLS_KEY_PASSWORD"):
        overrides["web_tls_key_password"] = os.environ["STREAMJOIN_WEB_TLS_KEY_PASSWORD"]
    if startup_timeout is not None:
        overrides["startup_timeout"] = startup_timeout
    if shutdown_timeout is not None:
        overrides["shutdown_timeout"] = shutdown_timeout
    try:
        app = load_app(app_spec)
        _add_env_client_options(app)
        app.configure(**overrides)  # validated like the App's own settings
    except StreamjoinError as exc:  # AppNotFound, StartupError, ConfigurationError...
        raise _cannot_start(str(exc)) from exc
    if processes > 1:
        passed = _same_for_every_process(broker, web_host, tls_files, startup_timeout)
        raise SystemExit(_run_processes(app, app_spec, loglevel, processes, passed, query_token))
    raise SystemExit(
        run_worker(
            app,
            loglevel,
            broker=app.config.broker,
            shutdown_timeout=app.config.shutdown_timeout,
            secrets=app.config.secret_values(),
        )
    )


def _same_for_every_process(
    broker: str | None,
    web_host: str | None,
    tls_files: dict[str, Path | None],
    startup_timeout: float | None,
) -> list[str]:
    """The worker options given on the command line that every ``--processes`` child gets
    as they are (the query token goes by environment: not in ``ps``)."""
    passed: list[str] = []
    if broker:
        passed += ["--broker", broker]
    if web_host is not None:
        passed += ["--web-host", web_host]
    for name, path in tls_files.items():
        if path is not None:
            passed += [f"--{name.replace('_', '-')}", str(path)]
    if startup_timeout is not None:
        passed += ["--startup-timeout", str(startup_timeout)]
    return passed


def _run_processes(
    app: App,
    app_spec: str,
    loglevel: str,
    processes: int,
    passed: list[str],
    query_token: str | None,
) -> int:
    """``worker --processes N``: N children (see :mod:`streamjoin.cli_processes`)."""
    import logging
    import os

    from streamjoin.cli_processes import child_command, child_settings, run_processes

    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(message)s")
    config = app.config
    state_dir = config.state_path
    shutdown = config.shutdown_timeout
    passed = [*passed, "--shutdown-timeout", str(shutdown)]
    try:
        every = child_settings(processes, state_dir, config.group_instance_id, config.web_port)
    except ConfigurationError as exc:
        raise _cannot_start(str(exc)) from exc
    commands = [child_command(app_spec, loglevel, settings, passed) for settings in every]
    env = dict(os.environ)
    if query_token:
        env["STREAMJOIN_QUERY_TOKEN"] = query_token
    return run_processes(commands, shutdown, env=env)


@click.command("agents")
@app_option
def agents(app_spec: str) -> None:
    """List the app's agents with their source topics and error policies."""
    app = _load(app_spec, None)
    if not app.agents:
        click.echo(f"app {app.id!r} declares no agents")
        return
    rows = [("AGENT", "TOPIC", "CONCURRENCY", "ON ERROR")]
    for agent in app.agents.values():
        policy: str = agent.on_error
        if agent.dead_letter is not None:
            policy += f" -> {agent.dead_letter.name}"
        topics = ", ".join(t.name for t in agent.topics)
        rows.append((agent.name, topics, str(agent.concurrency), policy))
    click.echo(_table(rows))


@click.command("assignment")
@app_option
@broker_option
def assignment(app_spec: str, broker: str | None) -> None:
    """Show the app's consumer group: members (with the query address each advertises) and
    their active and standby partitions, and each source partition's owner, committed
    offset, end offset and lag."""
    from streamjoin.runtime.group.group_info import describe_group
    from streamjoin.runtime.ops.offset_moves import read_offsets
    from streamjoin.runtime.transport.access import check_login

    app = _load(app_spec, broker)
    sources = sorted(app.topology().source_topics)

    async def describe() -> tuple[GroupInfo, list[PartitionOffsets]]:
        await check_login(app.config.broker, **app.config.client_kwargs())
        info = await describe_group(app.config.broker, app.id, **app.config.client_kwargs())
        parts = await read_offsets(app.config.broker, app.id, sources, **app.config.client_kwargs())
        return info, parts

    try:
        info, parts = asyncio.run(describe())
    except Exception as exc:
        raise _kafka_failure(exc, f"could not describe group {app.id!r}") from exc
    if not info.members:
        # Kafka says "Empty" (offsets kept) or "Dead" (none): to an operator, both mean this
        click.echo(f"group {info.group_id!r}: no active members")
    else:
        click.echo(f"group {info.group_id!r}: state {info.state}, {len(info.members)} members")
        rows = [("MEMBER", "INSTANCE", "HOST", "QUERY", "GENERATION", "ACTIVE", "STANDBY")]
        for m in info.members:
            rows.append(
                (
                    m.member_id,
                    m.instance_id or "-",
                    m.client_host,
                    m.host or "-",
                    str(m.generation),
                    _format_tps(m.active),
                    _format_tps(m.standby),
                )
            )
        click.echo(_table(rows))
    if parts:
        click.echo("")
        click.echo(_table(_partition_rows(info, parts)))


def _partition_rows(info: GroupInfo, parts: Sequence[PartitionOffsets]) -> list[tuple[str, ...]]:
    """One row per source partition: who owns it, committed and end offsets, lag."""
    owners = {
        (topic, p): m.instance_id or m.member_id
        for m in info.members
        for topic, ps in m.active.items()
        for p in ps
    }
    rows: list[tuple[str, ...]] = [("TOPIC", "PARTITION", "OWNER", "COMMITTED", "END", "LAG")]
    for part in parts:
        rows.append(
            (
                part.topic,
                str(part.partition),
                owners.get((part.topic, part.partition), "-"),
                "-" if part.committed is None else str(part.committed),
                str(part.end),
                str(part.lag),
            )
        )
    return rows


def _format_tps(tps: dict[str, list[int]]) -> str:
    return " ".join(f"{t}{_ranges(ps)}" for t, ps in sorted(tps.items())) or "-"


def _ranges(partitions: list[int]) -> str:
    """[0,1,2,5] -> "[0-2,5]"."""
    spans: list[list[int]] = []
    for p in sorted(partitions):
        if spans and spans[-1][1] == p - 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    return "[" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) + "]"


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The worker's state directory (default: the app's state_dir).",
)


@click.command("tables")
@app_option
@state_dir_option
def tables(app_spec: str, state_dir: Path | None) -> None:
    """List the app's tables and the partitions stored locally (keys, size, changelog offset)."""
    from streamjoin.state.inspect import local_partitions

    app = _load(app_spec, None)
    root = state_dir or app.config.state_path
    if not app.tables:
        click.echo(f"app {app.id!r} declares no tables")
        return
    rows = [("TABLE", "CHANGELOG", "PARTITION", "KEYS~", "SIZE", "OFFSET", "NOTE")]
    for table in app.tables.values():
        found = False
        for lp in local_partitions(root, table):
            found = True
            rows.append(
                (
                    table.name,
                    table.changelog.name,
                    str(lp.partition),
                    "-" if lp.keys is None else str(lp.keys),
                    "-" if lp.size_bytes is None else _human_bytes(lp.size_bytes),
                    "-" if lp.changelog_offset is None else str(lp.changelog_offset),
                    lp.error or "",
                )
            )
        if not found:
            note = "no local state" if table.store == "rocksdb" else "memory store (no local state)"
            rows.append((table.name, table.changelog.name, "-", "-", "-", "-", note))
    click.echo(f"state dir: {root}")
    click.echo(_table(rows))


@click.group("table")
def table_group() -> None:
    """Read one table's local state."""


@table_group.command("get")
@optional_app_option("The App whose local state to read (not needed with --remote).")
@state_dir_option
@click.option(
    "--remote",
    default=None,
    metavar="URL",
    help="Ask a running worker instead (host:port, http://host:port or https://host:port of "
    "its web server; several, comma-separated, are tried in turn): the read is routed to the "
    "key's owner.",
)
@click.option(
    "--ca-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="STREAMJOIN_QUERY_CA_FILE",
    help="With --remote: verify the workers' HTTPS certificates against this CA (PEM); "
    "host:port then means https (env STREAMJOIN_QUERY_CA_FILE; default for https:// hosts: "
    "the system's CAs).",
)
@click.option(
    "--cert-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="STREAMJOIN_QUERY_CERT_FILE",
    help="With --remote: this client's certificate (PEM), for workers that want one "
    "(mutual TLS; with --key-file).",
)
@click.option(
    "--key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="STREAMJOIN_QUERY_KEY_FILE",
    help="With --remote: the private key (PEM) of --cert-file.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="With --remote: do NOT verify the workers' certificates (says so on stderr; for a "
    "test set-up, never production).",
)
@click.option(
    "--token",
    default=None,
    envvar="STREAMJOIN_QUERY_TOKEN",
    help="With --remote: the workers' query token (env STREAMJOIN_QUERY_TOKEN).",
)
@click.option(
    "--allow-stale", is_flag=True, help="With --remote: a standby may answer (with its lag)."
)
@click.option("--from", "from_ms", type=int, default=None, help="Windows starting at/after (ms).")
@click.option("--to", "to_ms", type=int, default=None, help="Windows starting at/before (ms).")
@click.argument("table_name", metavar="TABLE")
@click.argument("key")
def table_get(
    app_spec: str | None,
    state_dir: Path | None,
    remote: str | None,
    ca_file: Path | None,
    cert_file: Path | None,
    key_file: Path | None,
    insecure: bool,
    token: str | None,
    allow_stale: bool,
    from_ms: int | None,
    to_ms: int | None,
    table_name: str,
    key: str,
) -> None:
    """Print the value of KEY in TABLE (as JSON), from local state or (--remote) a worker.

    KEY is parsed for the table's key codec: taken as is for str/raw keys,
    as JSON otherwise. For a windowed table, prints the key's windows,
    oldest first, as a JSON list of {"start", "end", "value"} (times in
    ms since the epoch). Exit code 1 when the key is not there.
    """
    import json

    if remote is not None:
        tls = _RemoteTLS(ca_file, cert_file, key_file, insecure)
        _remote_get(remote, token, tls, table_name, key, allow_stale, from_ms, to_ms)
        return
    if app_spec is None:
        raise click.UsageError("give -A MODULE:APP (local state) or --remote URL")

    from streamjoin.state.inspect import parse_key, read_value, read_windows
    from streamjoin.windowed import WindowedTable

    app = _load(app_spec, None)
    if table_name not in app.tables:
        raise click.ClickException(
            f"app {app.id!r} has no table {table_name!r} "
            f"(tables: {', '.join(app.tables) or 'none'})"
        )
    table = app.tables[table_name]
    root = state_dir or app.config.state_path
    parsed = parse_key(table, key)
    try:
        if isinstance(table, WindowedTable) and table.windows is not None:
            partition, windows = read_windows(root, table, parsed, table.windows)
            value: object = [
                {"start": s, "end": e, "value": v}
                for s, e, v in windows
                if (from_ms is None or s >= from_ms) and (to_ms is None or s <= to_ms)
            ]
        else:
            partition, value = read_value(root, table, parsed)
    except KeyError:
        what = "has no windows in" if isinstance(table, WindowedTable) else "is not in"
        click.echo(f"{key!r} {what} the local state of table {table_name!r}", err=True)
        raise SystemExit(1) from None
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(value, default=str))
    click.echo(f"(partition {partition})", err=True)


@dataclass(frozen=True)
class _RemoteTLS:
    """``table get --remote``'s TLS options."""

    ca_file: Path | None
    cert_file: Path | None
    key_file: Path | None
    insecure: bool


def _remote_get(
    remote: str,
    token: str | None,
    tls: _RemoteTLS,
    table_name: str,
    key: str,
    allow_stale: bool,
    from_ms: int | None,
    to_ms: int | None,
) -> None:
    """``table get --remote``: the same output as a local read, through the workers."""
    import json

    from streamjoin.errors import KeyNotFound, QueryError
    from streamjoin.query import TableClient

    try:  # (with --insecure, the client logs a warning: on stderr here)
        client = TableClient(
            remote.split(","),
            token=token,
            ca_file=tls.ca_file,
            cert_file=tls.cert_file,
            key_file=tls.key_file,
            insecure=tls.insecure,
        )
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        answer = client.get(table_name, key, from_ms=from_ms, to_ms=to_ms, allow_stale=allow_stale)
    except KeyNotFound as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    except QueryError as exc:
        raise click.ClickException(str(exc)) from exc
    value = answer["windows"] if "windows" in answer else answer.get("value")
    click.echo(json.dumps(value))
    stale = f", stale by {answer['lag']} records" if answer.get("stale") else ""
    click.echo(
        f"(partition {answer.get('partition')}, served by {answer.get('served_by')}{stale})",
        err=True,
    )


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
