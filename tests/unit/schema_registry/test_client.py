"""The registry client against an in-process fake of the Confluent API: caching both ways,
errors that name the subject, the URL and the registry's message, timeouts, dropped
connections, threads and pickling."""

from __future__ import annotations

import base64
import pickle
import threading

import pytest

from streamjoin.errors import (
    ConfigurationError,
    IncompatibleSchema,
    SchemaNotFound,
    SchemaRegistryError,
)
from streamjoin.schema_registry.client import RegisteredSchema, SchemaRegistryClient
from tests.unit.schema_registry.fake_registry import fake_registry

SCHEMA = '{"type":"string"}'


def test_ids_are_cached_both_ways() -> None:
    with fake_registry() as fake:
        client = SchemaRegistryClient(fake.url)
        first = client.register("t-value", SCHEMA)
        assert client.register("t-value", SCHEMA) == first
        assert client.id_for("t-value", SCHEMA) == first
        # registering taught the client the schema of its id: no request to read it
        assert client.schema_of(first) == RegisteredSchema(first, "AVRO", SCHEMA)
        assert fake.requests == [("POST", "/subjects/t-value/versions")]
        other = client.register("u-value", '{"type":"object"}', "JSON")
        reader = SchemaRegistryClient(fake.url)
        assert reader.schema_of(other) == RegisteredSchema(other, "JSON", '{"type":"object"}')
        assert reader.schema_of(other).schema_type == "JSON"
        assert fake.requests.count(("GET", f"/schemas/ids/{other}")) == 1


def test_lookups_without_registering_and_the_latest_version() -> None:
    with fake_registry() as fake:
        client = SchemaRegistryClient(fake.url)
        with pytest.raises(SchemaNotFound, match=r"subject 't-value': schema registry http://"):
            client.id_for("t-value", SCHEMA)
        with pytest.raises(SchemaNotFound, match="Schema 9 not found"):
            client.schema_of(9)
        n = SchemaRegistryClient(fake.url).register("t-value", SCHEMA)
        assert client.id_for("t-value", SCHEMA) == n
        assert client.latest("t-value") == RegisteredSchema(n, "AVRO", SCHEMA)


def test_subjects_are_quoted_in_paths() -> None:
    with fake_registry() as fake:
        SchemaRegistryClient(fake.url).register("a/b c", SCHEMA)
        assert fake.requests == [("POST", "/subjects/a%2Fb%20c/versions")]


def test_an_incompatible_schema_carries_the_registrys_reasons() -> None:
    with fake_registry() as fake:
        client = SchemaRegistryClient(fake.url)
        client.register("t-value", SCHEMA)
        assert client.check_compatible("t-value", '{"type":"long"}') == []
        assert client.check_compatible("new-subject", SCHEMA) == []
        fake.incompatible = True
        assert client.check_compatible("t-value", '{"type":"long"}') == ["field x lost its default"]
        with pytest.raises(IncompatibleSchema, match=r"'t-value'.*field x lost") as caught:
            client.register("t-value", '{"type":"long"}')
        assert caught.value.reasons == ["field x lost its default"]
        assert caught.value.status == 409


def test_server_errors_name_subject_url_and_message() -> None:
    with fake_registry() as fake:
        fake.fail_with = 503
        client = SchemaRegistryClient(fake.url)
        with pytest.raises(SchemaRegistryError) as caught:
            client.register("t-value", SCHEMA)
        message = str(caught.value)
        assert "subject 't-value'" in message and fake.url in message
        assert "HTTP 503: store unavailable" in message
        assert (caught.value.status, caught.value.code) == (503, 50001)
        assert not isinstance(caught.value, SchemaNotFound)
        fake.fail_with = None
        assert client.register("t-value", SCHEMA) == 1  # nothing cached from the failure


def test_a_slow_registry_times_out_and_an_absent_one_fails_clearly() -> None:
    with fake_registry() as fake:
        fake.delay = 0.5
        client = SchemaRegistryClient(fake.url, timeout=0.05)
        with pytest.raises(SchemaRegistryError, match=r"did not answer within 0\.05s"):
            client.schema_of(1)
        url = fake.url
    with pytest.raises(SchemaRegistryError, match="could not be reached"):
        SchemaRegistryClient(url).schema_of(1)


def test_connections_are_kept_alive_and_reopened_when_the_server_closed_them() -> None:
    with fake_registry() as fake:
        client = SchemaRegistryClient(fake.url)
        for n in range(3):
            client.register(f"s{n}", SCHEMA)
        fake.close_after_reply = True
        for n in range(3, 6):  # each reuse meets a closed connection: retried on a new one
            client.register(f"s{n}", SCHEMA)
        assert len(fake.requests) == 6


def test_many_threads_share_one_client() -> None:
    with fake_registry() as fake:
        client = SchemaRegistryClient(fake.url)
        results: list[int] = []

        def work(n: int) -> None:
            for i in range(10):
                results.append(client.register(f"s{(n + i) % 4}", SCHEMA))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [1] * 80
        assert len(fake.requests) <= 4 * 8  # the cache answered the rest


def test_pickling_keeps_the_settings_and_drops_caches_and_connections() -> None:
    with fake_registry() as fake:
        client = SchemaRegistryClient(
            fake.url, timeout=3, auth=("ann", "pw"), headers={"X-Team": "data"}
        )
        n = client.register("t-value", SCHEMA)
        copy = pickle.loads(pickle.dumps(client))
        assert (copy.url, copy.timeout, copy.auth, copy.headers) == (
            fake.url,
            3.0,
            ("ann", "pw"),
            {"X-Team": "data"},
        )
        assert copy.schema_of(n).schema == SCHEMA  # asked again: the cache was not shipped
        assert fake.requests[-1] == ("GET", f"/schemas/ids/{n}")
        sent = fake.headers[-1]
        assert sent["Authorization"] == "Basic " + base64.b64encode(b"ann:pw").decode()
        assert sent["X-Team"] == "data"
        assert "pw" not in repr(copy)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="http"):
        SchemaRegistryClient("localhost:8081")
    with pytest.raises(ConfigurationError, match="timeout"):
        SchemaRegistryClient("http://127.0.0.1:1", timeout=0)
    with pytest.raises(ConfigurationError, match="schema_type"):
        SchemaRegistryClient("http://127.0.0.1:1").register("s", SCHEMA, "XML")
