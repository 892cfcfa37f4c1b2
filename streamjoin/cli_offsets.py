"""``streamjoin offsets``: show and move a stopped app's committed offsets (skip, reset)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from streamjoin.app import App
from streamjoin.cli_app import _kafka_failure, _load, _table, app_option, broker_option
from streamjoin.errors import ConfigurationError, StreamjoinError

if TYPE_CHECKING:
    from streamjoin.runtime.ops.offset_moves import OffsetMove, PartitionOffsets

T = TypeVar("T")

dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Print what would change; commit nothing."
)


@click.group("offsets")
def offsets_group() -> None:
    """Show or move the app's committed offsets (the group must be stopped to move them).

    A committed offset is the offset of the next record the app reads.
    """


@offsets_group.command("show")
@app_option
@broker_option
@click.option("--topic", "topics", multiple=True, help="Only this topic (repeatable).")
def offsets_show(app_spec: str, broker: str | None, topics: tuple[str, ...]) -> None:
    """Committed offset, end offset and lag of each partition of the app's source topics."""
    from streamjoin.runtime.ops.offset_moves import active_members, read_offsets
    from streamjoin.runtime.transport.access import check_login

    app = _load(app_spec, broker)
    names = list(topics) or _source_topics(app)

    async def show() -> tuple[int, list[PartitionOffsets]]:
        opts = app.config.client_kwargs()
        await check_login(app.config.broker, **opts)
        _, members = await active_members(app.config.broker, app.id, **opts)
        return members, await read_offsets(app.config.broker, app.id, names, **opts)

    members, parts = _run(show())
    status = f"{members} active members" if members else "no active members"
    click.echo(f"group {app.id!r}: {status}")
    rows = [("TOPIC", "PARTITION", "COMMITTED", "END", "LAG")]
    for p in parts:
        committed = "-" if p.committed is None else str(p.committed)
        rows.append((p.topic, str(p.partition), committed, str(p.end), str(p.lag)))
    click.echo(_table(rows))


@offsets_group.command("skip")
@app_option
@broker_option
@click.argument("topic")
@click.argument("partition", type=click.IntRange(min=0))
@click.argument("offset", type=click.IntRange(min=0))
@click.option(
    "--force",
    is_flag=True,
    help="Move even when the group's next record is not OFFSET (skips or replays others).",
)
@dry_run_option
def offsets_skip(
    app_spec: str,
    broker: str | None,
    topic: str,
    partition: int,
    offset: int,
    force: bool,
    dry_run: bool,
) -> None:
    """Skip the record at OFFSET of TOPIC[PARTITION]: commit OFFSET+1 for the app's group.

    Meant for a record that stops every worker (on_error="stop"): the group's next
    record must be OFFSET (where a stopped worker leaves it), or --force.
    """
    from streamjoin.runtime.ops.offset_moves import (
        apply_moves,
        ensure_stopped,
        plan_skip,
        read_offsets,
    )
    from streamjoin.runtime.transport.access import check_login

    app = _load(app_spec, broker)
    opts = app.config.client_kwargs()

    async def skip() -> list[OffsetMove]:
        await check_login(app.config.broker, **opts)  # a refused login: exit 3, named
        await ensure_stopped(app.config.broker, app.id, **opts)
        (current,) = await read_offsets(
            app.config.broker, app.id, [topic], partition=partition, **opts
        )
        moves = [plan_skip(current, offset, force=force)]
        if not dry_run:
            await apply_moves(app.config.broker, app.id, moves, **opts)
        return moves

    _report(app.id, _run(skip()), dry_run)


@offsets_group.command("reset")
@app_option
@broker_option
@click.option("--to-earliest", is_flag=True, help="To each partition's first kept record.")
@click.option("--to-offset", type=click.IntRange(min=0), default=None, help="To this offset.")
@click.option(
    "--to-time",
    default=None,
    metavar="TIME",
    help="To the first record at or after TIME: ISO 8601 (UTC unless given) or epoch ms.",
)
@click.option("--topic", default=None, help="Only this topic (default: every source topic).")
@click.option("--partition", type=click.IntRange(min=0), default=None, help="Only this partition.")
@dry_run_option
def offsets_reset(
    app_spec: str,
    broker: str | None,
    to_earliest: bool,
    to_offset: int | None,
    to_time: str | None,
    topic: str | None,
    partition: int | None,
    dry_run: bool,
) -> None:
    """Move the app's committed offsets: every partition of its source topics, or --topic
    (and --partition). The workers must be stopped."""
    from streamjoin.runtime.ops.offset_moves import (
        ResetTarget,
        apply_moves,
        ensure_stopped,
        offsets_at,
        parse_time,
        plan_reset,
        read_offsets,
    )
    from streamjoin.runtime.transport.access import check_login

    if partition is not None and topic is None:
        raise click.UsageError("--partition needs --topic")
    try:
        target = ResetTarget(
            earliest=to_earliest,
            offset=to_offset,
            time_ms=None if to_time is None else parse_time(to_time),
        )
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    app = _load(app_spec, broker)
    opts = app.config.client_kwargs()
    names = [topic] if topic is not None else _source_topics(app)

    async def reset() -> list[OffsetMove]:
        await check_login(app.config.broker, **opts)  # a refused login: exit 3, named
        await ensure_stopped(app.config.broker, app.id, **opts)
        parts = await read_offsets(app.config.broker, app.id, names, partition=partition, **opts)
        by_time = None
        if target.time_ms is not None:
            by_time = await offsets_at(app.config.broker, parts, target.time_ms, **opts)
        moves = plan_reset(parts, target, by_time)
        if not dry_run:
            await apply_moves(app.config.broker, app.id, moves, **opts)
        return moves

    _report(app.id, _run(reset()), dry_run)


def _source_topics(app: App) -> list[str]:
    names = sorted(app.topology().source_topics)
    if not names:
        raise click.ClickException(f"app {app.id!r} has no agents, so no source topics")
    return names


def _report(group: str, moves: Sequence[OffsetMove], dry_run: bool) -> None:
    changed = 0
    for move in moves:
        click.echo(move.describe())
        changed += move.changes
    if dry_run:
        click.echo(f"dry run: nothing committed ({changed} offsets would change)")
    else:
        click.echo(f"committed {changed} offsets for group {group!r}")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one command's coroutine; streamjoin's errors become one clean CLI error line
    (a refused login or ACL exits 3)."""
    from streamjoin.runtime.transport.access import refusal_of

    try:
        return asyncio.run(coro)
    except Exception as exc:
        if not isinstance(exc, StreamjoinError) and refusal_of(exc) is None:
            raise
        raise _kafka_failure(exc) from exc
