"""``@app.command`` and ``streamjoin -A module:app ...``: declarations, the group's ``-A``,
the app's commands in ``--help``, name clashes; ``app.producing()`` refusals (no broker)."""

from __future__ import annotations

import itertools
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import streamjoin
from streamjoin.app_commands import CommandContext
from streamjoin.cli import cli
from streamjoin.errors import ArgumentTypeError, ConfigurationError, LifecycleError

_names = itertools.count()


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """``app_module(source)`` -> the ``-A`` spec of a module holding ``source``."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def make(source: str) -> str:
        name = f"sj_commands_app_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        made.append(name)
        return f"{name}:app"

    yield make
    for name in made:
        sys.modules.pop(name, None)


APP = """
    import click
    import streamjoin

    app = streamjoin.App("commands-test")
    orders = app.topic("orders")

    @app.command(click.option("--n", type=int, default=1), click.argument("who"))
    def hello(who, n):
        \"\"\"Say hello to WHO, n times.\"\"\"
        for _ in range(n):
            click.echo(f"hello {who}")

    @app.command(name="count-up")
    @click.option("--to", type=int, required=True)
    async def count(to):
        for i in range(to):
            click.echo(i)

    @app.command(click.option("--text"))
    async def shout(self, text):
        self.say(text.upper(), "from", self.app.id)

    @app.command()
    def refuse():
        raise streamjoin.errors.LifecycleError("not now")
"""


def test_a_command_gets_its_options_and_arguments(app_module: Callable[[str], str]) -> None:
    spec = app_module(APP)
    result = CliRunner().invoke(cli, ["-A", spec, "hello", "--n", "2", "ann"])
    assert result.exit_code == 0, result.output
    assert result.output == "hello ann\nhello ann\n"


def test_async_commands_run_in_an_event_loop_with_stacked_click_options(
    app_module: Callable[[str], str],
) -> None:
    spec = app_module(APP)
    result = CliRunner().invoke(cli, ["-A", spec, "count-up", "--to", "3"])
    assert result.exit_code == 0, result.output
    assert result.output == "0\n1\n2\n"


def test_fausts_self_parameter_gets_a_command_context(app_module: Callable[[str], str]) -> None:
    spec = app_module(APP)
    result = CliRunner().invoke(cli, ["-A", spec, "shout", "--text", "hi"])
    assert result.exit_code == 0, result.output
    assert result.output == "HI from commands-test\n"


def test_a_streamjoin_error_in_a_command_is_one_line(app_module: Callable[[str], str]) -> None:
    result = CliRunner().invoke(cli, ["-A", app_module(APP), "refuse"])
    assert result.exit_code == 1
    assert result.output == "Error: LifecycleError: not now\n"


def test_help_lists_the_apps_commands_apart(app_module: Callable[[str], str]) -> None:
    spec = app_module(APP)
    result = CliRunner().invoke(cli, ["-A", spec, "--help"])
    assert result.exit_code == 0, result.output
    builtins, _, own = result.output.partition(f"Commands of {spec}:")
    assert "worker" in builtins and "hello" not in builtins
    assert "hello" in own and "Say hello to WHO" in own and "count-up" in own
    assert "worker" not in own
    plain = CliRunner().invoke(cli, ["--help"])
    assert "Commands of" not in plain.output and "hello" not in plain.output


def test_app_commands_exist_only_with_a_leading_a(app_module: Callable[[str], str]) -> None:
    app_module(APP)
    result = CliRunner().invoke(cli, ["hello", "ann"])
    assert result.exit_code == 2
    assert "No such command 'hello'" in result.output


AGENT = """
    @app.agent(orders)
    async def route(stream):
        async for event in stream:
            pass
"""


def test_a_leading_a_is_the_default_of_the_subcommands_a(app_module: Callable[[str], str]) -> None:
    spec = app_module(APP + AGENT)
    result = CliRunner().invoke(cli, ["-A", spec, "agents"])
    assert result.exit_code == 0, result.output
    assert "route" in result.output and "orders" in result.output
    missing = CliRunner().invoke(cli, ["agents"])
    assert missing.exit_code == 2 and "Missing option '-A'" in missing.output


def test_a_command_named_like_a_builtin_is_refused_whatever_runs(
    app_module: Callable[[str], str],
) -> None:
    spec = app_module(
        """
        import streamjoin

        app = streamjoin.App("clash")

        @app.command()
        def worker():
            pass
        """
    )
    for args in (["--help"], ["agents"], ["worker"]):
        result = CliRunner().invoke(cli, ["-A", spec, *args])
        assert result.exit_code == 2, result.output
        assert "declares a command 'worker'" in result.output
        assert "@app.command(..., name=...)" in result.output


def test_a_bad_leading_a_cannot_start(app_module: Callable[[str], str]) -> None:
    result = CliRunner().invoke(cli, ["-A", "no_such_module_for_commands:app", "hello"])
    assert result.exit_code == 3
    assert "was not found" in result.output


# -- declarations ------------------------------------------------------------------------


def test_declared_commands_keep_their_parameters_in_order() -> None:
    app = streamjoin.App("declared")

    @app.command(click.option("--a"), click.option("--b"), help="Both.")
    @click.option("--c")
    @click.option("--d")
    def both(a: str, b: str, c: str, d: str) -> None: ...

    @app.command
    async def bare() -> None: ...

    command = app.commands["both"]
    assert [p.name for p in command.params] == ["a", "b", "c", "d"]
    assert command.help == "Both." and not command.takes_self
    assert "bare" in app.commands
    assert both.__name__ == "both"  # the function is returned as it is


def test_command_names_come_from_the_function_or_name() -> None:
    app = streamjoin.App("names")

    @app.command()
    def load_orders() -> None: ...

    @app.command(name="fill")
    def anything() -> None: ...

    assert sorted(app.commands) == ["fill", "load-orders"]
    with pytest.raises(ConfigurationError, match="command 'fill' declared twice"):

        @app.command(name="fill")
        def again() -> None: ...


def test_a_parameter_no_option_fills_is_refused() -> None:
    app = streamjoin.App("unfilled")
    with pytest.raises(ConfigurationError, match=r"no option or argument gives .* parameter n"):

        @app.command(click.option("--m"))
        def f(m: str, n: int) -> None: ...

    with pytest.raises(ConfigurationError, match="has no parameter m"):

        @app.command(click.option("--m"))
        def g() -> None: ...

    @app.command(click.option("--m"), click.option("--k"))
    def takes_all(**options: str) -> None: ...


def test_only_click_parameters_are_taken() -> None:
    app = streamjoin.App("not-click")
    with pytest.raises(ArgumentTypeError, match="name goes in name="):
        app.command("load")
    with pytest.raises(ArgumentTypeError, match=r"takes click\.option"):
        app.command(42)
    with pytest.raises(ArgumentTypeError, match=r"takes click\.option"):
        app.command(lambda f: f, lambda f: f)


def test_command_context_says_and_carps(capsys: pytest.CaptureFixture[str]) -> None:
    context = CommandContext(streamjoin.App("ctx"))
    context.say("a", 1)
    context.carp("b")
    out, err = capsys.readouterr()
    assert (out, err) == ("a 1\n", "b\n")


async def test_producing_is_refused_while_producing_or_running() -> None:
    app = streamjoin.App("busy")
    app._producing = True  # as inside `async with app.producing():`
    with pytest.raises(LifecycleError, match="already producing"):
        async with app.producing():
            pass
    with pytest.raises(LifecycleError, match="is producing"):
        await app.start()
