"""No secret leaks, through the real broker: a worker process of the counter app
(tests/integration/apps/counter.py) runs at DEBUG with distinctive secrets (a query token,
the password of its HTTPS key, a SASL password in its client options, which the
PLAINTEXT broker never asks for), serves its pages and table reads, refuses bad requests,
and a second worker fails to start on a wrong key password. Every log line, HTTP body and
error text is then searched for each secret, in every form it could be written in."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
import uuid
from pathlib import Path

import aiohttp
import pytest

import streamjoin
from streamjoin.config import AppConfig
from streamjoin.errors import ConfigurationError, QueryError, QueryUnauthorized
from streamjoin.query import TableClient
from streamjoin.query.tls import client_context
from tests.integration.support import Workers, produce, wait_for_group
from tests.web_certificates import WebCerts, web_certs

__all__ = ["web_certs"]  # the fixture, used by name

PARTITIONS = 2


def _forms(secret: str) -> set[str]:
    """A secret as text, as a str or bytes repr, and percent-encoded."""
    return {
        secret,
        repr(secret)[1:-1],
        repr(secret.encode())[2:-1],
        urllib.parse.quote(secret, safe=""),
    }


async def _wait_for_log(workers: Workers, name: str, pattern: str) -> re.Match[str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(pattern, workers.log_of(name))
        if found is not None:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"{pattern!r} never logged:\n{workers.logs()}")


async def test_no_secret_reaches_logs_pages_metrics_or_errors(
    kafka_bootstrap: str, counters: Workers, web_certs: WebCerts, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:12]
    token, key_password, sasl_password = f"QT-{tag}", f"KP-{tag}", f"PW-{tag}"
    secrets = (token, key_password, sasl_password)
    locked = web_certs.ca.issue(f"locked-{tag}", password=key_password)
    counters.env.update(
        STREAMJOIN_QUERY_TOKEN=token,
        STREAMJOIN_WEB_TLS_CERT=str(locked.cert),
        STREAMJOIN_WEB_TLS_KEY=str(locked.key),
        STREAMJOIN_WEB_TLS_KEY_PASSWORD=key_password,
        STREAMJOIN_CLIENT_SASL_PLAIN_USERNAME="someone",
        STREAMJOIN_CLIENT_SASL_PLAIN_PASSWORD=sasl_password,
    )
    source = counters.env["SJT_SOURCE"]
    counters.start("w1", extra=["--web-port", "0", "--loglevel", "debug"])
    await produce(kafka_bootstrap, source, [(f"k{i % 3}", f"e{i}") for i in range(30)])
    url = (await _wait_for_log(counters, "w1", r"status page and metrics on (https://\S+)"))[1]
    await wait_for_group(
        kafka_bootstrap, counters.env["SJT_APP_ID"], lambda i: len(i.members) == 1, counters
    )
    texts: list[str] = []

    # pages, metrics and table reads (right token, wrong token, none), bodies kept
    tls = client_context(web_certs.ca.cert)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as session:
        for path, headers, status in [
            ("", {}, 200),
            ("status.json", {}, 200),
            ("metrics", {}, 200),
            ("tables/counts/k1", {"Authorization": f"Bearer {token}"}, 200),
            ("tables/counts/nobody", {"Authorization": f"Bearer {token}"}, 404),
            ("tables/nothing/k1", {"Authorization": f"Bearer {token}"}, 404),
            ("tables/counts/k1", {"Authorization": f"Bearer {token}x"}, 401),
            ("tables/counts/k1", {}, 401),
        ]:
            for _ in range(150):  # routing comes after the first rebalance, counts later
                async with session.get(url + path, headers=headers) as response:
                    body = await response.text()
                if response.status != 503 and (response.status, status) != (404, 200):
                    break
                await asyncio.sleep(0.2)
            assert response.status == status, (path, body)
            texts.append(body)
    assert "records_in" in texts[1] and "# HELP" in texts[2] and '"value"' in texts[3]

    # errors: a client with the wrong token, settings refused with a secret in them
    host = url.removeprefix("https://").rstrip("/")
    client = TableClient([host], token=f"{token}x", ca_file=web_certs.ca.cert, retry_for=5)
    with pytest.raises(QueryUnauthorized) as unauthorized:
        await asyncio.to_thread(client.get, "counts", "k1")
    texts.append(f"{unauthorized.value!r} {unauthorized.value}")
    refused: list[BaseException] = []
    for bad in (
        lambda: AppConfig("x", client_options=[("sasl_plain_password", sasl_password)]),
        lambda: AppConfig("x", query_token=token.encode()),
        lambda: AppConfig("x", web_tls_key_password=key_password),
        lambda: streamjoin.App("x", query_token=token, web_tls_key_password=7),
    ):
        with pytest.raises(ConfigurationError) as error:
            bad()
        refused.append(error.value)
    texts += [f"{e!r} {e}" for e in refused]
    app = streamjoin.App("x", query_token=token, client_options={"sasl_password": sasl_password})
    texts += [repr(app), repr(app.config), str(app.metrics())]
    with pytest.raises(QueryError) as failed:  # the wrong CA
        await asyncio.to_thread(
            TableClient([host], token=token, ca_file=web_certs.other_ca.cert).get, "counts", "k"
        )
    texts.append(str(failed.value))

    # a worker whose key password is wrong does not start: exit 3, and says why
    counters.env["STREAMJOIN_WEB_TLS_KEY_PASSWORD"] = f"{key_password}-wrong"
    counters.start("w2", extra=["--web-port", "0", "--loglevel", "debug"])
    assert await asyncio.to_thread(counters.procs["w2"].wait, 60) == 3
    assert "the key password does not decrypt" in counters.log_of("w2")
    counters.procs.pop("w2")

    assert counters.stop_all() == {"w1": 0}
    log = counters.log_of("w1")
    assert " DEBUG aiokafka" in log  # the clients' own request log was on
    texts += [log, counters.log_of("w2")]
    everything = "\n".join(texts)
    leaks = [(secret, form) for secret in secrets for form in _forms(secret) if form in everything]
    assert leaks == [], leaks
