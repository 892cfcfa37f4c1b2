"""A tiny in-process stand-in for the Confluent schema registry API, for the edge cases a
real registry will not produce on demand (5xx, slow answers, dropped connections) and to
count requests. The real registry is tested in tests/integration/test_registry_codecs.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeRegistry:
    """What the fake holds, and how it misbehaves."""

    schemas: list[tuple[str, str]] = field(default_factory=list)  # id - 1 -> (type, schema)
    subjects: dict[str, list[int]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    fail_with: int | None = None  # answer every request with this status
    delay: float = 0.0
    close_after_reply: bool = False  # close the connection after each reply, unannounced
    incompatible: bool = False
    url: str = ""

    def id_of(self, schema_type: str, schema: str) -> int:
        entry = (schema_type, schema)
        if entry not in self.schemas:
            self.schemas.append(entry)
        return self.schemas.index(entry) + 1

    def answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if self.fail_with is not None:
            return self.fail_with, {"error_code": 50001, "message": "store unavailable"}
        parts = path.split("?")[0].strip("/").split("/")
        kind = str(body.get("schemaType", "AVRO"))
        if parts[:2] == ["schemas", "ids"] and method == "GET":
            n = int(parts[2])
            if not 1 <= n <= len(self.schemas):
                return 404, {"error_code": 40403, "message": f"Schema {n} not found"}
            schema_type, schema = self.schemas[n - 1]
            return 200, {
                "schema": schema,
                **({} if schema_type == "AVRO" else {"schemaType": schema_type}),
            }
        if parts[0] == "subjects" and len(parts) == 3 and method == "POST":
            if self.incompatible and self.subjects.get(parts[1]):
                return 409, {"error_code": 409, "message": "field x lost its default"}
            n = self.id_of(kind, body["schema"])
            versions = self.subjects.setdefault(parts[1], [])
            if n not in versions:
                versions.append(n)
            return 200, {"id": n}
        if parts[0] == "subjects" and len(parts) == 2 and method == "POST":
            versions = self.subjects.get(parts[1])
            if versions is None:
                return 404, {"error_code": 40401, "message": f"Subject '{parts[1]}' not found."}
            n = self.id_of(kind, body["schema"])
            if n not in versions:
                return 404, {"error_code": 40403, "message": "Schema not found"}
            return 200, {"id": n, "version": versions.index(n) + 1, "subject": parts[1]}
        if parts[0] == "subjects" and parts[2:] == ["versions", "latest"]:
            versions = self.subjects.get(parts[1])
            if not versions:
                return 404, {"error_code": 40401, "message": f"Subject '{parts[1]}' not found."}
            schema_type, schema = self.schemas[versions[-1] - 1]
            return 200, {
                "id": versions[-1],
                "version": len(versions),
                "schema": schema,
                **({} if schema_type == "AVRO" else {"schemaType": schema_type}),
            }
        if parts[0] == "compatibility":
            if parts[2] not in self.subjects:
                return 404, {"error_code": 40401, "message": "Subject not found."}
            if self.incompatible:
                return 200, {"is_compatible": False, "messages": ["field x lost its default"]}
            return 200, {"is_compatible": True}
        return 404, {"error_code": 404, "message": "no such route"}


@contextmanager
def fake_registry(prefix: str = "/apis/ccompat/v7") -> Iterator[FakeRegistry]:
    """A :class:`FakeRegistry` served on loopback for the block."""
    state = FakeRegistry()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else {}
            path = self.path.removeprefix(prefix)
            state.requests.append((self.command, path))
            state.headers.append(dict(self.headers))
            if state.delay:
                time.sleep(state.delay)
            status, reply = state.answer(self.command, path, body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            if state.close_after_reply:
                self.close_connection = True

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.handle_error = lambda request, address: None  # type: ignore[method-assign]  # a client that gave up
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}{prefix}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
