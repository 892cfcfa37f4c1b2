"""``streamjoin send TOPIC``: records from the command line or stdin, for scripts.

With ``-A module:app`` the topic is one the app declares and its codecs apply (the app's
topics are created and checked as its worker's start would); without, the topic must
exist, and the key and value go as ``--key-serializer``/``--value-serializer`` say
(default ``raw``: the text's UTF-8 bytes). Text becomes a value as the codec reads a
record (:func:`value_of_text`), so a value the codec refuses is refused before anything
is sent, naming the line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import click

from streamjoin.app import App
from streamjoin.cli_app import (
    _add_env_client_options,
    _kafka_failure,
    _load,
    broker_option,
    optional_app_option,
)
from streamjoin.codecs import Codec
from streamjoin.context import Delivery
from streamjoin.errors import CodecError, ConfigurationError, StreamjoinError
from streamjoin.topics import Topic

#: how many records are sent before their deliveries are awaited (and printed)
_WINDOW = 1000


def value_of_text(codec: Codec, text: str) -> Any:
    """What ``text`` stands for under ``codec``: the text read as a record's bytes would
    be (``raw`` and ``str`` keep it; JSON codecs parse it, a dataclass codec also checks
    its fields). For a codec whose records are not text (a binary format), the text read
    as JSON, if the codec writes that and reads it back. Raises :class:`CodecError`."""
    try:
        return codec.loads(text.encode())
    except CodecError as exc:
        try:
            parsed = json.loads(text)
            encoded = codec.dumps(parsed)
            if encoded is not None:
                codec.loads(encoded)
        except (ValueError, StreamjoinError):
            raise exc from None
        return parsed


@dataclass(frozen=True)
class _Line:
    where: str
    key: str | None
    value: str | None


def _lines(
    value: str | None, key: str | None, separator: str | None, stdin: TextIO
) -> Iterator[_Line]:
    if value is not None:
        yield _Line("VALUE", key, value)
        return
    for number, line in enumerate(stdin, 1):
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        if separator is None:
            yield _Line(f"stdin line {number}", key, text)
            continue
        line_key, found, line_value = text.partition(separator)
        if not found:
            raise click.ClickException(
                f"stdin line {number}: no key separator {separator!r} in {text!r}"
            )
        yield _Line(f"stdin line {number}", line_key, line_value)


def _convert(topic: Topic, line: _Line, part: str) -> Any:
    """The key or value (``part``) of ``line``, as ``topic``'s codec reads it."""
    text = line.key if part == "key" else line.value
    if text is None:
        return None
    codec = topic.key_codec if part == "key" else topic.value_codec
    try:
        return value_of_text(codec, text)
    except CodecError as exc:
        raise _misfit(topic, line, part, exc) from exc


def _misfit(topic: Topic, line: _Line, part: str, exc: CodecError) -> click.ClickException:
    text = (line.key if part == "key" else line.value) or ""
    shown = text if len(text) <= 60 else text[:57] + "..."
    codec = topic.key_codec if part == "key" else topic.value_codec
    return click.ClickException(
        f"{line.where}: {part} {shown!r} does not fit the {part} codec {codec.name!r} of "
        f"topic {topic.name!r}: {exc}"
    )


def _refused_part(topic: Topic, key: Any) -> str:
    """Which of a record the topic's codecs refused: its key, else its value."""
    try:
        topic.key_codec.dumps(key)
    except CodecError:
        return "key"
    return "value"


def _headers(pairs: tuple[str, ...]) -> list[tuple[str, bytes]]:
    out = []
    for pair in pairs:
        name, found, value = pair.partition("=")
        if not found or not name:
            raise click.ClickException(f"--header {pair!r}: expected NAME=VALUE")
        out.append((name, value.encode()))
    return out


def _topic_of(
    app_spec: str | None, broker: str | None, name: str, key_ser: str | None, value_ser: str | None
) -> tuple[App, Topic, bool]:
    """The app, the topic and whether the app's topics are created (with ``-A``)."""
    if app_spec is not None:
        if key_ser is not None or value_ser is not None:
            raise click.UsageError(
                "--key-serializer/--value-serializer apply without -A; with -A the topic's "
                "own codecs are used"
            )
        app = _load(app_spec, broker)
        topic = app.topics.get(name)
        if topic is None:
            declared = ", ".join(sorted(app.topics)) or "none"
            raise click.ClickException(
                f"app {app.id!r} declares no topic {name!r} (its topics: {declared}); "
                "drop -A to send to any existing topic as text"
            )
        return app, topic, True
    try:
        app = App("streamjoin-send")
        if broker:
            app.configure(broker=broker)
        _add_env_client_options(app)
        topic = app.topic(
            name, key_serializer=key_ser or "raw", value_serializer=value_ser or "raw"
        )
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    return app, topic, False


@click.command("send")
@click.argument("topic_name", metavar="TOPIC")
@click.argument("value", required=False)
@optional_app_option(
    "Use the topic as this app declares it (its codecs); the app's topics are created and "
    "checked as its worker would."
)
@broker_option
@click.option("-k", "--key", default=None, help="The key of every record (text, as VALUE).")
@click.option(
    "--key-separator",
    default=None,
    metavar="SEP",
    help="Read each stdin line as KEY<SEP>VALUE (e.g. --key-separator=:).",
)
@click.option("-p", "--partition", type=click.IntRange(min=0), default=None)
@click.option("-H", "--header", "headers", multiple=True, metavar="NAME=VALUE")
@click.option(
    "--tombstone", is_flag=True, help="Send one record with a null value (deletes --key)."
)
@click.option(
    "--key-serializer", default=None, help="Without -A: the key codec by name (default raw)."
)
@click.option(
    "--value-serializer", default=None, help="Without -A: the value codec by name (default raw)."
)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing for each record sent.")
def send_command(
    topic_name: str,
    value: str | None,
    app_spec: str | None,
    broker: str | None,
    key: str | None,
    key_separator: str | None,
    partition: int | None,
    headers: tuple[str, ...],
    tombstone: bool,
    key_serializer: str | None,
    value_serializer: str | None,
    quiet: bool,
) -> None:
    """Send VALUE (or each line of stdin) to TOPIC; prints topic[partition]@offset of each.

    The text is read as the topic's codec reads a record: with -A, JSON for a JSON or
    dataclass topic (whose fields are checked), as it is for raw and str. Blank stdin lines
    are skipped; a line that does not fit stops the command, after the lines before it
    were sent.
    """
    if key_separator is not None and (key is not None or value is not None):
        raise click.UsageError("--key-separator reads keys from stdin: drop --key and VALUE")
    if tombstone and (value is not None or key is None):
        raise click.UsageError("--tombstone sends a null value for --key: give --key, no VALUE")
    app, topic, create_topics = _topic_of(
        app_spec, broker, topic_name, key_serializer, value_serializer
    )
    record_headers = _headers(headers)
    lines = (
        iter([_Line("--tombstone", key, None)])
        if tombstone
        else _lines(value, key, key_separator, sys.stdin)
    )

    async def send_all() -> None:
        pending: list[Delivery] = []
        async with app.producing(create_topics=create_topics):
            try:
                for line in lines:
                    record_key = _convert(topic, line, "key")
                    record_value = _convert(topic, line, "value")
                    try:
                        sent = await topic.send(
                            key=record_key,
                            value=record_value,
                            headers=record_headers,
                            partition=partition,
                        )
                    except CodecError as exc:  # read, but refused on the way out
                        part = _refused_part(topic, record_key)
                        raise _misfit(topic, line, part, exc) from exc
                    pending.append(sent)
                    if len(pending) >= _WINDOW:
                        await _report(pending, quiet)
            except click.ClickException:
                await _report(pending, quiet)  # the lines before the bad one were sent
                raise
            await _report(pending, quiet)

    try:
        asyncio.run(send_all())
    except (click.ClickException, click.Abort):
        raise
    except Exception as exc:  # the broker, a login, a refused record: one line
        raise _kafka_failure(exc, f"could not send to {topic_name!r}") from exc


async def _report(pending: list[Delivery], quiet: bool) -> None:
    """Await the deliveries sent so far, in order, printing where each record went."""
    for delivery in pending:
        metadata = await delivery
        if not quiet:
            click.echo(f"{metadata.topic}[{metadata.partition}]@{metadata.offset}")
    pending.clear()
