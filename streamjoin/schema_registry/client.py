"""A blocking client of the Confluent schema registry REST API, with the caches codecs need.

Codecs are synchronous and run per record, so the client is too: a cache miss costs one
HTTP request on a kept-alive connection (one per thread), and each schema id and each
(subject, schema) pair is asked for once per process. The registry may be Confluent's,
Apicurio's ``/apis/ccompat/v7`` or any other server speaking that API.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streamjoin.errors import (
    ArgumentTypeError,
    ConfigurationError,
    IncompatibleSchema,
    SchemaNotFound,
    SchemaRegistryError,
)

__all__ = ["SCHEMA_TYPES", "RegisteredSchema", "SchemaReference", "SchemaRegistryClient"]

#: the schema types the Confluent API knows (a missing ``schemaType`` means AVRO)
SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
#: errors a kept-alive connection the server closed meanwhile raises on reuse
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


@dataclass(frozen=True)
class SchemaReference:
    """A schema another schema imports (Protobuf imports, JSON Schema ``$ref``s)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry holds it under its id."""

    schema_id: int
    schema_type: str
    schema: str
    references: tuple[SchemaReference, ...] = ()


def _check_type(schema_type: str) -> str:
    if schema_type not in SCHEMA_TYPES:
        raise ConfigurationError(
            f"schema_type must be one of {', '.join(SCHEMA_TYPES)}, got {schema_type!r}"
        )
    return schema_type


def _references(raw: object) -> tuple[SchemaReference, ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(
        SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"]))
        for r in raw
        if isinstance(r, dict)
    )


def _registered(schema_id: int, reply: dict[str, Any]) -> RegisteredSchema:
    """A schema as the API answers it (no ``schemaType``: AVRO)."""
    return RegisteredSchema(
        schema_id,
        str(reply.get("schemaType") or "AVRO"),
        str(reply["schema"]),
        _references(reply.get("references")),
    )


class SchemaRegistryClient:
    """The Confluent schema registry API at ``url`` (e.g. ``http://localhost:8081`` or an
    Apicurio ``.../apis/ccompat/v7``).

    ``auth``: (user, password) for HTTP basic auth; ``headers``: sent with every request
    (a bearer token...). Thread-safe. Pickling keeps the settings and drops the caches and
    connections (Spark ships codecs to executors).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        auth: tuple[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise ArgumentTypeError(f"registry url must be a str, got {type(url).__qualname__}")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"schema registry url must be http(s)://host[:port][/path], got {url!r}"
            )
        if timeout <= 0:
            raise ConfigurationError(f"schema registry timeout must be > 0, got {timeout!r}")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.auth = auth
        self.headers = dict(headers or {})
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = parts.path.rstrip("/")
        self._send_headers = {
            "Content-Type": _CONTENT_TYPE,
            "Accept": f"{_CONTENT_TYPE}, application/json",
            **self.headers,
        }
        if auth is not None:
            user, password = auth
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            self._send_headers["Authorization"] = f"Basic {token}"
        self._lock = threading.Lock()
        self._local = threading.local()
        self._by_id: dict[int, RegisteredSchema] = {}
        self._ids: dict[tuple[str, str, str], int] = {}

    # -- pickling: settings only ----------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "timeout": self.timeout,
            "auth": self.auth,
            "headers": self.headers,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["url"], timeout=state["timeout"], auth=state["auth"], headers=state["headers"]
        )

    def __repr__(self) -> str:  # never the credentials
        return f"SchemaRegistryClient({self.url!r})"

    # -- the API ----------------------------------------------------------------------------

    def register(
        self,
        subject: str,
        schema: str,
        schema_type: str = "AVRO",
        references: Sequence[SchemaReference] = (),
    ) -> int:
        """The id of ``schema`` under ``subject``, registering it as a new version if the
        subject does not have it (idempotent). An incompatible schema is refused by the
        registry: :class:`IncompatibleSchema` with its reasons."""
        return self._id_of(subject, schema, schema_type, references, "/versions")

    def id_for(
        self,
        subject: str,
        schema: str,
        schema_type: str = "AVRO",
        references: Sequence[SchemaReference] = (),
    ) -> int:
        """The id of ``schema`` under ``subject`` without registering it;
        :class:`SchemaNotFound` when the subject does not have it."""
        return self._id_of(subject, schema, schema_type, references, "")

    def _id_of(
        self,
        subject: str,
        schema: str,
        schema_type: str,
        references: Sequence[SchemaReference],
        route: str,
    ) -> int:
        """``POST /subjects/<subject><route>`` (register, or look up), unless cached."""
        key = (subject, _check_type(schema_type), schema)
        known = self._ids.get(key)
        if known is not None:
            return known
        body = self._schema_body(schema, schema_type, references)
        reply = self._call(
            "POST", f"/subjects/{_quote(subject)}{route}", body, f"subject {subject!r}"
        )
        schema_id = int(reply["id"])
        found = RegisteredSchema(schema_id, schema_type, schema, tuple(references))
        with self._lock:
            self._ids[key] = schema_id
            self._by_id.setdefault(schema_id, found)
        return schema_id

    def schema_of(self, schema_id: int) -> RegisteredSchema:
        """The schema registered under ``schema_id`` (asked for once, then cached)."""
        known = self._by_id.get(schema_id)
        if known is not None:
            return known
        reply = self._call("GET", f"/schemas/ids/{int(schema_id)}", None, f"schema id {schema_id}")
        found = _registered(int(schema_id), reply)
        with self._lock:
            self._by_id[schema_id] = found
        return found

    def latest(self, subject: str) -> RegisteredSchema:
        """The latest version of ``subject`` (not cached: a codec asks once and keeps it)."""
        reply = self._call(
            "GET", f"/subjects/{_quote(subject)}/versions/latest", None, f"subject {subject!r}"
        )
        found = _registered(int(reply["id"]), reply)
        with self._lock:
            self._by_id.setdefault(found.schema_id, found)
        return found

    def check_compatible(
        self,
        subject: str,
        schema: str,
        schema_type: str = "AVRO",
        references: Sequence[SchemaReference] = (),
    ) -> list[str]:
        """Why the registry would refuse ``schema`` as the next version of ``subject`` under
        the subject's compatibility level: its messages, empty when compatible (or when the
        subject does not exist yet)."""
        body = self._schema_body(schema, _check_type(schema_type), references)
        path = f"/compatibility/subjects/{_quote(subject)}/versions/latest?verbose=true"
        try:
            reply = self._call("POST", path, body, f"subject {subject!r}")
        except SchemaNotFound:
            return []
        if reply.get("is_compatible", False):
            return []
        messages = reply.get("messages") or []
        return [str(m) for m in messages] or [
            f"the registry finds the schema incompatible with the latest version of {subject!r} "
            "(it gives no reasons)"
        ]

    # -- plumbing ---------------------------------------------------------------------------

    @staticmethod
    def _schema_body(
        schema: str, schema_type: str, references: Sequence[SchemaReference]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"schema": schema}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        if references:
            body["references"] = [
                {"name": r.name, "subject": r.subject, "version": r.version} for r in references
            ]
        return body

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, and whether it was used before (it may have gone stale)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = kind(self._host, self._port, timeout=self.timeout)
        self._local.conn = conn
        return conn, False

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _call(self, method: str, path: str, body: object, what: str) -> dict[str, Any]:
        """One request; the decoded JSON reply, or the registry's error as ours."""
        data = None if body is None else json.dumps(body).encode()
        where = f"{what}: schema registry {self.url}"
        for attempt in (1, 2):
            conn, reused = self._connection()
            try:
                conn.request(method, self._path + path, body=data, headers=self._send_headers)
                reply = conn.getresponse()
                status, raw = reply.status, reply.read()
            except _STALE as exc:
                self._drop_connection()
                if reused and attempt == 1:
                    continue  # the server closed the idle connection: once more, new one
                raise SchemaRegistryError(f"{where} closed the connection: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                raise SchemaRegistryError(
                    f"{where} did not answer within {self.timeout:g}s: {exc}"
                    if isinstance(exc, TimeoutError)
                    else f"{where} could not be reached: {exc}"
                ) from exc
            break
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = {"message": raw[:200].decode("utf-8", "replace")}
        if not isinstance(decoded, dict):
            decoded = {"value": decoded}
        if status < 400:
            return decoded
        message = str(decoded.get("message") or f"HTTP {status}")
        code = decoded.get("error_code")
        code = code if isinstance(code, int) else None
        text = f"{where} answered HTTP {status}: {message}"
        if status == 404:
            raise SchemaNotFound(text, status=status, code=code)
        if status == 409:
            raise IncompatibleSchema(
                f"{where} refused the schema as incompatible: {message}", [message]
            )
        raise SchemaRegistryError(text, status=status, code=code)


def _quote(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")
