"""``@app.command``: an app's own subcommands of ``streamjoin -A module:app <name>``.

A command is declared with click's parameters, passed to the decorator as Faust's
``app.command`` takes them (``@app.command(click.option("--n", type=int))``; click's
decorators stacked under it work too). The function gets their values as keywords; an
``async def`` runs in an event loop of its own. Nothing runs at declaration: the CLI
(``streamjoin.cli_group``) builds the click commands when ``-A`` names the app, and
refuses a name a built-in subcommand has.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import click

from streamjoin.errors import ArgumentTypeError, ConfigurationError, StreamjoinError

C = TypeVar("C", bound=Callable[..., Any])
#: what ``click.option(...)`` and ``click.argument(...)`` return
ParameterDecorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class CommandContext:
    """What a command declared Faust's way, ``def f(self, ...)``, gets as ``self``: the
    app, and ``say``/``carp`` to print to stdout/stderr."""

    def __init__(self, app: Any) -> None:
        #: the :class:`~streamjoin.App` (typed Any here: this module is below the App)
        self.app: Any = app

    def say(self, *parts: object) -> None:
        click.echo(" ".join(str(p) for p in parts))

    def carp(self, *parts: object) -> None:
        click.echo(" ".join(str(p) for p in parts), err=True)


@dataclass(frozen=True)
class AppCommand:
    """One ``@app.command``: its name, function, click parameters and help."""

    name: str
    function: Callable[..., Any]
    params: tuple[click.Parameter, ...]
    help: str | None
    #: Faust's signature: a first parameter named ``self`` gets a :class:`CommandContext`
    takes_self: bool

    def click_command(self, app: Any) -> click.Command:
        """The subcommand that runs this command's function for ``app``."""

        def run(**values: Any) -> None:
            args = (CommandContext(app),) if self.takes_self else ()
            try:
                result = self.function(*args, **values)
                if inspect.isawaitable(result):
                    asyncio.run(_awaited(result))
            except StreamjoinError as exc:  # said as one line, like the built-in commands
                raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc

        return click.Command(self.name, params=list(self.params), callback=run, help=self.help)


async def _awaited(result: Any) -> None:
    await result


def _is_parameter_decorator(obj: object) -> bool:
    return callable(obj) and getattr(obj, "__module__", "").split(".")[0] == "click"


def _parameters_of(decorators: Sequence[object], where: str) -> list[click.Parameter]:
    """The click parameters ``decorators`` declare, in the order given."""

    def holder() -> None: ...

    params: list[click.Parameter] = []
    for decorate in decorators:
        if isinstance(decorate, str):
            raise ArgumentTypeError(
                f"{where}: got {decorate!r}; a command's name goes in name=, its options "
                "are click.option(...) and click.argument(...)"
            )
        if not _is_parameter_decorator(decorate):
            raise ArgumentTypeError(
                f"{where} takes click.option(...) and click.argument(...), got {decorate!r}"
            )
        decorate(holder)  # type: ignore[operator]
        found: list[click.Parameter] = getattr(holder, "__click_params__", [])
        if len(found) != len(params) + 1:
            raise ArgumentTypeError(f"{where}: {decorate!r} declares no click parameter")
        params.append(found[-1])
    return params


def _check_signature(
    name: str, function: Callable[..., Any], params: list[click.Parameter]
) -> bool:
    """Whether the function takes Faust's ``self`` first; refuses parameters that no click
    parameter fills and click parameters the function does not take."""
    signature = inspect.signature(function)
    given = {p.name for p in params if p.expose_value and p.name}
    takes_self = next(iter(signature.parameters), None) == "self" and "self" not in given
    own = [p for p in signature.parameters.values() if not (takes_self and p.name == "self")]
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own):
        names = {p.name for p in own}
        extra = sorted(given - names)
        if extra:
            raise ConfigurationError(
                f"command {name!r}: {function.__qualname__}() has no parameter "
                f"{', '.join(extra)} for its option or argument of that name"
            )
    unfilled = sorted(
        p.name
        for p in own
        if p.name not in given
        and p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    )
    if unfilled:
        raise ConfigurationError(
            f"command {name!r}: no option or argument gives {function.__qualname__}()'s "
            f"parameter {', '.join(unfilled)} (declare click.option(...) for it, or give it "
            "a default)"
        )
    return takes_self


def command_decorator(
    commands: dict[str, AppCommand],
    options: tuple[object, ...],
    name: str | None,
    help: str | None,
) -> Any:
    """``@app.command(...)``: checks the command and records it in ``commands`` (the
    function is returned unchanged). The options are checked at once; ``@app.command``
    without parentheses on a function is ``@app.command()``."""
    bare = (
        len(options) == 1
        and inspect.isfunction(options[0])
        and not _is_parameter_decorator(options[0])
    )
    given = [] if bare else _parameters_of(options, f"@app.command({name or ''})")

    def register(function: C) -> C:
        if not callable(function):
            raise ArgumentTypeError(f"@app.command decorates a function, got {function!r}")
        command_name = name or function.__name__.replace("_", "-")
        if (
            not command_name
            or command_name.startswith("-")
            or any(c.isspace() for c in command_name)
        ):
            raise ConfigurationError(f"@app.command: {command_name!r} is not a usable name")
        if command_name in commands:
            raise ConfigurationError(
                f"command {command_name!r} declared twice (the second is "
                f"{function.__qualname__}); give one another name=..."
            )
        stacked: list[click.Parameter] = getattr(function, "__click_params__", [])
        params = [*given, *reversed(stacked)]
        takes_self = _check_signature(command_name, function, params)
        commands[command_name] = AppCommand(
            command_name,
            function,
            tuple(params),
            help if help is not None else inspect.getdoc(function),
            takes_self,
        )
        return function

    if bare:
        return register(cast("Callable[..., Any]", options[0]))
    return register


def defined_in(function: Callable[..., Any]) -> str:
    """``file:line`` of a function, for messages."""
    code = getattr(function, "__code__", None)
    if code is None:
        return getattr(function, "__qualname__", repr(function))
    return f"{code.co_filename}:{code.co_firstlineno}"


__all__ = ["AppCommand", "CommandContext", "command_decorator", "defined_in"]
