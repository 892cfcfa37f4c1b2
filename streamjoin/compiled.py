"""The per-event modules compiled with mypyc, and the guard that keeps a stale build out.

Profiles put four fifths of a worker's CPU in the interpreter itself (its evaluation loop,
attribute and dict lookups, frames), spread over the modules every event passes through.
``scripts/bootstrap.sh`` compiles the modules in :data:`MODULES` with mypyc (from the same
typed sources, ``mypy --strict`` clean) into extension modules next to their sources,
where Python's import system prefers them to the ``.py`` files. The sources stay the
pure-Python twin: same code, same results, run wherever nothing was compiled.

A compiled module that no longer matches its source would run old code after an edit, so
the build records each source's hash (:data:`MANIFEST`) and this module, imported first
by ``streamjoin/__init__.py``, checks them before anything listed is imported. When a
source changed, the manifest is missing, or ``STREAMJOIN_PURE_PYTHON=1`` is set, a finder
placed first on ``sys.meta_path`` imports every listed module from its source: all or
none, because compiled classes cannot be subclassed by interpreted ones, and the listed
modules subclass each other's classes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Collection, Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = [
    "GROUP",
    "LIBRARY",
    "MANIFEST",
    "MODULES",
    "build_state",
    "compiled_modules",
    "decide",
    "extension_files",
    "recorded_hashes",
    "source_hashes",
    "status",
]

#: the modules compiled together (one mypyc group), in the order of an event's path
MODULES: tuple[str, ...] = (
    "streamjoin.state.keys",
    "streamjoin.state.window_layout",
    "streamjoin.state.table_partition",
    "streamjoin.state.window_partition",
    "streamjoin.quick_partition",
    "streamjoin.quick_codecs",
    "streamjoin.remembered_values",
    "streamjoin.tables",
    "streamjoin.windowed",
    "streamjoin.windowed_aggregation",
    "streamjoin.versioned_tables",
    "streamjoin.ttl_tables",
    "streamjoin.set_tables",
    "streamjoin.runtime.transport.record_scan",
    "streamjoin.decoding",
    "streamjoin.event_batch",
    "streamjoin.topic_tables",
    "streamjoin.joins.enrich",
    "streamjoin.joins.results",
    "streamjoin.runtime.transport.quick_append",
    "streamjoin.quick_sends",
    "streamjoin.runtime.tasks.in_flight",
    "streamjoin.runtime.tasks.offset_ledger",
    "streamjoin.runtime.tasks.acknowledgements",
    "streamjoin.runtime.tasks.actors",
)

#: the mypyc group's name
GROUP = "streamjoin.compiled_group"
#: the group's shared library, a module built with the listed ones
LIBRARY = GROUP + "__mypyc"

_PACKAGE = Path(__file__).resolve().parent
#: written by the build: {"modules": {name: sha1 of its source}}
MANIFEST = _PACKAGE / "compiled-manifest.json"


def source_path(module: str) -> Path:
    """The ``.py`` source of ``module`` (a name in :data:`MODULES`)."""
    parts = module.split(".")
    return _PACKAGE.joinpath(*parts[1:]).with_suffix(".py")


def source_hashes(modules: Sequence[str] = MODULES) -> dict[str, str]:
    """The sha1 of each module's source: what a build is checked against."""
    return {name: hashlib.sha1(source_path(name).read_bytes()).hexdigest() for name in modules}


def decide(
    *, built: bool, complete: bool, pure_asked: bool, recorded: object, current: dict[str, str]
) -> tuple[bool, str]:
    """(whether the compiled modules are used, why), from what is on disk: ``built``, any
    compiled module is there; ``complete``, all of them and the group's library;
    ``recorded``, the manifest's ``modules`` (None when there is none); ``current``, the
    sources' hashes now. The reason is what :func:`status` reports and the worker logs."""
    if not built:
        return False, "pure Python (not compiled: scripts/bootstrap.sh compiles with mypyc)"
    if pure_asked:
        return False, "pure Python (STREAMJOIN_PURE_PYTHON=1)"
    if not isinstance(recorded, dict):
        return False, f"pure Python (no build manifest at {MANIFEST}: run scripts/bootstrap.sh)"
    if set(recorded) != set(current) or not complete:
        return False, "pure Python (the compiled modules are another set: run scripts/bootstrap.sh)"
    changed = sorted(name for name, digest in current.items() if recorded[name] != digest)
    if changed:
        return False, (
            f"pure Python (sources changed since they were compiled: {', '.join(changed)}; "
            "run scripts/bootstrap.sh)"
        )
    return True, f"compiled (mypyc, {len(current)} modules)"


def recorded_hashes() -> object:
    """The manifest's ``modules`` (source hashes of the build), None without one."""
    try:
        return json.loads(MANIFEST.read_text())["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def extension_files() -> dict[str, Path]:
    """Every extension module in the package (a build's, current or left over), by
    module name, the group's library included."""
    found = {}
    for path in _PACKAGE.rglob("*"):
        if path.name.endswith(tuple(EXTENSION_SUFFIXES)):
            relative = path.relative_to(_PACKAGE).with_name(path.name.split(".", 1)[0])
            found[".".join(("streamjoin", *relative.parts))] = path
    return found


def build_state(found: Collection[str], *, pure_asked: bool) -> tuple[bool, str]:
    """:func:`decide` for the extension modules ``found`` in the package and the
    manifest and sources on disk."""
    listed = set(MODULES)
    if not listed & set(found):
        return decide(built=False, complete=False, pure_asked=False, recorded=None, current={})
    return decide(
        built=True,
        complete=listed | {LIBRARY} <= set(found),
        pure_asked=pure_asked,
        recorded=recorded_hashes(),
        current=source_hashes(),
    )


class _Sources:
    """A meta path finder that imports the listed modules from their ``.py`` sources,
    ahead of the compiled extension modules beside them."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.modules or not source_path(fullname).is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


_FOUND = set(extension_files())
_USED, _WHY = build_state(_FOUND, pure_asked=os.environ.get("STREAMJOIN_PURE_PYTHON") == "1")
#: imported from their sources: every module with an extension module beside it, but
#: the listed ones of a build that is used (a left-over module of an older build with
#: another list is never imported compiled)
_FROM_SOURCE = _FOUND - {LIBRARY} - (set(MODULES) if _USED else set())
if _FROM_SOURCE and not any(isinstance(finder, _Sources) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Sources(sorted(_FROM_SOURCE)))


def compiled_modules() -> bool:
    """Whether this process runs the compiled build of :data:`MODULES`."""
    return _USED


def status() -> str:
    """How this process runs :data:`MODULES`: compiled, or pure Python and why."""
    return _WHY
