"""Which tables an agent's own code uses, read from its bytecode, so a table declared
without ``copartitioned_with`` can be co-partitioned with the topics of the agents that
use it (Faust never asked for it: a port should not have to either).

Only what is certain counts: a table the agent function (or a function, generator or
comprehension defined inside it) loads by name as a global or from its closure. A table
reached through a helper function, an attribute or a container is not seen; such a table
still needs ``copartitioned_with=`` (its first use says so).
"""

from __future__ import annotations

import dis
import inspect
from collections.abc import Callable, Iterator, Mapping
from types import CodeType
from typing import Any

#: the instructions that load a name from the module's globals, and from a closure cell
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_CELL_LOADS = frozenset({"LOAD_DEREF", "LOAD_CLASSDEREF"})


def names_used(fun: Callable[..., Any]) -> dict[str, Any]:
    """The objects ``fun`` loads by name, globals and closure cells alike, by name (nested
    code included; a name its closure and the globals both have is the closure's)."""
    fun = inspect.unwrap(fun)
    code = getattr(fun, "__code__", None)
    if not isinstance(code, CodeType):
        return {}
    globals_: Mapping[str, Any] = getattr(fun, "__globals__", {})
    cells: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, getattr(fun, "__closure__", None) or (), strict=False):
        try:
            cells[name] = cell.cell_contents
        except ValueError:  # an empty cell (assigned later in the enclosing function)
            continue
    used: dict[str, Any] = {}
    for code_object in _nested(code):
        for instruction in dis.get_instructions(code_object):
            name = instruction.argval
            if not isinstance(name, str):
                continue
            if instruction.opname in _GLOBAL_LOADS and name in globals_:
                used.setdefault(name, globals_[name])
            elif instruction.opname in _CELL_LOADS and name in cells:
                used[name] = cells[name]
    return used


def _nested(code: CodeType) -> Iterator[CodeType]:
    """``code`` and every code object defined inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _nested(const)


def used_of_kind(fun: Callable[..., Any], kind: type) -> list[Any]:
    """The objects of type ``kind`` that ``fun`` loads by name (each once, in name order)."""
    seen: dict[int, Any] = {}
    for _, value in sorted(names_used(fun).items()):
        if isinstance(value, kind):
            seen.setdefault(id(value), value)
    return list(seen.values())
