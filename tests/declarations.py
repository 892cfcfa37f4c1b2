"""Declarations hold no run-time state: a fingerprint of every declaration's fields.

A declaration (topic, agent, table, windowed table, join, and the App's collections of
them) is what users write; the running worker keeps every piece of per-partition state in
its tasks. :func:`fingerprint` walks every field of every declaration reachable from an
App, so a test can take one before a run and one after, and compare: any field a run
writes (a counter, a cache, a partition count, a per-partition dict) shows up as a
difference, named by its path.

Only the one door from declarations to the runtime is left out: ``RuntimeLink`` (it is
connected while a worker runs, by design).
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping
from typing import Any

import streamjoin
from streamjoin.context import RuntimeLink
from streamjoin.state.windows import TumblingWindows
from streamjoin.stream import Stream

_ATOMS = (str, bytes, int, float, bool, type(None), enum.Enum)
_OPAQUE = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.ModuleType,
    type,
)


def fields_of(value: object) -> dict[str, Any]:
    """Every attribute ``value`` holds: slots, a mypyc-compiled class's attributes
    (``__mypyc_attrs__``: no ``__dict__``) and its ``__dict__``."""
    out: dict[str, Any] = {}
    for cls in type(value).__mro__:
        for slot in (*getattr(cls, "__slots__", ()), *getattr(cls, "__mypyc_attrs__", ())):
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                out[slot] = getattr(value, slot)
    out.update(getattr(value, "__dict__", {}))
    return out


def _walk(value: object, path: str, seen: dict[int, str], out: dict[str, object]) -> None:
    if isinstance(value, _ATOMS):
        out[path] = value
        return
    if isinstance(value, RuntimeLink):
        out[path] = "<runtime link>"
        return
    if isinstance(value, _OPAQUE):
        out[path] = ("opaque", id(value))
        return
    if id(value) in seen:
        out[path] = ("same as", seen[id(value)])
        return
    seen[id(value)] = path
    if isinstance(value, Mapping):
        out[path] = (type(value).__name__, len(value))
        for key, item in value.items():
            _walk(item, f"{path}[{key!r}]", seen, out)
    elif isinstance(value, (list, tuple)):
        out[path] = (type(value).__name__, len(value))
        for i, item in enumerate(value):
            _walk(item, f"{path}[{i}]", seen, out)
    elif isinstance(value, (set, frozenset)):
        out[path] = (type(value).__name__, tuple(sorted(repr(v) for v in value)))
    else:
        fields = fields_of(value)
        out[path] = (type(value).__qualname__, tuple(sorted(fields)))
        for name, item in fields.items():
            _walk(item, f"{path}.{name}", seen, out)


def fingerprint(app: streamjoin.App) -> dict[str, object]:
    """Every field of every declaration of ``app`` (topics, agents, tables, joins), by path."""
    out: dict[str, object] = {}
    seen: dict[int, str] = {}
    kinds = {kind: dict(getattr(app, kind)) for kind in ("topics", "agents", "tables", "joins")}
    for kind, declarations in kinds.items():  # (all alive meanwhile: ids are not reused)
        _walk(declarations, kind, seen, out)
    return out


def differences(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """The paths whose value a run changed, added or removed, sorted."""
    return sorted(
        f"{path}: {before.get(path, '<absent>')!r} -> {after.get(path, '<absent>')!r}"
        for path in before.keys() | after.keys()
        if before.get(path, "<absent>") != after.get(path, "<absent>")
    )


def every_kind_app(app_id: str, prefix: str = "", **settings: Any) -> streamjoin.App:
    """Topics without partition counts, a table, a windowed table, a stream-stream join and
    a stream-table join: every kind of declaration a run could write state into."""
    app = streamjoin.App(app_id, topic_partitions=2, **settings)
    clicks = app.topic(f"{prefix}clicks", key_serializer="str")
    views = app.topic(f"{prefix}views", key_serializer="str")
    ads = app.topic_table(app.topic(f"{prefix}ads", key_serializer="str"))
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=clicks)
    per_second = app.table(
        "per-second",
        default=int,
        key_serializer="str",
        window=TumblingWindows(size_ms=1_000, retention_ms=2_000),
        copartitioned_with=views,
    )

    @app.join(
        clicks,
        views,
        window=1_000,
        name="click-view",
        output=app.topic(f"{prefix}click-view", key_serializer="str"),
        how="left",
    )
    def click_view(key: object, click: object, view: object) -> object:
        return {"click": click, "view": view}

    @app.join(
        views, ads, name="view-ad", output=app.topic(f"{prefix}view-ad", key_serializer="str")
    )
    def view_ad(key: object, view: object, ad: object) -> object:
        return {"view": view, "ad": ad}

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1

    @app.agent(views)
    async def window_count(stream: Stream) -> None:
        async for event in stream:
            per_second[event.key] += 1

    return app
