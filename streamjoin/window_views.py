"""Faust's way of reading a windowed table: time-relative views and window sets.

``table.relative_to_now()``, ``table.relative_to_stream()`` and
``table.relative_to_field(field)`` return a :class:`WindowedView`; ``view[key]`` is a
:class:`WindowSet`, whose methods read the value of ``key`` in one window, chosen by a
time, as in Faust:

* ``.value()``: the window of the view's time: the partition's stream time
  (``relative_to_now``; the wall clock outside agents), the event's time
  (``relative_to_stream``) or the time in one of the event's fields (``relative_to_field``);
* ``.current()``: the window of the event's time (the one ``table[key]`` reads);
* ``.now()``: the earliest window still holding the partition's stream time (the wall
  clock outside agents);
* ``.delta(d)``: the window of the event's time minus ``d`` (a timedelta, or seconds as in
  Faust), e.g. the same window a day ago.

"The window of" a time is the latest-starting one holding it (the only one for tumbling
windows). Inside agents they read the current event's partition, like ``table[key]``;
outside agents, the partition of ``key`` (``.now()``, and ``.value()`` of a
``relative_to_now`` view, which need no event). A window without a value for the key
gives the table's ``default()``, or raises KeyError. Views only read: write with
``table[key]`` and ``table.update``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from streamjoin.codecs import Codec
from streamjoin.context import current_event
from streamjoin.errors import ConfigurationError, TableAccessError
from streamjoin.events import Event, RawRecord
from streamjoin.state.window_layout import table_data_key
from streamjoin.state.window_partition import WindowPartition
from streamjoin.state.windows import WindowSpec

__all__ = [
    "WindowSet",
    "WindowedView",
    "relative_to_field",
    "relative_to_now",
    "relative_to_stream",
]


class ViewedTable(Protocol):
    """What a view reads of a :class:`~streamjoin.windowed.WindowedTable` (not imported
    here: the table imports this module)."""

    @property
    def name(self) -> str: ...

    @property
    def default(self) -> Callable[[], Any] | None: ...

    def _spec(self) -> WindowSpec: ...

    def _encode_key(self, key: Any) -> bytes: ...

    def _load_value(self, raw: bytes) -> Any: ...

    @property
    def value_codec(self) -> Codec: ...

    def _event_partition(self) -> WindowPartition: ...

    def windows_of(self, key: Any, from_ms: int, to_ms: int) -> list[tuple[int, Any]]: ...


#: what ``relative_to_field`` reads the time from: a field name of the event's value
#: (attribute, or key of a mapping), or a function of the event; the time is an int of ms
#: since the epoch or a datetime (naive ones are taken as UTC)
FieldOrExtractor = str | Callable[[Event], "int | datetime"]
#: a view's time for the current event (None outside agents)
_TimeOf = Callable[["ViewedTable", Event | None], int]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class WindowedView:
    """A windowed table read relative to a time (Faust's ``WindowWrapper``)."""

    __slots__ = ("_time_of", "clock", "relative_to", "table")

    def __init__(
        self,
        table: ViewedTable,
        relative_to: str,
        time_of: _TimeOf,
        clock: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        table._spec()  # (raises, naming the problem, for tables without one window per time)
        self.table = table
        #: "now", "stream" or "field" (for repr and errors)
        self.relative_to = relative_to
        self._time_of = time_of
        #: the wall clock in ms, read outside agents (tests replace it)
        self.clock = clock

    def __repr__(self) -> str:
        return f"<{self.table.name!r} relative to {self.relative_to}>"

    def __getitem__(self, key: Any) -> WindowSet:
        return WindowSet(self, key)

    def time(self, event: Event | None = None) -> int:
        """The view's time for ``event`` (default: the event being processed)."""
        return self._time_of(self.table, event)


class WindowSet:
    """The windows of one key, read as Faust's ``table[key]`` of a windowed table is."""

    __slots__ = ("key", "view")

    def __init__(self, view: WindowedView, key: Any) -> None:
        self.view = view
        self.key = key

    def __repr__(self) -> str:
        return f"<WindowSet {self.key!r} of {self.view!r}>"

    def value(self, event: Event | None = None) -> Any:
        """The value in the window of the view's time (for ``event``, default the current
        one)."""
        return _read(self.view.table, self.key, self.view.time(event), latest=True)

    def current(self, event: Event | None = None) -> Any:
        """The value in the window of the event's time (what ``table[key]`` reads)."""
        return _read(self.view.table, self.key, _event_time(self.view.table, event), latest=True)

    def now(self) -> Any:
        """The value in the earliest window holding the partition's stream time (the wall
        clock outside agents)."""
        table = self.view.table
        return _read(table, self.key, _stream_time(table, self.view.clock), latest=False)

    def delta(self, d: timedelta | float, event: Event | None = None) -> Any:
        """The value in the window of the event's time minus ``d`` (a timedelta, or seconds)."""
        table = self.view.table
        return _read(table, self.key, _event_time(table, event) - _ms(d), latest=True)


def relative_to_now(table: ViewedTable) -> WindowedView:
    """Read windows by the partition's stream time (the wall clock outside agents)."""
    view: WindowedView

    def time_of(table: ViewedTable, event: Event | None) -> int:
        return _stream_time(table, view.clock)

    view = WindowedView(table, "now", time_of)
    return view


def relative_to_stream(table: ViewedTable) -> WindowedView:
    """Read windows by the time of the event being processed (inside agents)."""
    return WindowedView(table, "stream", _event_time)


def relative_to_field(table: ViewedTable, field: FieldOrExtractor) -> WindowedView:
    """Read windows by a time in the event: ``field`` names a field of its value (attribute,
    or key of a mapping), or is a function of the event; the time is an int of ms since the
    epoch or a datetime (naive: UTC)."""
    extract: Callable[[Event], int | datetime]
    if isinstance(field, str):
        name = field

        def from_value(event: Event) -> int | datetime:
            value = event.value
            if isinstance(value, Mapping):
                if name not in value:
                    raise TableAccessError(
                        f"windowed table {table.name!r}: relative_to_field({name!r}): the "
                        f"value of {event.position} has no field {name!r}"
                    )
                found: int | datetime = value[name]
                return found
            try:
                attribute: int | datetime = getattr(value, name)
            except AttributeError:
                raise TableAccessError(
                    f"windowed table {table.name!r}: relative_to_field({name!r}): the "
                    f"value of {event.position} has no field {name!r}"
                ) from None
            return attribute

        extract = from_value
        described = repr(field)
    elif callable(field):
        extract = field
        described = getattr(field, "__name__", repr(field))
    else:
        raise ConfigurationError(
            f"windowed table {table.name!r}: relative_to_field takes a field name or a "
            f"function of the event, got {field!r}"
        )

    def time_of(table: ViewedTable, event: Event | None) -> int:
        event = event if event is not None else _decoded_event(table)
        return _as_ms(table, described, extract(event))

    return WindowedView(table, f"field {described}", time_of)


# ------------------------------------------------------------------ times


def _current_record(table: ViewedTable, what: str) -> RawRecord:
    event = current_event.get()
    if event is None:
        raise TableAccessError(
            f"windowed table {table.name!r}: {what} reads the time of the event being "
            "processed, so it works inside agents only (or pass the event: .value(event))"
        )
    return event.record


def _event_time(table: ViewedTable, event: Event | None = None) -> int:
    """The event's time: the table's ``timestamp=`` extractor's if it has one, else the
    record timestamp (so ``.current()`` reads the window ``table[key]`` does)."""
    extractor: Callable[[Event], int] | None = getattr(table, "timestamp", None)
    if event is not None:
        return extractor(event) if extractor is not None else event.timestamp
    record = _current_record(table, "the event's window")
    if extractor is None:
        return record.timestamp
    return extractor(_decoded_event(table, record))


def _stream_time(table: ViewedTable, clock: Callable[[], int]) -> int:
    """The partition's stream time inside agents (the current event included), else the
    wall clock."""
    if current_event.get() is None:
        return clock()
    part = table._event_partition()
    latest = part.latest
    return clock() if latest is None else latest


def _decoded_event(table: ViewedTable, record: RawRecord | None = None) -> Event:
    """The event being processed, decoded again with its topic's codecs (the table sees the
    record, not the agent's event)."""
    if record is None:
        record = _current_record(table, "relative_to_field")
    topics: Mapping[str, Any] = getattr(table, "topics", {})
    topic = topics.get(record.topic)
    if topic is None:
        raise TableAccessError(
            f"windowed table {table.name!r}: cannot decode the event of {record.position}, "
            "a topic the app does not declare: pass the event, .value(event)"
        )
    key = None if record.key is None else topic.key_codec.loads(record.key)
    value = None if record.value is None else topic.value_codec.loads(record.value)
    return Event(
        key, value, record.topic, record.partition, record.offset, record.timestamp, record.headers
    )


def _as_ms(table: ViewedTable, field: str, value: object) -> int:
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return int(aware.timestamp() * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TableAccessError(
        f"windowed table {table.name!r}: relative_to_field({field}) gave {value!r}; times "
        "are ints of ms since the epoch or datetimes"
    )


def _ms(d: timedelta | float) -> int:
    if isinstance(d, timedelta):
        return d // timedelta(milliseconds=1)
    if isinstance(d, int | float) and not isinstance(d, bool):
        return round(d * 1000)  # seconds, as Faust's delta takes them
    raise ConfigurationError(f"delta takes a timedelta or a number of seconds, got {d!r}")


# ------------------------------------------------------------------ reading


def _read(table: ViewedTable, key: Any, timestamp_ms: int, *, latest: bool) -> Any:
    """The value of ``key`` in the latest (or earliest) window holding ``timestamp_ms``."""
    raw = None
    if timestamp_ms >= 0:
        windows = table._spec().windows_for(timestamp_ms)
        start = windows[-1 if latest else 0][0]
        key_bytes = table._encode_key(key)
        if current_event.get() is not None:
            raw = table._event_partition().view.lookup(table_data_key(key_bytes, start))
        else:
            found = table.windows_of(key, start, start)
            if found:
                return found[0][1]
    if raw is None:
        if table.default is not None:
            return table.default()
        raise KeyError(key)
    return table.value_codec.loads(raw)  # (an aggregation's shows its result, not its state)
