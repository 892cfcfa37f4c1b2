"""Aggregators: what ``app.aggregate`` computes per key and window (pure, no I/O).

An aggregator is a value with four pure functions over a *state*:

* ``initial()`` -> the state of an empty window;
* ``add(state, value)`` -> the state after one more record's value;
* ``merge(a, b)`` -> the state of two windows made one (sessions bridged by a record;
  ``a`` is the earlier window, ``b`` the later);
* ``result(state)`` -> what users see: the table's value, the result topic's value.

States are plain JSON values (numbers, lists, dicts; never None), because the table's
changelog holds them: a restored or moved partition carries on from exactly where the
last owner stopped. Every function returns a new state and never changes the one it was
given, so the same arithmetic runs in a worker, in a test's brute-force model and in a
batch job (the Spark twin) and gives the same answers.

``field`` picks what an aggregator reads from a record's value: a key of a dict value or
an attribute name (a string), a function of the value, or None for the value itself.
A value without the field is a :class:`~streamjoin.errors.DecodeError` (a record of the
wrong shape: the agent's ``on_error`` policy applies).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from streamjoin.errors import ConfigurationError, DecodeError, EncodeError

__all__ = [
    "Aggregator",
    "Collect",
    "Combined",
    "Count",
    "Field",
    "Latest",
    "Max",
    "Mean",
    "Min",
    "Reduce",
    "StateCodec",
    "Sum",
    "aggregator_of",
]

#: what an aggregator reads from a value: a dict key or attribute name, a function, or
#: None (the value itself)
Field = str | Callable[[Any], Any] | None


@runtime_checkable
class Aggregator(Protocol):
    """The four pure functions ``app.aggregate`` applies (see the module docstring)."""

    def initial(self) -> Any: ...

    def add(self, state: Any, value: Any) -> Any: ...

    def merge(self, a: Any, b: Any) -> Any: ...

    def result(self, state: Any) -> Any: ...

    @property
    def mergeable(self) -> bool:
        """Whether :meth:`merge` is defined (session windows need it)."""


def _picker(what: Field, owner: str) -> Callable[[Any], Any]:
    """The function reading ``what`` from a value."""
    if what is None:
        return _identity
    if callable(what):
        return what
    if not isinstance(what, str) or not what:
        raise ConfigurationError(
            f"{owner}: field must be a dict key or attribute name (a non-empty str), a "
            f"function of the value, or None (the value itself); got {what!r}"
        )
    name = what

    def pick(value: Any) -> Any:
        if isinstance(value, Mapping):
            try:
                return value[name]
            except KeyError:
                raise DecodeError(
                    f"{owner}: the value {_preview(value)} has no key {name!r}"
                ) from None
        try:
            return getattr(value, name)
        except AttributeError:
            raise DecodeError(
                f"{owner}: the value {_preview(value)} has no attribute {name!r}"
            ) from None

    return pick


def _identity(value: Any) -> Any:
    return value


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _field_repr(what: Field) -> str:
    if what is None:
        return ""
    if isinstance(what, str):
        return repr(what)
    return getattr(what, "__name__", repr(what))


def _number(value: Any, owner: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DecodeError(f"{owner}: expected a number, got {_preview(value)}")
    return value


class _Picking:
    """An aggregator reading ``field`` of each value (equal when of one kind and field)."""

    __slots__ = ("_pick", "field")

    def __init__(self, field: Field = None) -> None:
        self.field = field
        self._pick = _picker(field, f"{type(self).__name__}({field!r})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_field_repr(self.field)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.field == self.field

    def __hash__(self) -> int:
        return hash((type(self), id(self.field) if callable(self.field) else self.field))

    @property
    def mergeable(self) -> bool:
        return True


class Count:
    """How many records: state and result are the count."""

    __slots__ = ()

    def initial(self) -> int:
        return 0

    def add(self, state: int, value: Any) -> int:
        return state + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, state: int) -> int:
        return state

    @property
    def mergeable(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "Count()"

    def __eq__(self, other: object) -> bool:
        return type(other) is Count

    def __hash__(self) -> int:
        return hash(Count)


class Sum(_Picking):
    """The sum of a numeric field (0 for an empty window)."""

    __slots__ = ()

    def initial(self) -> int | float:
        return 0

    def add(self, state: int | float, value: Any) -> int | float:
        return state + _number(self._pick(value), repr(self))

    def merge(self, a: int | float, b: int | float) -> int | float:
        return a + b

    def result(self, state: int | float) -> int | float:
        return state


class _Extreme(_Picking):
    """Min and Max: the state is ``[]`` or ``[extreme]``; each writes its own ``add`` (the
    one comparison, inline: it runs per record)."""

    __slots__ = ()
    _extreme: Callable[[Any, Any], Any]  #: builtin min or max, for merging

    def initial(self) -> list[Any]:
        return []

    def _incomparable(self, picked: Any, current: Any) -> DecodeError:
        return DecodeError(f"{self!r}: cannot compare {_preview(picked)} with {_preview(current)}")

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        if not a or not b:
            return a or b
        return [self._extreme(a[0], b[0])]

    def result(self, state: list[Any]) -> Any:
        return state[0] if state else None


class Min(_Extreme):
    """The smallest value of a field (None for an empty window). State: ``[]`` or ``[min]``."""

    __slots__ = ()
    _extreme = staticmethod(min)

    def add(self, state: list[Any], value: Any) -> list[Any]:
        picked = self._pick(value)
        try:
            return [picked] if not state or picked < state[0] else state
        except TypeError:
            raise self._incomparable(picked, state[0]) from None


class Max(_Extreme):
    """The largest value of a field (None for an empty window). State: ``[]`` or ``[max]``."""

    __slots__ = ()
    _extreme = staticmethod(max)

    def add(self, state: list[Any], value: Any) -> list[Any]:
        picked = self._pick(value)
        try:
            return [picked] if not state or picked > state[0] else state
        except TypeError:
            raise self._incomparable(picked, state[0]) from None


class Mean(_Picking):
    """The arithmetic mean of a numeric field (None for an empty window).

    State: ``[sum, count]``, so windows merge exactly and the changelog holds no rounded
    mean."""

    __slots__ = ()

    def initial(self) -> list[int | float]:
        return [0, 0]

    def add(self, state: list[int | float], value: Any) -> list[int | float]:
        return [state[0] + _number(self._pick(value), repr(self)), state[1] + 1]

    def merge(self, a: list[int | float], b: list[int | float]) -> list[int | float]:
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, state: list[int | float]) -> float | None:
        return state[0] / state[1] if state[1] else None


class Latest(_Picking):
    """The field of the record processed last (None for an empty window).

    "Last" is processing order, as Kafka Streams' ``reduce((a, b) -> b)``; two merged
    sessions keep the later session's. State: ``[]`` or ``[value]``."""

    __slots__ = ()

    def initial(self) -> list[Any]:
        return []

    def add(self, state: list[Any], value: Any) -> list[Any]:
        return [self._pick(value)]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return b or a

    def result(self, state: list[Any]) -> Any:
        return state[0] if state else None


class Collect(_Picking):
    """Every value of a field, in processing order (merged sessions: the earlier one's
    first). The whole list is the window's state: keep windows small."""

    __slots__ = ()

    def initial(self) -> list[Any]:
        return []

    def add(self, state: list[Any], value: Any) -> list[Any]:
        return [*state, self._pick(value)]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [*a, *b]

    def result(self, state: list[Any]) -> list[Any]:
        return list(state)


class Reduce:
    """A user fold: ``fn(accumulated, field)`` from ``initial``.

    ``initial`` and every accumulated value must be JSON values (the changelog holds
    them), and ``fn`` must not change its arguments. Session windows also need
    ``merge(a, b)``: how two accumulated values become one; without it, declaring
    the aggregation over session windows is a ConfigurationError.
    """

    __slots__ = ("_initial_json", "_pick", "field", "fn", "merge_fn")

    def __init__(
        self,
        fn: Callable[[Any, Any], Any],
        initial: Any,
        *,
        field: Field = None,
        merge: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(
                f"Reduce: fn must be a function (accumulated, value) -> accumulated, got {fn!r}"
            )
        if merge is not None and not callable(merge):
            raise ConfigurationError(
                f"Reduce: merge must be a function (a, b) -> accumulated, got {merge!r}"
            )
        self.fn = fn
        self.field = field
        self.merge_fn = merge
        self._pick = _picker(field, "Reduce")
        if initial is None:
            raise ConfigurationError(
                "Reduce: initial must be a JSON value other than None (a stored None would "
                "delete the window); use 0, [], {} or a sentinel of your own"
            )
        self._initial_json = _json_text(initial, "Reduce: initial")

    def __repr__(self) -> str:
        return f"Reduce({getattr(self.fn, '__name__', repr(self.fn))})"

    def initial(self) -> Any:
        return json.loads(self._initial_json)  # a fresh copy every time

    def add(self, state: Any, value: Any) -> Any:
        accumulated = self.fn(state, self._pick(value))
        if accumulated is None:
            raise ConfigurationError(
                f"{self!r}: fn returned None; the accumulated value is stored, so it must "
                "be a JSON value other than None (None would delete the window)"
            )
        return accumulated

    def merge(self, a: Any, b: Any) -> Any:
        if self.merge_fn is None:
            raise ConfigurationError(
                f"{self!r} has no merge function: session windows need "
                "Reduce(fn, initial, merge=...)"
            )
        return self.merge_fn(a, b)

    def result(self, state: Any) -> Any:
        return state

    @property
    def mergeable(self) -> bool:
        return self.merge_fn is not None


class Combined:
    """Several aggregators over the same records: ``{"n": Count(), "total": Sum("x")}``.

    State and result are dicts by name (``app.aggregate(agg={...})`` builds one)."""

    __slots__ = ("parts",)

    def __init__(self, parts: Mapping[str, Aggregator]) -> None:
        if not parts:
            raise ConfigurationError("agg={...} needs at least one named aggregator")
        for name, part in parts.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"agg={{...}}: names are non-empty strings, got {name!r}")
            _require_aggregator(part, f"agg[{name!r}]")
        self.parts: dict[str, Aggregator] = dict(parts)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name!r}: {part!r}" for name, part in self.parts.items())
        return f"Combined({{{inner}}})"

    def initial(self) -> dict[str, Any]:
        return {name: part.initial() for name, part in self.parts.items()}

    def add(self, state: dict[str, Any], value: Any) -> dict[str, Any]:
        return {name: part.add(state[name], value) for name, part in self.parts.items()}

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {name: part.merge(a[name], b[name]) for name, part in self.parts.items()}

    def result(self, state: dict[str, Any]) -> dict[str, Any]:
        return {name: part.result(state[name]) for name, part in self.parts.items()}

    @property
    def mergeable(self) -> bool:
        return all(part.mergeable for part in self.parts.values())


def aggregator_of(agg: Aggregator | Mapping[str, Aggregator]) -> Aggregator:
    """``agg`` as one aggregator: a mapping of names to aggregators is :class:`Combined`."""
    if isinstance(agg, Mapping):
        return Combined(agg)
    _require_aggregator(agg, "agg")
    return agg


def _require_aggregator(agg: object, what: str) -> None:
    if isinstance(agg, type):
        raise ConfigurationError(
            f"{what}: got the class {agg.__name__}; pass an instance ({agg.__name__}(...))"
        )
    if not isinstance(agg, Aggregator):
        raise ConfigurationError(
            f"{what} must be an aggregator (Count(), Sum(field), Min, Max, Mean, Latest, "
            f"Collect, Reduce(fn, initial)) or a dict of them, got {agg!r}"
        )


def _json_text(value: Any, what: str) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"{what} must be a JSON value (the changelog holds it), got {_preview(value)}"
        ) from None


class StateCodec:
    """An aggregation table's value codec: stores states, shows results.

    ``dumps(stored)`` is the JSON of what the table stores (what its changelog holds): the
    state, or ``[end, state]`` for session windows (``with_end``), whose ends vary.
    ``loads(raw)`` is the aggregator's *result* of it, so every reader of the table
    (interactive queries, ``windows_of``, ``table[key]``) sees results, while the
    aggregation itself reads what it stored with :meth:`load_state`."""

    __slots__ = ("aggregator", "name", "with_end")

    def __init__(self, aggregator: Aggregator, *, with_end: bool = False) -> None:
        self.aggregator = aggregator
        self.with_end = with_end
        self.name = "aggregate-state"

    def dumps(self, stored: Any) -> bytes | None:
        if stored is None:
            return None
        try:
            return json.dumps(stored, separators=(",", ":")).encode()
        except (TypeError, ValueError):
            raise EncodeError(
                f"{self.aggregator!r}: the state {_preview(stored)} is not a JSON value "
                "(the table's changelog holds states)"
            ) from None

    def load_state(self, raw: bytes) -> Any:
        """What was stored: the state (``[end, state]`` with ``with_end``)."""
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise DecodeError(f"{self.aggregator!r}: a stored state is not JSON: {exc}") from None

    def loads(self, raw: bytes | None) -> Any:
        if raw is None:
            return None
        stored = self.load_state(raw)
        return self.aggregator.result(stored[1] if self.with_end else stored)

    def window_end(self, start: int, raw: bytes, size_ms: int) -> int:
        """The end of the window stored as ``raw`` starting at ``start``."""
        if self.with_end:
            return int(self.load_state(raw)[0])
        return start + size_ms

    def __repr__(self) -> str:
        return f"StateCodec({self.aggregator!r})"
