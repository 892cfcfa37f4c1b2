"""The project-provisioned schema registry (Apicurio Registry), spoken to through the
Confluent-compatible API the way Confluent's clients and our codecs speak to it."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from streamjoin.local_registry import LocalRegistry, registry_answers
from tests.integration.support import start_dev_command

CONFLUENT_JSON = "application/vnd.schemaregistry.v1+json"

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
}
#: v1 plus a field with a default: a new reader fills it in for old records (BACKWARD).
ORDER_V2 = {
    **ORDER_V1,
    "fields": [*ORDER_V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}],
}
#: v2 plus a field without a default: a new reader cannot read old records (not BACKWARD).
ORDER_V3 = {**ORDER_V2, "fields": [*ORDER_V2["fields"], {"name": "customer", "type": "string"}]}


def call(base: str, method: str, path: str, body: object | None = None) -> tuple[int, Any]:
    """One Confluent API request: (HTTP status, decoded JSON body)."""
    request = urllib.request.Request(
        base + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": CONFLUENT_JSON, "Accept": f"{CONFLUENT_JSON}, application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def register(base: str, subject: str, schema: dict[str, Any]) -> tuple[int, Any]:
    return call(base, "POST", f"/subjects/{subject}/versions", {"schema": json.dumps(schema)})


def test_an_avro_schema_registers_once_and_reads_back_by_id(
    schema_registry_url: str, unique_topic: Callable[..., str]
) -> None:
    subject = unique_topic("orders") + "-value"
    status, body = register(schema_registry_url, subject, ORDER_V1)
    assert status == 200, body
    schema_id = body["id"]
    assert isinstance(schema_id, int)

    status, body = call(schema_registry_url, "GET", f"/schemas/ids/{schema_id}")
    assert status == 200, body
    assert json.loads(body["schema"]) == ORDER_V1

    status, body = call(schema_registry_url, "GET", f"/subjects/{subject}/versions/latest")
    assert status == 200, body
    assert (body["subject"], body["version"], body["id"]) == (subject, 1, schema_id)

    # Registering the same schema again is idempotent (a writer registers on first write, and
    # every worker does so): same id, no new version.
    assert register(schema_registry_url, subject, ORDER_V1) == (200, {"id": schema_id})
    assert call(schema_registry_url, "GET", f"/subjects/{subject}/versions") == (200, [1])
    # A reader looks the schema up under its subject without registering it.
    status, body = call(
        schema_registry_url, "POST", f"/subjects/{subject}", {"schema": json.dumps(ORDER_V1)}
    )
    assert (status, body["id"], body["version"]) == (200, schema_id, 1)


def test_backward_compatibility_refuses_an_incompatible_change_with_409(
    schema_registry_url: str, unique_topic: Callable[..., str]
) -> None:
    subject = unique_topic("orders") + "-value"
    status, first = register(schema_registry_url, subject, ORDER_V1)
    assert status == 200, first
    status, body = call(
        schema_registry_url, "PUT", f"/config/{subject}", {"compatibility": "BACKWARD"}
    )
    assert status == 200, body
    status, body = call(schema_registry_url, "GET", f"/config/{subject}")
    assert status == 200 and body["compatibilityLevel"] == "BACKWARD", body

    latest = f"/compatibility/subjects/{subject}/versions/latest"
    status, body = call(schema_registry_url, "POST", latest, {"schema": json.dumps(ORDER_V2)})
    assert status == 200 and body["is_compatible"] is True, body
    status, second = register(schema_registry_url, subject, ORDER_V2)
    assert status == 200, second
    assert second["id"] != first["id"]

    status, body = call(schema_registry_url, "POST", latest, {"schema": json.dumps(ORDER_V3)})
    assert status == 200 and body["is_compatible"] is False, body
    status, body = register(schema_registry_url, subject, ORDER_V3)
    assert status == 409, body
    assert body["error_code"] == 409
    assert call(schema_registry_url, "GET", f"/subjects/{subject}/versions") == (200, [1, 2])


def test_a_registry_of_its_own_starts_empty_and_stops(unique_topic: Callable[..., str]) -> None:
    with LocalRegistry() as own:
        url = own.url
        assert own.running
        assert call(own.ccompat_url, "GET", "/subjects") == (200, [])
        status, _ = register(own.ccompat_url, unique_topic("s"), ORDER_V1)
        assert status == 200
    assert not own.running
    assert not registry_answers(url, timeout=1)


def test_dev_registry_cli_prints_the_url_and_stops_on_ctrl_c(
    unique_topic: Callable[..., str],
) -> None:
    """``streamjoin dev-registry``: an empty registry whose Confluent API is printed, gone
    after Ctrl-C with exit code 0."""
    proc, url = start_dev_command(
        ["dev-registry", "--heap", "192m"], "schema registry (Confluent API): http://127.0.0.1:"
    )
    try:
        assert call(url, "GET", "/subjects") == (200, [])
        assert register(url, unique_topic("s"), ORDER_V1)[0] == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not registry_answers(url.split("/apis/")[0], timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
