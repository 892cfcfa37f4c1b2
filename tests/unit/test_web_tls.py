"""TLS of the worker's web server, without a broker: the settings, the contexts built from
PEM files (and their errors), a real HTTPS WebServer asked by both query clients (CA
verification, mutual TLS, no downgrade on redirects), two query services forwarding a
read over HTTPS, the CLI's exit code on bad files, and the log filter masking secrets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry

import streamjoin
from streamjoin.cli import cli
from streamjoin.config import AppConfig, Secret
from streamjoin.errors import ConfigurationError, QueryFailed
from streamjoin.partitioner import partition_for_key
from streamjoin.query import AsyncTableClient, TableClient
from streamjoin.query.tls import client_context, server_context
from streamjoin.redaction import MASK, SecretsFilter, mask_secrets_in_logs
from streamjoin.runtime.group.group_info import GroupInfo, MemberInfo
from streamjoin.runtime.ops.query_endpoint import QueryService
from streamjoin.runtime.ops.web import WebServer, web_tls_contexts
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.table_partition import TablePartition
from tests.web_certificates import WebCerts, web_certs

__all__ = ["web_certs"]  # the fixture, used by name

ANSWER = {"table": "t", "key": "k", "partition": 0, "value": 7, "stale": False, "lag": None}


# ------------------------------------------------------------------ settings


def test_tls_settings_are_validated_and_the_password_is_a_secret(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    config = AppConfig("a", web_tls_cert=str(cert), web_tls_key=key, web_tls_key_password="pw-9")
    assert config.web_tls and config.web_tls_cert == cert and config.web_tls_key == key
    assert isinstance(config.web_tls_key_password, Secret)
    assert "pw-9" not in repr(config)
    assert "pw-9" in config.secret_values()
    assert not AppConfig("a").web_tls
    with pytest.raises(ConfigurationError, match="only web_tls_cert is set"):
        AppConfig("a", web_tls_cert=cert)
    with pytest.raises(ConfigurationError, match="only web_tls_key is set"):
        AppConfig("a", web_tls_key=key)
    for name in ("web_tls_ca", "web_tls_client_ca", "web_tls_key_password"):
        with pytest.raises(ConfigurationError, match=f"{name} is a setting of HTTPS"):
            AppConfig("a", **{name: "x.pem"})
    with pytest.raises(ConfigurationError, match="web_tls_ca must be the path of a PEM file"):
        AppConfig("a", web_tls_cert=cert, web_tls_key=key, web_tls_ca=42)


def test_secret_values_are_every_credential_and_the_repr_shows_none(tmp_path: Path) -> None:
    config = AppConfig(
        "a",
        query_token="tok-1",
        client_options={
            "sasl_plain_username": "alice",
            "sasl_plain_password": "pw-1",
            "sasl.jaas.config": 'ScramLoginModule required username="a" password="pw-2";',
        },
        consumer_options={"ssl.keystore.key": "-----BEGIN PRIVATE KEY-----x"},
        producer_options={"api_key": b"pw-3"},
    )
    secrets = config.secret_values()
    assert set(secrets) == {
        "tok-1",
        "pw-1",
        'ScramLoginModule required username="a" password="pw-2";',
        "-----BEGIN PRIVATE KEY-----x",
        "pw-3",
    }
    assert not any(s in repr(config) for s in ("tok-1", "pw-1", "pw-2", "PRIVATE", "pw-3"))
    assert "alice" in repr(config)  # a user name is no credential
    with pytest.raises(ConfigurationError) as refused:
        AppConfig("a", client_options=[("sasl_plain_password", "pw-4")])  # type: ignore[arg-type]
    assert "pw-4" not in str(refused.value)


# ------------------------------------------------------------------ contexts


def _bad_files(certs: WebCerts, tmp_path: Path) -> list[tuple[dict[str, Any], str]]:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    locked = certs.ca.issue("locked", password="right")
    unreadable = tmp_path / "unreadable.key"
    unreadable.write_bytes(certs.server.key.read_bytes())
    unreadable.chmod(0)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"cert_file": tmp_path / "none.crt"}, "web_tls_cert '.*none.crt': no such file"),
        ({"cert_file": tmp_path}, "is not a file"),
        ({"cert_file": not_pem}, "not a PEM certificate"),
        ({"key_file": not_pem}, "not a PEM private key"),
        ({"key_file": certs.client.key}, "the private key does not belong to the certificate"),
        ({"cert_file": locked.cert, "key_file": locked.key}, "encrypted: give its password"),
        (
            {"cert_file": locked.cert, "key_file": locked.key, "key_password": "wrong"},
            "the key password does not decrypt",
        ),
        ({"client_ca_file": not_pem}, "web_tls_client_ca .* is not a PEM file of CA"),
    ]
    if os.geteuid() != 0:  # root reads anything
        cases.append(({"key_file": unreadable}, "cannot be read: Permission denied"))
    return cases


def test_unusable_certificate_files_are_named_with_what_is_wrong(
    web_certs: WebCerts, tmp_path: Path
) -> None:
    for change, message in _bad_files(web_certs, tmp_path):
        files: dict[str, Any] = {"cert_file": web_certs.server.cert}
        files["key_file"] = web_certs.server.key
        files.update(change)
        with pytest.raises(ConfigurationError, match=message):
            server_context(files.pop("cert_file"), files.pop("key_file"), **files)
    locked = web_certs.ca.issue("locked2", password="right")
    server_context(locked.cert, locked.key, key_password="right")  # the right one works
    with pytest.raises(ConfigurationError, match=r"ca_file .* is not a PEM file of CA"):
        client_context(web_certs.server.key)
    with pytest.raises(ConfigurationError, match="needs both cert_file and key_file"):
        client_context(web_certs.ca.cert, cert_file=web_certs.client.cert)


def test_the_worker_contexts_name_the_worker_settings(web_certs: WebCerts) -> None:
    assert web_tls_contexts(AppConfig("a")) is None
    config = AppConfig(
        "a",
        web_tls_cert=web_certs.server.cert,
        web_tls_key=web_certs.server.key,
        web_tls_ca=web_certs.server.key,  # not a CA file
    )
    with pytest.raises(ConfigurationError, match=r"web_tls_ca '.*worker.key' is not a PEM"):
        web_tls_contexts(config)
    contexts = web_tls_contexts(config.replace(web_tls_ca=web_certs.ca.cert))
    assert contexts is not None
    assert contexts.forward.verify_mode == ssl.CERT_REQUIRED and contexts.forward.check_hostname


# ------------------------------------------------------------------ a server, both clients


class Served:
    """A WebServer on a free port serving a fixed table answer, and what it saw."""

    def __init__(self, tls: ssl.SSLContext | None, redirect_to: str | None = None) -> None:
        self.server = WebServer(dict, CollectorRegistry(), tls=tls)
        self.redirect_to = redirect_to
        self.server.add_route("GET", "/tables/{table}/{key}", self._answer)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if self.redirect_to is not None:
            raise web.HTTPTemporaryRedirect(self.redirect_to + str(request.rel_url))
        return web.json_response(ANSWER)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.port}"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    started: list[Served] = []

    async def start(tls: ssl.SSLContext | None, redirect_to: str | None = None) -> Served:
        served = Served(tls, redirect_to)
        await served.server.start()
        started.append(served)
        return served

    yield start
    for served in started:
        await served.server.stop()


def _never_sleeps(seconds: float) -> None:
    raise AssertionError(f"a TLS failure was retried (slept {seconds} s)")


async def test_clients_verify_the_server_against_the_ca(
    web_certs: WebCerts, serve: Callable[..., Awaitable[Served]]
) -> None:
    served = await serve(server_context(web_certs.server.cert, web_certs.server.key))
    assert served.server.url.startswith("https://127.0.0.1:")

    def get(hosts: list[str], **kw: Any) -> dict[str, Any]:
        return TableClient(hosts, retry_for=0, **kw).get("t", "k")

    # host:port with a CA means https; https:// too
    assert await asyncio.to_thread(get, [served.host], ca_file=web_certs.ca.cert) == ANSWER
    assert (
        await asyncio.to_thread(get, [f"https://{served.host}"], ca_file=web_certs.ca.cert)
        == ANSWER
    )
    # the wrong CA: refused at once, never retried
    with pytest.raises(QueryFailed, match=r"TLS certificate was not accepted.*check ca_file"):
        await asyncio.to_thread(
            get, [served.host], ca_file=web_certs.other_ca.cert, sleep=_never_sleeps
        )
    # no CA given: an https:// host is verified against the system's CAs (which lack ours)
    with pytest.raises(QueryFailed, match="not accepted"):
        await asyncio.to_thread(get, [f"https://{served.host}"], sleep=_never_sleeps)
    # plain HTTP to an HTTPS server: the reason says what to do
    with pytest.raises(QueryFailed, match=r"does it serve HTTPS\?"):
        await asyncio.to_thread(get, [served.host])
    # a CA with an explicit http:// host is a mistake, named
    with pytest.raises(ConfigurationError, match="is plain HTTP"):
        TableClient([f"http://{served.host}"], ca_file=web_certs.ca.cert)

    async with AsyncTableClient([served.host], ca_file=web_certs.ca.cert) as client:
        assert await client.get("t", "k") == ANSWER
    async with AsyncTableClient([served.host], ca_file=web_certs.other_ca.cert) as client:
        with pytest.raises(QueryFailed, match="not accepted"):
            await client.get("t", "k")

    # the status JSON and the metrics are served over HTTPS too
    context = client_context(web_certs.ca.cert)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        for path in ("status.json", "metrics", ""):
            async with session.get(served.server.url + path) as response:
                assert response.status == 200, path


async def test_insecure_skips_verification_and_says_so(
    web_certs: WebCerts,
    serve: Callable[..., Awaitable[Served]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    served = await serve(server_context(web_certs.server.cert, web_certs.server.key))
    with caplog.at_level(logging.WARNING, logger="streamjoin.tls"):
        client = TableClient([served.host], insecure=True, retry_for=0)
    assert "NOT verified" in caplog.text
    assert await asyncio.to_thread(client.get, "t", "k") == ANSWER


async def test_mutual_tls_wants_a_client_certificate_the_ca_signed(
    web_certs: WebCerts, serve: Callable[..., Awaitable[Served]]
) -> None:
    tls = server_context(
        web_certs.server.cert, web_certs.server.key, client_ca_file=web_certs.ca.cert
    )
    served = await serve(tls)
    with pytest.raises(QueryFailed, match="does it want a client certificate"):
        await asyncio.to_thread(
            TableClient([served.host], ca_file=web_certs.ca.cert, retry_for=0).get, "t", "k"
        )
    with_cert = TableClient(
        [served.host],
        ca_file=web_certs.ca.cert,
        cert_file=web_certs.client.cert,
        key_file=web_certs.client.key,
        retry_for=0,
    )
    assert await asyncio.to_thread(with_cert.get, "t", "k") == ANSWER
    async with AsyncTableClient([served.host], ca_file=web_certs.ca.cert, retry_for=0) as bare:
        with pytest.raises(QueryFailed, match="does it want a client certificate"):
            await bare.get("t", "k")
    async with AsyncTableClient(
        [served.host],
        ca_file=web_certs.ca.cert,
        cert_file=web_certs.client.cert,
        key_file=web_certs.client.key,
    ) as client:
        assert await client.get("t", "k") == ANSWER


async def test_a_redirect_from_https_to_plain_http_is_refused(
    web_certs: WebCerts, serve: Callable[..., Awaitable[Served]]
) -> None:
    plain = await serve(None)
    tls = server_context(web_certs.server.cert, web_certs.server.key)
    secure = await serve(tls, redirect_to=f"http://{plain.host}")
    client = TableClient([secure.host], ca_file=web_certs.ca.cert, token="t0k", retry_for=0)
    with pytest.raises(QueryFailed, match="refused, a redirect from HTTPS to plain HTTP"):
        await asyncio.to_thread(client.get, "t", "k")
    async with AsyncTableClient([secure.host], ca_file=web_certs.ca.cert) as async_client:
        with pytest.raises(QueryFailed, match="refused"):
            await async_client.get("t", "k")
    # and the other way round is fine: a plain client follows a redirect to HTTPS
    upgrade = await serve(None, redirect_to=f"https://{secure.host}")
    secure.redirect_to = None
    plain_client = TableClient([f"http://{upgrade.host}"], retry_for=0)
    with pytest.raises(QueryFailed, match="not accepted"):  # (no CA: the system's)
        await asyncio.to_thread(plain_client.get, "t", "k")


async def test_table_get_remote_verifies_the_server_or_says_loudly_it_does_not(
    web_certs: WebCerts, serve: Callable[..., Awaitable[Served]], tmp_path: Path
) -> None:
    served = await serve(server_context(web_certs.server.cert, web_certs.server.key))
    remote = ["table", "get", "--remote", served.host]

    def run(*args: str) -> Result:
        return CliRunner().invoke(cli, [*remote, *args, "t", "k"])

    verified = await asyncio.to_thread(run, f"--ca-file={web_certs.ca.cert}")
    assert verified.exit_code == 0, verified.output
    assert verified.stdout.strip() == "7" and "NOT verified" not in verified.stderr
    # (a process of its own: the warning reaches stderr through logging's last resort)
    insecure = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "streamjoin.cli", *remote, "--insecure", "t", "k"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert insecure.returncode == 0, insecure.stderr
    assert "TLS certificates are NOT verified" in insecure.stderr
    not_a_ca = await asyncio.to_thread(run, f"--ca-file={web_certs.server.key}")
    assert not_a_ca.exit_code == 1
    assert "is not a PEM file of CA certificates" in not_a_ca.stderr


# ------------------------------------------------------------------ forwarding over HTTPS


def _app() -> streamjoin.App:
    app = streamjoin.App("q")
    source = app.topic("src", key_serializer="str", partitions=2)
    app.table("counts", key_serializer="str", copartitioned_with=source, partitions=2)

    @app.agent(source, name="noop")
    async def noop(stream: Any) -> None:
        async for _ in stream:
            pass

    return app


class _Membership:
    generation = 3
    rebalancing = False


class _Tables:
    def __init__(self, active: dict[int, TablePartition]) -> None:
        self.active = active

    def active_partition(self, table: str, partition: int) -> TablePartition | None:
        return self.active.get(partition)

    def assigned_partition(self, table: str, partition: int) -> bool:
        return partition in self.active


async def test_a_read_is_forwarded_to_the_owner_over_mutual_tls(web_certs: WebCerts) -> None:
    """Worker A owns partition 0, worker B partition 1; a read of B's key asked of A is
    forwarded over HTTPS, A verifying B (web_tls_ca) and presenting its own certificate."""
    config = AppConfig(
        "q",
        web_tls_cert=web_certs.server.cert,
        web_tls_key=web_certs.server.key,
        web_tls_client_ca=web_certs.ca.cert,
        web_tls_ca=web_certs.ca.cert,
    )
    contexts = web_tls_contexts(config)
    assert contexts is not None
    topology = _app().topology()
    servers = [WebServer(dict, CollectorRegistry(), tls=contexts.server) for _ in range(2)]
    hosts: list[str] = []

    async def describe() -> GroupInfo:
        members = tuple(
            MemberInfo(f"m{p}", None, "h", 3, {"src": [p]}, {}, host=host)
            for p, host in enumerate(hosts)
        )
        return GroupInfo("q", "Stable", "cooperative", members)

    key = next(f"k{i}" for i in range(100) if partition_for_key(f"k{i}".encode(), 2) == 1)
    store = MemoryStorePartition(table="counts", partition=1)
    store.write({key.encode(): b"41"}, 1)
    services = [
        QueryService(
            topology,
            tables=_Tables({1: TablePartition("counts", 1, store)} if p == 1 else {}),
            stores=None,
            state_service=None,
            membership=_Membership,  # type: ignore[arg-type]
            describe=describe,
            self_host=None,
            forward_tls=contexts.forward,
        )
        for p in range(2)
    ]
    try:
        for server, service in zip(servers, services, strict=True):
            for method, path, handler in service.routes():
                server.add_route(method, path, handler)
            await server.start()
            hosts.append(f"127.0.0.1:{server.port}")
        for service, host in zip(services, hosts, strict=True):
            service.self_host = host
            service.start(serving=True)
        for _ in range(200):  # each describes the group once
            if all(s.current_routing() is not None for s in services):
                break
            await asyncio.sleep(0.01)
        client = AsyncTableClient(
            [hosts[0]],
            ca_file=web_certs.ca.cert,
            cert_file=web_certs.client.cert,
            key_file=web_certs.client.key,
        )
        async with client:
            answer = await client.get("counts", key)
        assert answer["value"] == 41 and answer["served_by"] == hosts[1]
        # a redirect names the owner with https
        own = client_context(
            web_certs.ca.cert, cert_file=web_certs.client.cert, key_file=web_certs.client.key
        )
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=own)) as session,
            session.get(
                f"https://{hosts[0]}/tables/counts/{key}?redirect=1", allow_redirects=False
            ) as response,
        ):
            assert response.status == 307
            assert response.headers["Location"].startswith(f"https://{hosts[1]}/")
    finally:
        for service in services:
            await service.stop()
        for server in servers:
            await server.stop()


# ------------------------------------------------------------------ the CLI


def test_the_worker_exits_3_naming_a_bad_certificate_before_asking_the_broker(
    web_certs: WebCerts, tmp_path: Path
) -> None:
    (tmp_path / "tls_app.py").write_text(
        textwrap.dedent(
            """
            import streamjoin

            app = streamjoin.App("tls-app", broker="kafka://127.0.0.1:9", web_port=0,
                                 startup_timeout=30)
            """
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "STREAMJOIN_WEB_TLS_CERT": str(web_certs.server.cert),
        "STREAMJOIN_WEB_TLS_KEY": str(web_certs.client.key),  # the wrong key
    }
    done = subprocess.run(
        [sys.executable, "-m", "streamjoin.cli", "worker", "-A", "tls_app:app"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert "the private key does not belong to the certificate" in done.stderr
    assert "query client.key" in done.stderr.replace("query-client", "query client")
    assert "unreachable" not in done.stderr  # the broker (nothing on port 9) was not asked


# ------------------------------------------------------------------ secrets in logs


def test_the_log_filter_masks_secrets_in_messages_arguments_and_tracebacks() -> None:
    mask = SecretsFilter(["hunter2", "t'ok\n", ""])
    record = logging.LogRecord(
        "aiokafka.conn",
        logging.DEBUG,
        __file__,
        1,
        "Request %d: %s",
        (7, {"sasl_auth_bytes": b"\x00alice\x00hunter2", "other": "t'ok\n"}),
        None,
    )
    assert mask.filter(record)
    assert "hunter2" not in record.getMessage() and "t\\'ok" not in record.getMessage()
    assert record.getMessage().count(MASK) == 2 and "alice" in record.getMessage()
    try:
        raise ValueError("login with hunter2 failed")
    except ValueError:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "oops", None, sys.exc_info())
    mask.filter(failed)
    text = logging.Formatter().format(failed)
    assert "hunter2" not in text and MASK in text and "ValueError" in text


def test_mask_secrets_in_logs_covers_every_logger_through_the_handlers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        mask = mask_secrets_in_logs(["s3cr3t-value"], [handler])
        logging.getLogger("some.library").warning("token=%s", "s3cr3t-value")
        handler.removeFilter(mask)
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    assert "token=" + MASK in err and "s3cr3t-value" not in err


def test_secrets_of_the_config_reach_the_worker_log_filter(tmp_path: Path) -> None:
    """What ``streamjoin worker`` masks: the query token and the credentials."""
    config = AppConfig("a", query_token="q-tok", client_options={"sasl_password": "k-pw"})
    mask = SecretsFilter(config.secret_values())
    assert mask.mask(json.dumps({"a": "q-tok", "b": "k-pw"})) == json.dumps({"a": MASK, "b": MASK})
