"""On the real broker: an ``@app.command`` that sends, ``streamjoin send`` end to end (records
read back), a ``group_by`` key its codec refuses, and ``app.serve()`` stopped by Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import streamjoin
from streamjoin.cli import cli
from streamjoin.errors import AgentFailed
from streamjoin.runtime.tasks.agent_runtime import Stream
from tests.integration.support import ROOT, produce, read_all

APP = """
    import os
    from dataclasses import dataclass

    import click
    import streamjoin

    @dataclass
    class Order:
        customer: str
        n: int

    app = streamjoin.App(
        os.environ["SJT_APP_ID"], broker=os.environ["SJT_BROKER"], state_dir=os.environ["SJT_STATE"]
    )
    orders = app.topic(
        os.environ["SJT_TOPIC"], key_serializer="str", value_serializer=Order, partitions=3
    )

    @app.command(click.option("--count", type=int, required=True), click.argument("customer"))
    async def fill(customer, count):
        \"\"\"Send COUNT orders of CUSTOMER.\"\"\"
        async with app.producing():
            for n in range(count):
                await orders.send(key=f"{customer}-{n}", value=Order(customer, n))
        click.echo(f"sent {count}")
"""


def _app_env(
    bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> tuple[dict[str, str], str]:
    (tmp_path / "sj_orders_app.py").write_text(textwrap.dedent(APP))
    topic = unique_topic("orders")
    env = {
        "SJT_APP_ID": unique_topic("app"),
        "SJT_BROKER": f"kafka://{bootstrap}",
        "SJT_STATE": str(tmp_path / "state"),
        "SJT_TOPIC": topic,
    }
    return env, topic


def test_an_app_command_sends_through_the_broker(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    env, topic = _app_env(kafka_bootstrap, unique_topic, tmp_path)
    command = ["-A", "sj_orders_app:app", "fill", "bob", "--count", "5"]
    done = subprocess.run(
        [sys.executable, "-m", "streamjoin.cli", *command],
        cwd=tmp_path,
        env={**os.environ, **env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "sent 5\n"
    records = asyncio.run(read_all(kafka_bootstrap, topic, 5))
    assert sorted((k, json.loads(v)["n"]) for k, v, _ in records) == [
        (f"bob-{n}", n) for n in range(5)
    ]


def test_streamjoin_send_end_to_end(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env, topic = _app_env(kafka_bootstrap, unique_topic, tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sj_orders_app", raising=False)
    runner = CliRunner()
    broker = ["-b", f"kafka://{kafka_bootstrap}"]

    # no -A: the topic must exist
    missing = runner.invoke(cli, ["send", *broker, topic, "x"])
    assert missing.exit_code == 1, missing.output
    assert f"no topic {topic!r} on broker" in missing.output

    # -A: the app's codecs; lines are sent up to the first one that does not fit
    lines = 'alice-1:{"customer": "alice", "n": 1}\nbob-2:{"customer": "bob", "n": 2}\n'
    lines += 'carol-3:{"customer": "carol"}\nnever:{"customer": "dan", "n": 4}\n'
    sent = runner.invoke(
        cli, ["-A", "sj_orders_app:app", "send", topic, "--key-separator", ":"], input=lines
    )
    assert sent.exit_code == 1, sent.output
    assert "stdin line 3: value" in sent.output and "json[Order]" in sent.output
    assert sent.output.count(f"{topic}[") == 2  # topic[partition]@offset of each record sent

    # no -A, now that it exists: raw text, a header
    raw = runner.invoke(cli, ["send", *broker, topic, "--key", "k", "-H", "src=cli", "plain"])
    assert raw.exit_code == 0, raw.output

    records = asyncio.run(read_all(kafka_bootstrap, topic, 3))
    got = {k: (v, h) for k, v, h in records}
    assert set(got) == {"alice-1", "bob-2", "k"}
    assert json.loads(got["alice-1"][0]) == {"customer": "alice", "n": 1}
    assert got["k"] == ("plain", {"src": b"cli"})


async def test_a_group_by_key_its_codec_refuses_names_the_topic_and_the_fix(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app = streamjoin.App(
        unique_topic("app"), broker=f"kafka://{kafka_bootstrap}", state_dir=tmp_path
    )
    source = app.topic(unique_topic("in"), key_serializer="str", value_serializer="json")
    by_n = app.group_by(source, lambda e: e.value["n"], name="by-n", partitions=1)

    @app.agent(by_n)
    async def never(stream: Stream) -> None:
        async for _ in stream:
            pass

    with pytest.raises(AgentFailed) as failed:
        async with app:
            await produce(kafka_bootstrap, source.name, [("a", '{"n": 7}')])
            await asyncio.sleep(60)  # cancelled when the app fails
    said = str(failed.value)  # the agent's error, in the worker's words
    assert "EncodeError: group_by 'by-n'" in said
    assert f"repartition topic '{app.id}-by-n-repartition'" in said
    assert "the key 7 (int)" in said and "key_serializer=" in said


EMBEDDED = """
    import asyncio
    import os
    import sys

    import streamjoin

    app = streamjoin.App(
        os.environ["SJT_APP_ID"], broker=os.environ["SJT_BROKER"], state_dir=os.environ["SJT_STATE"]
    )
    source = app.topic(os.environ["SJT_TOPIC"], partitions=2)

    @app.agent(source)
    async def noop(stream):
        async for _ in stream:
            pass

    if __name__ == "__main__":
        sys.exit(asyncio.run(app.serve()))
"""


def test_an_embedded_app_served_stops_on_ctrl_c_without_a_traceback(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    env, _ = _app_env(kafka_bootstrap, unique_topic, tmp_path)
    script = tmp_path / "embedded.py"
    script.write_text(textwrap.dedent(EMBEDDED))
    stderr = tmp_path / "stderr.txt"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60
        while "running; Ctrl-C to stop" not in stderr.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, stderr.read_text()
            time.sleep(0.1)
        time.sleep(1)  # into the group: its consumer looks up where to start
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = stderr.read_text()
    assert code == 0, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    assert "Failed fetch offsets" not in output  # aiokafka's retried lookup: DEBUG now
