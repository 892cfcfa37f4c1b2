"""Web views: what ``@app.page`` and ``@app.table_route`` declare (declarations: no runtime).

A :class:`WebView` is a frozen value: the path template (aiohttp's syntax,
``/count/{word}``), the HTTP methods, the user's ``async def view(request, **params)``,
whether the bearer token is asked, and, for a view routed by a table key, which table
and where the key is in the request (:class:`TableRoute`). Everything that can be wrong
with one is found here, when it is declared: a path that is not a template, a path the
worker's own routes use (``/``, ``/status.json``, ``/metrics``, ``/tables/...``,
``/health/...``), a path and method declared twice, a view that is not ``async``, or one
whose arguments the path cannot fill. The worker serves them (``runtime/ops/views.py``;
docs/web.md).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamjoin.errors import ConfigurationError

__all__ = [
    "HTTP_METHODS",
    "RESERVED_PATHS",
    "RESERVED_PREFIXES",
    "ROUTE_ATTRIBUTE",
    "TableRoute",
    "ViewFunction",
    "WebView",
    "attach_route",
    "check_path",
    "declare_view",
    "make_table_route",
    "path_parameters",
    "table_route_of",
]

#: a view: ``async def view(request, **path_params)``; returns an aiohttp response, or
#: anything JSON can carry (sent as ``application/json``)
ViewFunction = Callable[..., Awaitable[Any]]

#: the worker's own routes (runtime/ops/web.py and query_endpoint.py): views may not use them
RESERVED_PATHS = ("/", "/status.json", "/metrics")
#: prefixes of the worker's own routes: table queries and health probes
RESERVED_PREFIXES = ("/tables", "/health")
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

#: one ``{name}`` or ``{name:regex}`` of a path template (a regex may hold ``{m,n}``)
_PARAMETER = re.compile(r"\{([_a-zA-Z][_a-zA-Z0-9]*)(?::[^{}]*(?:\{[^{}]*\}[^{}]*)*)?\}")
_P = inspect.Parameter
#: the attribute ``app.table_route`` leaves on a view function not declared yet
ROUTE_ATTRIBUTE = "__streamjoin_table_route__"


@dataclass(frozen=True)
class TableRoute:
    """Where a routed view's table key is: the path parameter ``match_info`` or the query
    parameter ``query_param`` (exactly one), read as text and parsed by ``table``'s key
    codec as ``GET /tables/<table>/<key>`` parses keys. ``table`` is the declared
    :class:`~streamjoin.tables.Table` (typed loosely: declarations of tables import
    nothing of this module)."""

    table: Any
    match_info: str | None = None
    query_param: str | None = None

    @property
    def where(self) -> str:
        return (
            f"path parameter {{{self.match_info}}}"
            if self.match_info is not None
            else f"query parameter ?{self.query_param}="
        )


@dataclass(frozen=True)
class WebView:
    """One declared page: ``methods`` of ``path`` answered by ``handler``."""

    path: str
    methods: tuple[str, ...]
    handler: ViewFunction
    name: str
    #: the path parameters passed to ``handler`` as keyword arguments (those it takes)
    arguments: tuple[str, ...]
    #: False: the worker's ``query_token`` (when set) is asked, as for table queries
    public: bool = False
    route: TableRoute | None = None


def path_parameters(path: str) -> tuple[str, ...]:
    """The names of ``path``'s ``{parameters}``, in order."""
    return tuple(_PARAMETER.findall(path))


def _shape(path: str) -> str:
    """``path`` with every parameter's name left out: ``/a/{x}`` and ``/a/{y}`` are one route."""
    return _PARAMETER.sub(lambda m: "{" + m.group(0)[len(m.group(1)) + 1 :], path)


def check_path(path: str, where: str) -> str:
    """``path`` if a view may be served there; else a ConfigurationError saying why."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigurationError(f"{where}: the path must be a string starting with '/'")
    bare = path.rstrip("/") or "/"
    if bare in RESERVED_PATHS or any(
        bare == prefix or bare.startswith(prefix + "/") for prefix in RESERVED_PREFIXES
    ):
        raise ConfigurationError(
            f"{where}: {path!r} collides with the worker's own routes ("
            f"{', '.join(RESERVED_PATHS)}, {'/..., '.join(RESERVED_PREFIXES)}/...); pick "
            "another path"
        )
    parameters = path_parameters(path)
    if len(set(parameters)) != len(parameters):
        raise ConfigurationError(f"{where}: a parameter appears twice in {path!r}")
    from aiohttp.web_urldispatcher import DynamicResource, PlainResource

    try:
        if parameters or "{" in path or "}" in path:
            DynamicResource(path)
        else:
            PlainResource(path)
    except (ValueError, re.error) as exc:
        raise ConfigurationError(f"{where}: {path!r} is not a path template: {exc}") from exc
    return path


def _methods(methods: Iterable[str] | str, where: str) -> tuple[str, ...]:
    names = (methods,) if isinstance(methods, str) else tuple(methods)
    upper = tuple(dict.fromkeys(m.upper() for m in names if isinstance(m, str)))
    unknown = [m for m in upper if m not in HTTP_METHODS]
    if not upper or unknown or len(upper) != len(names):
        raise ConfigurationError(
            f"{where}: methods must be HTTP methods ({', '.join(HTTP_METHODS)}), "
            f"each once; got {methods!r}"
        )
    return upper


def _arguments(fun: ViewFunction, parameters: tuple[str, ...], where: str) -> tuple[str, ...]:
    """The path parameters ``fun`` takes as keywords; refuses a function the request and
    the path cannot call."""
    if not inspect.iscoroutinefunction(fun):
        raise ConfigurationError(f"{where}: {fun!r} must be an async function (async def)")
    params = list(inspect.signature(fun).parameters.values())
    if not params or params[0].kind not in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
        raise ConfigurationError(
            f"{where}: {fun.__qualname__} must take the request as its first argument"
        )
    rest = [p for p in params[1:] if p.kind is not _P.VAR_POSITIONAL]
    unfilled = [
        p.name
        for p in rest
        if p.kind is not _P.VAR_KEYWORD
        and p.default is p.empty
        and (p.name not in parameters or p.kind is _P.POSITIONAL_ONLY)
    ]
    if unfilled:
        raise ConfigurationError(
            f"{where}: {fun.__qualname__} takes {', '.join(map(repr, unfilled))}, which the "
            f"path does not fill (its parameters: {', '.join(parameters) or 'none'}); a view "
            "is called with the request and, as keywords, the path parameters it names"
        )
    if any(p.kind is _P.VAR_KEYWORD for p in rest):
        return parameters
    taken = {p.name for p in rest if p.kind is not _P.POSITIONAL_ONLY}
    return tuple(name for name in parameters if name in taken)


def _check_route(route: TableRoute, path: str, parameters: tuple[str, ...], where: str) -> None:
    if route.match_info is not None and route.match_info not in parameters:
        raise ConfigurationError(
            f"{where}: table_route(match_info={route.match_info!r}) names no parameter of "
            f"{path!r} (its parameters: {', '.join(parameters) or 'none'})"
        )


def declare_view(
    path: str,
    fun: ViewFunction,
    *,
    methods: Iterable[str] | str,
    public: bool,
    name: str | None,
    declared: Iterable[WebView],
    route: TableRoute | None,
) -> WebView:
    """The checked declaration of ``fun`` serving ``path`` (``declared``: the app's views
    so far, to refuse a path and method declared twice)."""
    where = f"app.page({path!r})"
    check_path(path, where)
    verbs = _methods(methods, where)
    parameters = path_parameters(path)
    if route is not None:
        _check_route(route, path, parameters, where)
    arguments = _arguments(fun, parameters, where)
    shape = _shape(path)
    for other in declared:
        both = sorted(set(other.methods) & set(verbs))
        if _shape(other.path) == shape and both:
            raise ConfigurationError(
                f"{where}: {'/'.join(both)} {path!r} is declared twice (also by "
                f"{other.name}, as {other.path!r})"
            )
    return WebView(
        path=path,
        methods=verbs,
        handler=fun,
        name=name or f"{fun.__module__}.{fun.__qualname__}",
        arguments=arguments,
        public=bool(public),
        route=route,
    )


def table_route_of(fun: Any) -> TableRoute | None:
    """The route ``app.table_route`` left on ``fun`` (None: not routed)."""
    route = getattr(fun, ROUTE_ATTRIBUTE, None)
    return route if isinstance(route, TableRoute) else None


def make_table_route(
    table: Any, match_info: str | None, query_param: str | None, known: Any
) -> TableRoute:
    """A checked :class:`TableRoute` (``known``: the app's tables by name)."""
    where = "app.table_route"
    name = getattr(table, "name", None)
    if name is None or known.get(name) is not table:
        raise ConfigurationError(
            f"{where}: {table!r} is not a table of this app (global tables need no routing: "
            "every worker holds all of them)"
        )
    if (match_info is None) == (query_param is None):
        raise ConfigurationError(
            f"{where}(table={name!r}): give exactly one of match_info= (a path parameter) "
            "or query_param= (a query parameter), the name the key is read from"
        )
    for value in (match_info, query_param):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigurationError(f"{where}(table={name!r}): {value!r} is not a name")
    return TableRoute(table, match_info=match_info, query_param=query_param)


def attach_route(views: list[WebView], fun: Any, route: TableRoute) -> None:
    """Route ``fun``'s views by ``route``: those declared already (``@app.table_route``
    written above ``@app.page``), in ``views``, and those declared later (below it)."""
    for index, view in enumerate(views):
        if view.handler is fun:
            _check_route(route, view.path, path_parameters(view.path), f"app.page({view.path!r})")
            views[index] = dataclasses.replace(view, route=route)
    setattr(fun, ROUTE_ATTRIBUTE, route)
