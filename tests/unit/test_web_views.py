"""Web view declarations (streamjoin/web_views.py through ``app.page``/``app.table_route``):
every mistake is a ConfigurationError naming it, when the view is declared."""

from __future__ import annotations

import re
from typing import Any

import pytest

import streamjoin
from streamjoin.errors import ConfigurationError
from streamjoin.web_views import TableRoute, path_parameters


def _app() -> tuple[streamjoin.App, Any]:
    app = streamjoin.App("views")
    source = app.topic("words", key_serializer="str", partitions=4)
    counts = app.table("counts", key_serializer="str", default=int, copartitioned_with=source)
    return app, counts


async def _view(request: Any) -> dict[str, str]:
    return {}


def test_a_page_is_declared_with_its_path_methods_and_the_parameters_it_takes() -> None:
    app, _ = _app()

    @app.page("/count/{word}/{day:\\d{4}-\\d{2}}", methods=["get", "POST"])
    async def count(request: Any, word: str, extra: int = 1) -> dict[str, str]:
        return {"word": word}

    (view,) = app.views
    assert view.path == "/count/{word}/{day:\\d{4}-\\d{2}}"
    assert view.methods == ("GET", "POST")
    assert view.arguments == ("word",)  # day is in match_info only: count does not take it
    assert view.name.endswith("count") and not view.public and view.route is None
    assert count.__name__ == "count"  # the decorator returns the function itself


def test_a_view_taking_keywords_gets_every_path_parameter() -> None:
    app, _ = _app()

    @app.page("/a/{x}/{y}", public=True)
    async def both(request: Any, **params: str) -> dict[str, str]:
        return params

    assert app.views[0].arguments == ("x", "y") and app.views[0].public


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/", "collides with the worker's own routes"),
        ("/metrics", "collides"),
        ("/status.json", "collides"),
        ("/tables/{table}", "collides"),
        ("/health/live", "collides"),
        ("/health", "collides"),
        ("count", "must be a string starting with '/'"),
        ("/count/{word", "is not a path template"),
        ("/a/{x}/{x}", "appears twice"),
    ],
)
def test_paths_that_cannot_be_served_are_refused(path: str, message: str) -> None:
    app, _ = _app()
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        app.page(path)(_view)


def test_a_path_and_method_declared_twice_are_refused_whatever_the_parameter_names() -> None:
    app, _ = _app()
    app.page("/count/{word}")(_view)
    app.page("/count/{word}", methods="POST")(_view)  # another method: fine
    app.page("/healthz")(_view)  # only /health and /health/... are the probes'
    with pytest.raises(ConfigurationError, match=r"GET '/count/\{w\}' is declared twice"):
        app.page("/count/{w}", methods=("GET", "PUT"))(_view)


@pytest.mark.parametrize("methods", [(), ("GET", "get"), ("FETCH",), [1]])
def test_methods_must_be_http_methods_each_once(methods: Any) -> None:
    app, _ = _app()
    with pytest.raises(ConfigurationError, match="methods must be HTTP methods"):
        app.page("/x", methods=methods)(_view)


def test_views_must_be_async_and_callable_with_the_request_and_the_path() -> None:
    app, _ = _app()

    def blocking(request: Any) -> None:
        return None

    async def no_request() -> None:
        return None

    async def wants_more(request: Any, word: str, user: str) -> None:
        return None

    async def positional_only(request: Any, word: str, /) -> None:
        return None

    with pytest.raises(ConfigurationError, match="must be an async function"):
        app.page("/a")(blocking)  # type: ignore[type-var]
    with pytest.raises(ConfigurationError, match="the request as its first argument"):
        app.page("/b")(no_request)
    with pytest.raises(ConfigurationError, match="takes 'user', which the path does not fill"):
        app.page("/c/{word}")(wants_more)
    with pytest.raises(ConfigurationError, match="takes 'word'"):
        app.page("/d/{word}")(positional_only)


def test_table_route_works_above_or_below_page_and_checks_its_key() -> None:
    app, counts = _app()

    @app.page("/count/{word}")
    @app.table_route(counts, match_info="word")
    async def below(request: Any, word: str) -> int:
        return 0

    @app.table_route(counts, query_param="word")
    @app.page("/lookup")
    async def above(request: Any) -> int:
        return 0

    assert [v.route for v in app.views] == [
        TableRoute(counts, match_info="word"),
        TableRoute(counts, query_param="word"),
    ]
    assert TableRoute(counts, match_info="word").where == "path parameter {word}"
    with pytest.raises(ConfigurationError, match=re.escape("names no parameter of '/other/{w}'")):
        app.page("/other/{w}")(below)

    async def plain(request: Any) -> int:
        return 0

    with pytest.raises(ConfigurationError, match="names no parameter of '/plain'"):
        app.table_route(counts, match_info="word")(app.page("/plain")(plain))


def test_table_route_wants_a_table_of_the_app_and_one_place_for_the_key() -> None:
    app, counts = _app()
    _, foreign = _app()
    with pytest.raises(ConfigurationError, match="is not a table of this app"):
        app.table_route(foreign, match_info="w")
    with pytest.raises(ConfigurationError, match=r"exactly one of match_info= .* or query_param="):
        app.table_route(counts)
    with pytest.raises(ConfigurationError, match="exactly one of"):
        app.table_route(counts, match_info="a", query_param="b")
    with pytest.raises(ConfigurationError, match="is not a name"):
        app.table_route(counts, query_param="")


def test_path_parameters_are_read_in_order_regexes_included() -> None:
    assert path_parameters("/a/{x}/b/{y:\\d{1,3}}/{z}") == ("x", "y", "z")
    assert path_parameters("/plain") == ()
