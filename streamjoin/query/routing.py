"""Interactive queries, the decisions (pure: no asyncio, no Kafka, no HTTP server).

Everything the ``GET /tables/<table>/<key>`` endpoint decides lives here, so that it
can be tested without a worker:

* :class:`RoutingTable` -- who owns (active) and who follows (standby) each partition
  of each table, built from one description of the group (each member's advertised
  ``host``, its Kafka-level assignment and its standbys), for one generation;
* :func:`parse_key` -- a key's text form (from a URL or a command line) to the exact
  key bytes writes use, through the table's key codec;
* :func:`decide` -- answer here (fresh or stale), forward to the owner, redirect to it,
  or 503 with ``Retry-After``;
* :func:`value_body`, :func:`windows_body`, :func:`error_body` -- the JSON answers.

docs/queries.md describes the rules and the response shape.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgspec

from streamjoin.codecs import Codec
from streamjoin.errors import (
    CodecError,
    QueryError,
    QueryKeyError,
    QueryUnavailable,
    UnknownTableError,
)
from streamjoin.partitioner import partition_for_key

__all__ = [
    "FORWARDED_HEADER",
    "Action",
    "Decision",
    "LocalState",
    "Location",
    "MemberRoute",
    "RoutingTable",
    "decide",
    "error_body",
    "jsonable",
    "parse_flag",
    "parse_key",
    "parse_window_range",
    "require_table",
    "value_body",
    "windows_body",
]

#: set on a request one worker forwards to another: the receiver answers or says 503,
#: it never forwards again (one hop, no loops)
FORWARDED_HEADER = "X-Streamjoin-Forwarded"
#: seconds a client should wait before retrying a 503
DEFAULT_RETRY_AFTER = 1.0


@dataclass(frozen=True)
class Location:
    """Where a key lives: its partition, the host of its active owner (None while no
    member owns it: a rebalance is moving it) and the hosts of its standbys."""

    table: str
    partition: int
    owner: str | None
    standbys: tuple[str, ...] = ()
    #: the generation of the group the answer comes from
    generation: int = -1


@dataclass(frozen=True)
class MemberRoute:
    """One group member as routing needs it: its advertised host, the topic partitions
    it consumes (Kafka-level assignment) and its standby (changelog) partitions."""

    host: str | None
    active: Mapping[str, Sequence[int]] = field(default_factory=dict)
    standby: Mapping[str, Sequence[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class RoutingTable:
    """Owners and standbys of every table partition, for one generation of the group.

    ``sources`` maps a table to the topics whose partition *p* runs in the same task as
    the table's partition *p* (its co-partition group without changelogs): the member
    consuming one of them owns the table partition. ``changelogs`` maps a table to its
    changelog topic, the name standbys are assigned under.
    """

    generation: int
    owners: Mapping[str, Mapping[int, str | None]]
    standbys: Mapping[str, Mapping[int, tuple[str, ...]]]

    @classmethod
    def build(
        cls,
        generation: int,
        members: Iterable[MemberRoute],
        sources: Mapping[str, Iterable[str]],
        changelogs: Mapping[str, str],
    ) -> RoutingTable:
        owners: dict[str, dict[int, str | None]] = {t: {} for t in sources}
        standbys: dict[str, dict[int, list[str]]] = {t: {} for t in sources}
        for member in members:
            if member.host is None:
                continue  # cannot be routed to (no web server, no host setting)
            for table, topics in sources.items():
                for topic in topics:
                    for partition in member.active.get(topic, ()):
                        owners[table][partition] = member.host
                changelog = changelogs.get(table)
                if changelog is not None:
                    for partition in member.standby.get(changelog, ()):
                        standbys[table].setdefault(partition, []).append(member.host)
        return cls(
            generation,
            owners,
            {t: {p: tuple(sorted(hs)) for p, hs in ps.items()} for t, ps in standbys.items()},
        )

    def locate(self, table: str, partition: int) -> Location:
        owner = self.owners.get(table, {}).get(partition)
        return Location(
            table,
            partition,
            owner,
            self.standbys.get(table, {}).get(partition, ()),
            self.generation,
        )


def require_table(name: str, known: Collection[str]) -> None:
    """:class:`UnknownTableError` naming the known tables unless ``name`` is one."""
    if name not in known:
        names = sorted(known)
        raise UnknownTableError(
            f"no table {name!r}; known tables: {', '.join(names) if names else 'none'}"
        )


def parse_key(text: str, codec: Codec) -> bytes:
    """The key bytes of a key typed as text, exactly as a write of that key encodes them
    (so they land in the same partition).

    The text is decoded by the codec first (``str``/``raw``: as is; ``json``: as JSON;
    dataclass codecs: as that dataclass's JSON), then encoded again, which normalizes it
    (``{"a": 1}`` and ``{"a":1}`` are the same key). A JSON key that is not valid JSON is
    taken as a string, like ``streamjoin table get`` does.
    """
    raw = text.encode("utf-8")
    parse_text = getattr(codec, "parse_text", None)  # a codec whose bytes are not text
    try:
        try:
            obj = codec.loads(raw) if parse_text is None else parse_text(text)
        except CodecError:
            if codec.name != "json":
                raise
            obj = text  # a bare string for a plain JSON key
        data = codec.dumps(obj)
    except (CodecError, TypeError, ValueError) as exc:
        raise QueryKeyError(
            f"key {text!r} is not a valid key for the table's key codec {codec.name!r}: {exc}"
        ) from exc
    if data is None:
        raise QueryKeyError(f"key {text!r} encodes to None with codec {codec.name!r}")
    return data


def partition_of(key: bytes, partitions: int) -> int:
    """The key's partition: the Java client's murmur2 rule, as every write uses."""
    return partition_for_key(key, partitions)


def parse_flag(value: str | None, name: str) -> bool:
    """A query flag: absent, ``0``/``false`` or ``1``/``true``."""
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered in ("", "1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    raise QueryKeyError(f"?{name}= takes 1 or 0, got {value!r}")


def parse_window_range(low: str | None, high: str | None) -> tuple[int, int]:
    """``?from=&to=`` (ms since the epoch, both inclusive, window starts); defaults: all."""

    def number(text: str | None, name: str, default: int) -> int:
        if text is None or text == "":
            return default
        try:
            value = int(text)
        except ValueError:
            raise QueryKeyError(
                f"?{name}= must be an int (ms since the epoch), got {text!r}"
            ) from None
        if value < 0:
            raise QueryKeyError(f"?{name}= must be >= 0, got {value}")
        return value

    start = number(low, "from", 0)
    end = number(high, "to", (1 << 63) - 1)
    if end < start:
        raise QueryKeyError(f"?to= ({end}) is before ?from= ({start})")
    return start, end


class Action(str, Enum):
    LOCAL = "local"
    STALE = "stale"
    FORWARD = "forward"
    REDIRECT = "redirect"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Decision:
    action: Action
    #: the owner's host (forward and redirect)
    target: str | None = None
    #: why there is no answer (unavailable), for the 503 body
    reason: str = ""
    retry_after: float = DEFAULT_RETRY_AFTER

    def unavailable(self) -> QueryUnavailable:
        return QueryUnavailable(self.reason, self.retry_after)


@dataclass(frozen=True)
class LocalState:
    """What this worker holds of one table partition right now."""

    #: active here and restored: its task runs (the only state that answers fresh reads)
    active: bool = False
    #: assigned active here but its store is still restoring
    restoring: bool = False
    #: a standby (or warmup) store is open here; its lag in changelog records, if known
    standby: bool = False
    lag: int | None = None


def decide(
    *,
    table: str,
    partition: int,
    local: LocalState,
    rebalancing: bool,
    routing: RoutingTable | None,
    self_host: str | None,
    forwarded: bool,
    redirect: bool,
    allow_stale: bool,
) -> Decision:
    """Where a read of ``table``'s ``partition`` is answered. The order of the rules is
    the contract (docs/queries.md, "Routing rules")."""
    where = f"partition {partition} of table {table!r}"
    if rebalancing:
        return Decision(Action.UNAVAILABLE, reason=f"this worker is rebalancing ({where})")
    if local.active:
        return Decision(Action.LOCAL)
    if allow_stale and local.standby and local.lag is not None:
        return Decision(Action.STALE)
    if local.restoring:
        return Decision(
            Action.UNAVAILABLE, reason=f"{where} is restoring on this worker, its owner"
        )
    if forwarded:
        return Decision(
            Action.UNAVAILABLE,
            reason=f"forwarded here, but this worker is not the active owner of {where} "
            "(ownership is moving)",
        )
    if routing is None:
        return Decision(
            Action.UNAVAILABLE,
            reason=f"the group's assignment is not known yet (rebalancing), for {where}",
        )
    owner = routing.locate(table, partition).owner
    if owner is None:
        return Decision(
            Action.UNAVAILABLE,
            reason=f"{where} has no active owner with a host in generation "
            f"{routing.generation} (being moved, or its owner advertises no host)",
        )
    if owner == self_host:
        return Decision(
            Action.UNAVAILABLE,
            reason=f"{where} is assigned to this worker but not running here yet",
        )
    return Decision(Action.REDIRECT if redirect else Action.FORWARD, target=owner)


def jsonable(value: Any) -> Any:
    """A decoded table value as JSON can carry it: dataclasses, msgspec Structs and pydantic
    models as objects, bytes as text (UTF-8) or ``{"base64": ...}``, tuples and sets as
    lists."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(data).decode("ascii")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, msgspec.Struct):  # as its codec writes it (datetimes as RFC 3339)
        return jsonable(msgspec.to_builtins(value))
    model_dump = getattr(value, "model_dump", None)  # a pydantic model, without importing it
    if callable(model_dump) and not isinstance(value, type):
        return jsonable(model_dump(mode="json", by_alias=True))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if hasattr(value, "DESCRIPTOR") and hasattr(value, "ListFields"):  # a Protobuf message
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(value, preserving_proto_field_name=True)
    return str(value)


def _dumps(body: dict[str, Any]) -> bytes:
    """msgspec, or the standard library for what msgspec refuses (a lone surrogate)."""
    try:
        return msgspec.json.encode(body)
    except (TypeError, ValueError, msgspec.EncodeError):
        return json.dumps(body).encode()


def _meta(
    table: str, key: str, partition: int, served_by: str | None, lag: int | None
) -> dict[str, Any]:
    return {
        "table": table,
        "key": key,
        "partition": partition,
        "served_by": served_by,
        "stale": lag is not None,
        "lag": lag,
    }


def value_body(
    table: str, key: str, partition: int, value: Any, served_by: str | None, lag: int | None
) -> bytes:
    """A found value: ``lag`` is None for the active owner's fresh answer, else the
    standby's lag in changelog records (``stale`` is then true)."""
    body = _meta(table, key, partition, served_by, lag)
    body["value"] = jsonable(value)
    return _dumps(body)


def global_value_body(
    table: str, key: str, value: Any, served_by: str | None, lag: int | None
) -> bytes:
    """A global table's value, read from this worker's own copy (every worker holds all
    of it; nothing is forwarded): ``lag`` is the copy's distance to the topic's end as of
    the last check (records), ``partition`` is null (the copy holds every partition)."""
    body: dict[str, Any] = {
        "table": table,
        "key": key,
        "partition": None,
        "served_by": served_by,
        "stale": False,
        "lag": lag,
        "global": True,
        "value": jsonable(value),
    }
    return _dumps(body)


def windows_body(
    table: str,
    key: str,
    partition: int,
    windows: Iterable[tuple[int, int, Any]],
    served_by: str | None,
    lag: int | None,
) -> bytes:
    """A windowed table's answer: ``windows`` is ``(start, end, value)``, oldest first."""
    body = _meta(table, key, partition, served_by, lag)
    body["windows"] = [{"start": s, "end": e, "value": jsonable(v)} for s, e, v in windows]
    return _dumps(body)


def error_body(error: QueryError, **extra: Any) -> bytes:
    """``{"error": <kind>, "message": ..., "status": ...}`` plus anything in ``extra``."""
    body: dict[str, Any] = {
        "error": type(error).__name__,
        "message": str(error),
        "status": error.status,
    }
    if isinstance(error, QueryUnavailable):
        body["retry_after"] = error.retry_after
    body.update(extra)
    return _dumps(body)
