"""How a worker process behaves when things go wrong: exit codes, a broker that is not there
(at start, or going away), a stop that cannot finish, and what its log says meanwhile.

The broker-outage tests run a broker of their own (never the session's shared one) and stop
it under the worker.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streamjoin.local_kafka import LocalKafka, free_port
from tests.integration.support import ROOT, Workers, produce, read_all, wait_for_group

#: the stop bound the outage tests give their workers, and the slack they allow on top
SHUTDOWN_TIMEOUT = 8
SLACK = 4


def faulty_workers(
    bootstrap: str, unique_topic: Callable[..., str], log_dir: Path, **env: str
) -> Workers:
    log_dir.mkdir(parents=True, exist_ok=True)
    environment = {
        **os.environ,
        "SJT_APP_ID": unique_topic("faulty"),
        "SJT_BROKER": f"kafka://{bootstrap}",
        "SJT_SOURCE": unique_topic("src"),
        "SJT_SINK": unique_topic("sink"),
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    return Workers("tests.integration.apps.faulty:app", environment, log_dir)


def lines(text: str, pattern: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(pattern, line)]


def assert_no_tracebacks(log: str) -> None:
    assert "Traceback" not in log, log
    assert "never retrieved" not in log, log
    assert not lines(log, r"\baiokafka\b"), log  # no client internals at INFO


class OwnBroker:
    """A broker of one test's own, on a port chosen in advance (so it can start late)."""

    def __init__(self) -> None:
        self.bootstrap = f"127.0.0.1:{free_port()}"
        self.kafka = LocalKafka(broker_port=int(self.bootstrap.rpartition(":")[2]))

    async def start(self) -> str:
        await asyncio.to_thread(self.kafka.start)
        return self.bootstrap

    async def stop(self) -> None:
        await asyncio.to_thread(self.kafka.stop)


@pytest.fixture
def own_broker() -> Iterator[OwnBroker]:
    broker = OwnBroker()
    yield broker
    broker.kafka.stop()


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    code = proc.wait(timeout)
    return code, time.monotonic() - started


# -- exit codes ------------------------------------------------------------------------------


def _cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [sys.executable, "-m", "streamjoin.cli", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cannot_start_exits_3_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken_syntax.py").write_text(
        "import streamjoin\napp = streamjoin.App('x'\nx = = 1\n"
    )
    (tmp_path / "raises_at_import.py").write_text(
        "import streamjoin\n\nraise RuntimeError('boom')\n"
    )
    (tmp_path / "fine.py").write_text(
        "import streamjoin\napp = streamjoin.App('x')\nnot_an_app = 1\n"
    )
    cases = {
        "broken_syntax:app": r"broken_syntax\.py:2: SyntaxError",
        "raises_at_import:app": r"raises_at_import\.py:3: RuntimeError: boom",
        "no_such_module:app": r"module 'no_such_module' was not found",
        "fine:not_an_app": r"is a int, not a streamjoin\.App",
    }
    for spec, expected in cases.items():
        done = _cli("worker", "-A", spec, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
        assert done.returncode == 3, (spec, done.stderr)
        assert re.search(expected, done.stderr), (spec, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "importlib" not in done.stderr and "Traceback" not in done.stderr
    # a bad setting is "cannot start" too; an unknown option is click's usage error
    bad = _cli(
        "worker",
        "-A",
        "fine:app",
        "--startup-timeout",
        "-1",
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert bad.returncode == 3 and "startup_timeout must be > 0" in bad.stderr, bad.stderr
    usage = _cli("worker", "-A", "fine:app", "--no-such-option", cwd=tmp_path)
    assert usage.returncode == 2


def test_a_broker_that_never_answers_is_cannot_start_after_the_startup_timeout(
    tmp_path: Path,
) -> None:
    """It used to be a traceback after half a second."""
    port = free_port()
    (tmp_path / "app1.py").write_text(
        f"import streamjoin\napp = streamjoin.App('x', broker='kafka://127.0.0.1:{port}')\n"
        "t = app.topic('t')\n\n@app.agent(t)\nasync def a(stream):\n"
        "    async for _ in stream:\n        pass\n"
    )
    started = time.monotonic()
    done = _cli(
        "worker",
        "-A",
        "app1:app",
        "--startup-timeout",
        "4",
        "--state-dir",
        str(tmp_path / "s"),
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT)},
    )
    took = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert 4 <= took < 4 + SLACK + 3, took
    assert f"broker 127.0.0.1:{port} unreachable for 4 s at start" in done.stderr, done.stderr
    assert_no_tracebacks(done.stderr)
    assert len(lines(done.stderr, "ERROR")) == 1, done.stderr


async def test_clean_stop_exits_0_without_error_lines_and_a_processing_failure_exits_1(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = faulty_workers(kafka_bootstrap, unique_topic, tmp_path)
    try:
        group, source, sink = (workers.env[k] for k in ("SJT_APP_ID", "SJT_SOURCE", "SJT_SINK"))
        workers.start("clean", static=False)
        await wait_for_group(kafka_bootstrap, group, lambda i: len(i.members) == 1, workers)
        await produce(kafka_bootstrap, source, [("a", "x"), ("b", "y")])
        await read_all(kafka_bootstrap, sink, 2)
        assert workers.stop("clean") == 0
        log = workers.log_of("clean")
        assert not lines(log, r"\b(ERROR|CRITICAL)\b"), log
        assert_no_tracebacks(log)
        assert not lines(log, "Terminating cancelled task|Starting\\.\\.\\.|Stopping\\.\\.\\."), log

        workers.start("failing", static=False)
        await produce(kafka_bootstrap, source, [("c", "poison")])
        code, _ = _wait(workers.procs.pop("failing"), 60)
        assert code == 1
        log = workers.log_of("failing")
        assert_no_tracebacks(log)
        final = lines(log, "worker stopped after a fatal error")
        assert len(final) == 1 and "poison record" in final[0], log
        assert lines(log, r"faulty\.py:\d+"), log  # where the agent raised
    finally:
        workers.close()


# -- the broker goes away --------------------------------------------------------------------


async def test_sigterm_while_the_broker_is_unreachable_ends_within_the_shutdown_timeout(
    own_broker: OwnBroker, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    bootstrap = await own_broker.start()
    workers = faulty_workers(bootstrap, unique_topic, tmp_path)
    try:
        source, sink = workers.env["SJT_SOURCE"], workers.env["SJT_SINK"]
        workers.start("w", static=False, extra=["--shutdown-timeout", str(SHUTDOWN_TIMEOUT)])
        await wait_for_group(
            bootstrap, workers.env["SJT_APP_ID"], lambda i: len(i.members) == 1, workers
        )
        await produce(bootstrap, source, [("a", "1"), ("b", "2")])
        await read_all(bootstrap, sink, 2)
        await own_broker.stop()
        await asyncio.sleep(13)  # long enough for one periodic line
        proc = workers.procs.pop("w")
        proc.send_signal(signal.SIGTERM)
        code, took = _wait(proc, SHUTDOWN_TIMEOUT + SLACK + 30)
        log = workers.log_of("w")
        assert took <= SHUTDOWN_TIMEOUT + SLACK, (took, log)
        assert code == 1, log
        assert_no_tracebacks(log)
        errors = lines(log, r"\bERROR\b")
        assert len(errors) == 1, log
        assert re.search(r"unreachable|did not finish", errors[0]), errors
        # one line when the outage began, then one every 10 s: not hundreds a second
        outage = lines(log, r"broker 127\.0\.0\.1:\d+ unreachable")
        assert 2 <= len(outage) <= 4, log
        assert any(re.search(r"unreachable for 1\d s; retrying", line) for line in outage), log
        assert len(log.splitlines()) < 40, log
    finally:
        workers.close()


async def test_a_fatal_error_while_the_broker_is_unreachable_ends_within_the_shutdown_timeout(
    own_broker: OwnBroker, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    bootstrap = await own_broker.start()
    workers = faulty_workers(bootstrap, unique_topic, tmp_path)
    try:
        workers.start("w", static=False, extra=["--shutdown-timeout", str(SHUTDOWN_TIMEOUT)])
        await wait_for_group(
            bootstrap, workers.env["SJT_APP_ID"], lambda i: len(i.members) == 1, workers
        )
        await produce(bootstrap, workers.env["SJT_SOURCE"], [("a", "fail-after-4")])
        await asyncio.sleep(1)
        await own_broker.stop()  # the agent fails 3 s later, with the broker gone
        proc = workers.procs.pop("w")
        code, took = _wait(proc, 4 + SHUTDOWN_TIMEOUT + SLACK + 30)
        log = workers.log_of("w")
        assert code == 1, log
        assert took <= 4 + SHUTDOWN_TIMEOUT + SLACK, (took, log)
        assert_no_tracebacks(log)
        final = lines(log, "worker stopped after a fatal error")
        assert len(final) == 1 and "failed after waiting" in final[0], log
    finally:
        workers.close()


async def test_a_stop_stuck_in_an_event_is_abandoned_after_the_shutdown_timeout(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = faulty_workers(kafka_bootstrap, unique_topic, tmp_path)
    try:
        workers.start("w", static=False, extra=["--shutdown-timeout", "3"])
        await wait_for_group(
            kafka_bootstrap, workers.env["SJT_APP_ID"], lambda i: len(i.members) == 1, workers
        )
        await produce(kafka_bootstrap, workers.env["SJT_SOURCE"], [("a", "hang")])
        await asyncio.sleep(2)
        proc = workers.procs.pop("w")
        proc.send_signal(signal.SIGTERM)
        code, took = _wait(proc, 60)
        log = workers.log_of("w")
        assert code == 1 and took <= 3 + SLACK, (took, log)
        assert_no_tracebacks(log)
        assert len(lines(log, r"stop did not finish within 3 s")) == 1, log
    finally:
        workers.close()


async def test_a_broker_that_starts_late_is_waited_for(
    own_broker: OwnBroker, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The worker starts first and retries (one line per 10 s) until the broker answers."""
    bootstrap = own_broker.bootstrap
    workers = faulty_workers(bootstrap, unique_topic, tmp_path)
    try:
        workers.start("w", static=False, extra=["--startup-timeout", "90"])
        await asyncio.sleep(12)
        assert workers.procs["w"].poll() is None, workers.log_of("w")
        await own_broker.start()
        await wait_for_group(
            bootstrap, workers.env["SJT_APP_ID"], lambda i: len(i.members) == 1, workers
        )
        await produce(bootstrap, workers.env["SJT_SOURCE"], [("a", "1")])
        assert len(await read_all(bootstrap, workers.env["SJT_SINK"], 1)) == 1
        log = workers.log_of("w")
        waiting = lines(log, r"broker 127\.0\.0\.1:\d+ unreachable for \d+ s; retrying")
        assert 1 <= len(waiting) <= 3, log
        assert lines(log, r"reachable after \d+ s"), log
        assert_no_tracebacks(log)
        assert workers.stop("w") == 0
    finally:
        workers.close()


# -- async with app --------------------------------------------------------------------------


def _failing_app(bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path):
    import streamjoin
    from streamjoin.runtime.tasks.agent_runtime import Stream

    app = streamjoin.App(
        unique_topic("app"), broker=f"kafka://{bootstrap}", commit_interval=0.2, state_dir=tmp_path
    )
    source = app.topic(
        unique_topic("in"), key_serializer="str", value_serializer="str", partitions=1
    )

    @app.agent(source)
    async def fail(stream: Stream) -> None:
        async for event in stream:
            raise ValueError(f"cannot take {event.value}")

    return app, source.name


async def test_async_with_app_cancels_the_body_and_raises_what_stopped_the_app(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    from streamjoin.errors import AgentFailed

    app, source = _failing_app(kafka_bootstrap, unique_topic, tmp_path)
    reached_the_end = False
    started = time.monotonic()
    with pytest.raises(AgentFailed, match="cannot take boom"):
        async with app:
            await produce(kafka_bootstrap, source, [("a", "boom")])
            await asyncio.sleep(60)  # cancelled when the app fails
            reached_the_end = True
    assert not reached_the_end and time.monotonic() - started < 30
    assert not app.running
    # the task running the test was not left cancelled
    await asyncio.sleep(0)


async def test_async_with_app_raises_at_exit_when_the_app_failed_during_the_body(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    from streamjoin.errors import AgentFailed

    app, source = _failing_app(kafka_bootstrap, unique_topic, tmp_path)
    with pytest.raises(AgentFailed, match="cannot take boom"):
        async with app:
            await produce(kafka_bootstrap, source, [("a", "boom")])
            while app.failure is None:  # noqa: ASYNC110 (what a user would write)
                await asyncio.sleep(0.05)
            # (the body is cancelled as the failure arrives: a loop like this never spins)
    # an error of the body itself wins over the app's
    app2, _ = _failing_app(kafka_bootstrap, unique_topic, tmp_path / "2")
    with pytest.raises(KeyError):
        async with app2:
            raise KeyError("the body's own error")


# -- logs ------------------------------------------------------------------------------------


async def test_log_of_a_rebalance_a_skipped_record_and_late_events(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """At INFO: one line per rebalance, one line per skipped record (no traceback), late
    events summarized with a count, nothing of aiokafka or mode."""
    workers = faulty_workers(
        kafka_bootstrap,
        unique_topic,
        tmp_path,
        SJT_ON_ERROR="skip",
        SJT_LEFT=unique_topic("left"),
        SJT_RIGHT=unique_topic("right"),
        SJT_JOINED=unique_topic("joined"),
    )
    env = workers.env
    group = env["SJT_APP_ID"]
    try:
        workers.start("w1", static=False)
        await wait_for_group(kafka_bootstrap, group, lambda i: len(i.members) == 1, workers)
        workers.start("w2", static=False)
        await wait_for_group(
            kafka_bootstrap,
            group,
            lambda i: len(i.members) == 2 and all(i.members[k].active for k in range(2)),
            workers,
        )
        await produce(kafka_bootstrap, env["SJT_SOURCE"], [("a", "1"), ("a", "poison"), ("a", "2")])
        await read_all(kafka_bootstrap, env["SJT_SINK"], 2)
        # a late event: stream time moves to now, then 50 events an hour old, one key
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            now = int(time.time() * 1000)
            await producer.send_and_wait(env["SJT_LEFT"], b"fresh", key=b"k", timestamp_ms=now)
            for i in range(50):
                await producer.send(
                    env["SJT_LEFT"], b"old", key=b"k", timestamp_ms=now - 3_600_000 + i
                )
            await producer.flush()
        finally:
            await producer.stop()
        await asyncio.sleep(3)
        codes = workers.stop_all()
        assert codes == {"w1": 0, "w2": 0}, workers.logs()
        logs = {name: workers.log_of(name) for name in ("w1", "w2")}
        both = "\n".join(logs.values())
        assert_no_tracebacks(both)
        assert not lines(both, r"\bmode\b|Terminating cancelled task|\[\^"), both
        # w1 saw two rebalances (alone, then with w2) and the stop of w2 maybe a third;
        # each is one "rebalance done" line
        for name, log in logs.items():
            done = lines(log, "rebalance done")
            assert 1 <= len(done) <= 3, (name, log)
            assert len(lines(log, "rebalance (started|begins)")) <= len(done), log
        skipped = lines(both, "; skipped")
        assert len(skipped) == 1 and "poison record" in skipped[0], both
        late = lines(both, "late and dropped")
        assert 1 <= len(late) <= 2, both  # the first at once; the rest counted (30 s period)
    finally:
        workers.close()
