"""Workers, the CLI and the Spark twin against a secured broker: SASL_SSL, SCRAM-SHA-512, ACLs.

The broker (this module's own, :class:`SecureLocalKafka`) allows nothing without an ACL.
Each test's app gets exactly what ``streamjoin acls`` computes for it
(:func:`streamjoin.acls.required_acls`), granted to the user ``worker``; the workers and
CLI commands log in the documented way (``STREAMJOIN_CLIENT_*`` variables, the password
from a file). The test itself produces and reads through the broker's PLAINTEXT set-up
listener. Refusals (a wrong password, an unknown user, a missing ACL) must end a worker
or a command with exit code 3 and one line naming what was refused, and no credential
may appear in any output.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import streamjoin
from streamjoin.acls import Acl, required_acls
from streamjoin.loader import load_app
from streamjoin.local_kafka import free_port
from streamjoin.local_kafka_security import ScramUser, SecureLocalKafka
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import (
    ROOT,
    Workers,
    ledger_workers,
    produce,
    read_to_end,
    wait_all_committed,
)

PARTITIONS = 2
WORKER = ScramUser("worker", "wOrKeR-s3cret-pw")
#: strings that must never appear in a log or an error (the test's passwords)
SECRETS = (WORKER.password, "not-the-password")
LEDGER = "tests.integration.apps.ledger:app"


@pytest.fixture(scope="module")
def secure_kafka() -> Iterator[SecureLocalKafka]:
    with SecureLocalKafka([WORKER], heap="384m") as kafka:
        yield kafka


def login_env(kafka: SecureLocalKafka, tmp_path: Path, user: str, password: str) -> dict[str, str]:
    """The documented way to give the CLI credentials: variables, the password in a file."""
    secret = tmp_path / f"{user}.password"
    secret.write_text(password + "\n")
    return {
        "STREAMJOIN_CLIENT_SECURITY_PROTOCOL": "SASL_SSL",
        "STREAMJOIN_CLIENT_SASL_MECHANISM": "SCRAM-SHA-512",
        "STREAMJOIN_CLIENT_SASL_PLAIN_USERNAME": user,
        "STREAMJOIN_CLIENT_SASL_PLAIN_PASSWORD_FILE": str(secret),
        "STREAMJOIN_CLIENT_SSL_CAFILE": str(kafka.ca_file),
    }


def ledger(
    kafka: SecureLocalKafka,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    guarantee: str,
    *,
    user: str = WORKER.name,
    password: str = WORKER.password,
) -> Workers:
    """Workers of the ledger app logging in to the secured listener."""
    workers = ledger_workers(
        kafka.bootstrap_servers, unique_topic, tmp_path / "logs", guarantee, PARTITIONS
    )
    workers.env.update(login_env(kafka, tmp_path, user, password))
    return workers


def app_acls(workers: Workers, principal: str = WORKER.principal) -> list[Acl]:
    """What ``streamjoin acls`` computes for the ledger app of ``workers``."""
    saved = dict(os.environ)
    os.environ.update(workers.env)
    try:
        sys.modules.pop("tests.integration.apps.ledger", None)
        app = load_app(LEDGER)
        return required_acls(app.topology(), app.config, principal)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        sys.modules.pop("tests.integration.apps.ledger", None)


async def prepare(kafka: SecureLocalKafka, workers: Workers, acls: Sequence[Acl]) -> None:
    """Input and output topics made by the admin (the app may not create them), the ACLs."""
    admin = kafka.internal_bootstrap_servers
    names = (workers.env["SJT_SOURCE"], workers.env["SJT_OUTPUT"])
    await ensure_topics(admin, [TopicSpec(n, PARTITIONS) for n in names])
    await kafka.grant(acls)


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamjoin.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"a password leaked into:\n{text[-3000:]}"


async def wait_exit(workers: Workers, name: str, timeout: float = 45) -> int:
    """The exit code of a worker expected to stop by itself."""
    proc = workers.procs[name]
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"{name} did not exit\n{workers.log_of(name)}"
        await asyncio.sleep(0.2)
    workers.procs.pop(name)
    return proc.returncode


async def test_worker_and_cli_run_with_exactly_the_acls_they_list(
    secure_kafka: SecureLocalKafka, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """At-least-once ledger worker with least privilege; the CLI's assignment, offsets show
    and table get --remote through it; every input answered; no password in any output."""
    workers = ledger(secure_kafka, unique_topic, tmp_path, "at_least_once")
    env = workers.env
    try:
        listed = cli(env, "acls", "-A", LEDGER)
        assert listed.returncode == 0, listed.stderr
        acls = app_acls(workers)
        for acl in acls:  # the CLI prints what the tests grant
            assert f"{acl.resource_type}  " in listed.stdout and acl.operation in listed.stdout
        await prepare(secure_kafka, workers, acls)
        admin = secure_kafka.internal_bootstrap_servers
        inputs = [(f"k{i % 5}", f"e{i}") for i in range(40)]
        await produce(admin, env["SJT_SOURCE"], inputs)
        web_port = free_port()
        workers.start("w1", extra=["--web-port", str(web_port)])
        await wait_all_committed(admin, workers, "w1", partitions=PARTITIONS)
        outputs = await read_to_end(admin, env["SJT_OUTPUT"], PARTITIONS)
        answered = {json.loads(value)["id"] for _, value in outputs}
        assert answered == {value for _, value in inputs}

        assignment = cli(env, "assignment", "-A", LEDGER)
        assert assignment.returncode == 0, assignment.stderr
        assert "1 members" in assignment.stdout and "w1" in assignment.stdout
        offsets = cli(env, "offsets", "show", "-A", LEDGER)
        assert offsets.returncode == 0, offsets.stderr
        assert "1 active members" in offsets.stdout
        got = cli(env, "table", "get", "--remote", f"127.0.0.1:{web_port}", "counts", "k3")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout) == 8
        assert workers.stop("w1") == 0
        assert_no_secret(workers.log_of("w1"), listed.stdout, assignment.stdout + assignment.stderr)
    finally:
        workers.close()


async def test_exactly_once_worker_with_least_privilege(
    secure_kafka: SecureLocalKafka, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = ledger(secure_kafka, unique_topic, tmp_path, "exactly_once")
    env = workers.env
    try:
        acls = app_acls(workers)
        assert any(a.resource_type == "TRANSACTIONAL_ID" for a in acls)
        await prepare(secure_kafka, workers, acls)
        admin = secure_kafka.internal_bootstrap_servers
        inputs = [(f"k{i % 4}", f"e{i}") for i in range(30)]
        await produce(admin, env["SJT_SOURCE"], inputs)
        workers.start("w1")
        await wait_all_committed(admin, workers, "w1", partitions=PARTITIONS)
        outputs = await read_to_end(admin, env["SJT_OUTPUT"], PARTITIONS)
        ids = sorted(json.loads(value)["id"] for _, value in outputs)
        assert ids == sorted(value for _, value in inputs)  # each once, read committed
        assert workers.stop("w1") == 0
        assert_no_secret(workers.log_of("w1"))
    finally:
        workers.close()


@pytest.mark.parametrize(
    ("user", "password"),
    [(WORKER.name, "not-the-password"), ("nobody", "not-the-password")],
    ids=["wrong-password", "unknown-user"],
)
async def test_a_refused_login_stops_worker_and_cli_with_exit_3(
    secure_kafka: SecureLocalKafka,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    user: str,
    password: str,
) -> None:
    workers = ledger(
        secure_kafka, unique_topic, tmp_path, "at_least_once", user=user, password=password
    )
    try:
        workers.start("w1")
        assert await wait_exit(workers, "w1") == 3
        log = workers.log_of("w1")
        assert "refused the login" in log and f"user {user!r}" in log
        assert "Traceback" not in log
        assert log.count("refused the login") == 1, log
        shown = cli(workers.env, "offsets", "show", "-A", LEDGER)
        assert shown.returncode == 3 and "refused the login" in shown.stderr, shown.stderr
        assert_no_secret(log, shown.stdout + shown.stderr)
    finally:
        workers.close()


def without_group(acls: list[Acl]) -> list[Acl]:
    return [a for a in acls if a.resource_type != "GROUP"]


def output_described_only(acls: list[Acl]) -> list[Acl]:
    """The output may be described (so the worker starts) but not written."""
    kept = [a for a in acls if not (a.operation == "WRITE" and a.why == "output topic")]
    output = next(a for a in acls if a.why == "output topic")
    return [*kept, Acl("TOPIC", "LITERAL", output.name, "DESCRIBE", output.principal)]


def without_output(acls: list[Acl]) -> list[Acl]:
    return [a for a in acls if a.why != "output topic"]


def without_transactional_ids(acls: list[Acl]) -> list[Acl]:
    return [a for a in acls if a.resource_type != "TRANSACTIONAL_ID"]


@pytest.mark.parametrize(
    ("grant", "guarantee", "refused"),
    [
        (without_group, "at_least_once", "refused access to consumer group {SJT_APP_ID!r}"),
        (output_described_only, "at_least_once", "refused access to topic {SJT_OUTPUT!r}"),
        (without_output, "at_least_once", "refused to describe topic {SJT_OUTPUT!r}"),
        (without_transactional_ids, "exactly_once", "refused the transactional id"),
    ],
    ids=["no-group-read", "no-output-write", "no-output-describe", "no-transactional-id"],
)
async def test_a_missing_acl_stops_the_worker_with_exit_3_naming_it(
    secure_kafka: SecureLocalKafka,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    grant: Callable[[list[Acl]], list[Acl]],
    guarantee: str,
    refused: str,
) -> None:
    workers = ledger(secure_kafka, unique_topic, tmp_path, guarantee)
    try:
        await prepare(secure_kafka, workers, grant(app_acls(workers)))
        admin = secure_kafka.internal_bootstrap_servers
        await produce(admin, workers.env["SJT_SOURCE"], [("k", "e0")])
        workers.start("w1")
        assert await wait_exit(workers, "w1") == 3
        log = workers.log_of("w1")
        assert refused.format(**workers.env) in log, log
        assert "retrying" not in log and "Traceback" not in log, log
        assert_no_secret(log)
    finally:
        workers.close()


#: the app ``streamjoin bootstrap -A tests.integration.test_security:spark_app`` runs
#: (set by the Spark test: the CLI finds it in this already imported module)
spark_app: streamjoin.App | None = None


@pytest.mark.spark
async def test_spark_bootstrap_reads_and_writes_through_the_secured_listener(
    secure_kafka: SecureLocalKafka, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The CLI's ``bootstrap`` (Spark's Kafka source on the JVM, the changelog written from
    Spark tasks, the group committed) logs in with the same variables as the worker."""
    from click.testing import CliRunner

    from streamjoin.cli import cli as streamjoin_cli
    from streamjoin.spark.testing import shared_test_session

    global spark_app
    app = streamjoin.App(unique_topic("boot"), broker=f"kafka://{secure_kafka.bootstrap_servers}")
    source = app.topic(unique_topic("profiles"), key_serializer="str", partitions=PARTITIONS)
    app.topic_table(source, name="profiles")
    spark_app = app
    acls = required_acls(app.topology(), app.config, WORKER.principal)
    admin = secure_kafka.internal_bootstrap_servers
    await ensure_topics(admin, [TopicSpec(source.name, PARTITIONS)])
    await secure_kafka.grant(acls)
    history = [(f"user-{i % 7}", json.dumps({"v": i})) for i in range(30)]
    await produce(admin, source.name, history)

    await asyncio.to_thread(shared_test_session)  # the CLI's job runs on this session
    env = login_env(secure_kafka, tmp_path, WORKER.name, WORKER.password)
    args = ["bootstrap", "profiles", "-A", f"{__name__}:spark_app", "--quiet"]
    args += ["--from-kafka", secure_kafka.bootstrap_servers]
    result = await asyncio.to_thread(
        CliRunner().invoke, streamjoin_cli, args, env=env, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "30 records -> 7 keys" in result.output, result.output
    changelog = await read_to_end(admin, f"{app.id}-profiles-changelog", PARTITIONS)
    assert {k: json.loads(v) for k, v in changelog} == {
        f"user-{i % 7}": {"v": i} for i in range(23, 30)
    }
    assert_no_secret(result.output)
