"""HTTPS on the workers' web servers, through the real broker: two worker processes of the
counter app (tests/integration/apps/counter.py) serve table reads over mutual TLS, the
settings given the CLI way (``STREAMJOIN_WEB_TLS_*``), and forward reads to each other
over HTTPS; ``TableClient`` and ``streamjoin table get --remote`` verify them against the
CA and are refused with the wrong one (without a client certificate: tests/unit/test_web_tls.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter

from streamjoin.errors import KeyNotFound, QueryError
from streamjoin.query import TableClient
from tests.integration.support import Workers, produce, sizes, wait_for_group
from tests.web_certificates import WebCerts, web_certs

__all__ = ["web_certs"]  # the fixture, used by name

PARTITIONS = 4
TOKEN = "tls-test-token"


async def _read_all(
    client: TableClient, truth: Counter[str], workers: Workers
) -> dict[str, dict[str, object]]:
    """Every key's answer once every count is the true one (the workers catch up)."""
    deadline = time.monotonic() + 45
    answers: dict[str, dict[str, object]] = {}
    last: Exception | None = None
    while True:
        try:
            answers = {
                key: await asyncio.to_thread(client.get, "counts", key) for key in sorted(truth)
            }
            if all(answers[k]["value"] == n for k, n in truth.items()):
                return answers
        except (KeyNotFound, QueryError) as exc:
            last = exc
        assert time.monotonic() < deadline, (
            f"counts never matched: {answers}; last error: {last!r}\n{workers.logs()}"
        )
        await asyncio.sleep(0.3)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAMJOIN_QUERY_TOKEN": TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "streamjoin.cli", "table", "get", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


async def test_two_workers_serve_https_and_forward_reads_over_mutual_tls(
    kafka_bootstrap: str, counters: Workers, web_certs: WebCerts
) -> None:
    ca = str(web_certs.ca.cert)
    counters.env.update(
        STREAMJOIN_WEB_TLS_CERT=str(web_certs.server.cert),
        STREAMJOIN_WEB_TLS_KEY=str(web_certs.server.key),
        STREAMJOIN_WEB_TLS_CLIENT_CA=ca,
        STREAMJOIN_WEB_TLS_CA=ca,
        STREAMJOIN_QUERY_TOKEN=TOKEN,
    )
    source = counters.env["SJT_SOURCE"]
    for name in ("w1", "w2"):
        counters.start(name, extra=["--web-port", "0"])
    keys = [f"user-{i}" for i in range(16)]
    events = [(keys[i % len(keys)], f"e{i}") for i in range(160)]
    truth = Counter(k for k, _ in events)
    await produce(kafka_bootstrap, source, events)
    info = await wait_for_group(
        kafka_bootstrap,
        counters.env["SJT_APP_ID"],
        lambda i: sizes(i, source) == [2, 2] and all(m.host for m in i.members),
        counters,
    )
    hosts = sorted(str(m.host) for m in info.members)
    client_cert = {
        "ca_file": web_certs.ca.cert,
        "cert_file": web_certs.client.cert,
        "key_file": web_certs.client.key,
    }
    # every read asked of the first worker: its own keys, and the others' forwarded
    client = TableClient([hosts[0]], token=TOKEN, retry_for=20, **client_cert)
    answers = await _read_all(client, truth, counters)
    assert {a["served_by"] for a in answers.values()} == set(hosts), answers

    key = keys[3]
    base = [f"--remote=https://{hosts[0]}", f"--ca-file={ca}"]
    mine = [f"--cert-file={web_certs.client.cert}", f"--key-file={web_certs.client.key}"]
    done, wrong_ca = await asyncio.gather(
        asyncio.to_thread(_cli, *base, *mine, "counts", key),
        asyncio.to_thread(
            _cli,
            f"--remote={hosts[0]}",
            f"--ca-file={web_certs.other_ca.cert}",
            *mine,
            "counts",
            key,
        ),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(truth[key])
    assert f"served by {hosts[0]}" in done.stderr or f"served by {hosts[1]}" in done.stderr
    assert wrong_ca.returncode == 1 and "certificate was not accepted" in wrong_ca.stderr
    assert counters.stop_all() == {"w1": 0, "w2": 0}
