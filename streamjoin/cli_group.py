"""The ``streamjoin`` command group: ``-A module:app`` before the subcommand, and the
app's own commands (``@app.command``) beside the built-in ones.

``streamjoin -A myproj.app:app worker`` is ``streamjoin worker -A myproj.app:app``
(Faust's habit); ``streamjoin -A myproj.app:app <command>`` runs one of the app's
commands, and ``streamjoin -A myproj.app:app --help`` lists them. Whenever ``-A`` comes
first, the app is loaded before any subcommand runs, so an app command named like a
built-in one is refused at once, whichever command was asked for.
"""

from __future__ import annotations

import click

from streamjoin.app_commands import defined_in
from streamjoin.cli_app import APP_SPEC, _cannot_start
from streamjoin.errors import StreamjoinError
from streamjoin.loader import load_app

#: where the loaded app's click commands are kept, once built
_APP_COMMANDS = "streamjoin.app_commands"


def remember_app_spec(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """``-A`` before the subcommand: kept for the app's commands and the subcommands' ``-A``
    (eager, so that ``streamjoin -A app --help`` lists the app's commands)."""
    if value is not None:
        ctx.meta[APP_SPEC] = value


app_spec_option = click.option(
    "-A",
    "--app",
    metavar="MODULE:APP",
    is_eager=True,
    expose_value=False,
    callback=remember_app_spec,
    help="The App whose commands to add (@app.command), and the -A of the subcommands "
    "(worker, agents, send...), e.g. myproj.app:app. Give it before --help to list the "
    "app's commands.",
)


class AppGroup(click.Group):
    """The built-in subcommands, plus the commands of the app named by ``-A``."""

    def app_commands(self, ctx: click.Context) -> dict[str, click.Command]:
        """The app's commands by name (none without ``-A`` before the subcommand)."""
        spec = ctx.meta.get(APP_SPEC)
        if spec is None:
            return {}
        built: dict[str, click.Command] | None = ctx.meta.get(_APP_COMMANDS)
        if built is None:
            try:
                app = load_app(spec)
            except StreamjoinError as exc:  # AppNotFound, StartupError: cannot start
                raise _cannot_start(str(exc)) from exc
            clashes = sorted(set(app.commands) & set(self.commands))
            if clashes:
                raise click.UsageError(
                    "; ".join(
                        f"app {app.id!r} declares a command {name!r} "
                        f"({defined_in(app.commands[name].function)}), the name of the "
                        f"built-in `streamjoin {name}`: rename it with "
                        "@app.command(..., name=...)"
                        for name in clashes
                    ),
                    ctx,
                )
            built = {name: c.click_command(app) for name, c in app.commands.items()}
            ctx.meta[_APP_COMMANDS] = built
        return built

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *sorted(self.app_commands(ctx))]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        builtin = super().get_command(ctx, cmd_name)
        return builtin if builtin is not None else self.app_commands(ctx).get(cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        self.app_commands(ctx)  # name clashes are refused whichever command runs
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Built-in commands, then the app's under a heading of their own."""
        self._format_section(ctx, formatter, "Commands", dict(self.commands))
        own = self.app_commands(ctx)
        if own:
            self._format_section(ctx, formatter, f"Commands of {ctx.meta[APP_SPEC]}", own)

    @staticmethod
    def _format_section(
        ctx: click.Context,
        formatter: click.HelpFormatter,
        heading: str,
        commands: dict[str, click.Command],
    ) -> None:
        shown = {n: c for n, c in sorted(commands.items()) if not c.hidden}
        if not shown:
            return
        limit = formatter.width - 6 - max(len(n) for n in shown)
        rows = [(name, c.get_short_help_str(limit)) for name, c in shown.items()]
        with formatter.section(heading):
            formatter.write_dl(rows)
