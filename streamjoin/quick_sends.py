"""A record sent without awaiting: the per-record part of :meth:`Topic.try_send
<streamjoin.topics.Topic.try_send>`, from the encoding to the sender's open batch.

Compiled with mypyc (:mod:`streamjoin.compiled`): every record an enriching join sends
passes here, and the join's compiled code calls it directly. The topic's checks of its
caller's arguments stay in :class:`~streamjoin.topics.Topic` (interpreted), so a bad
argument is refused there, with the topic's own error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

from streamjoin.codecs import Codec
from streamjoin.context import Delivery, RuntimeLink, current_event
from streamjoin.quick_codecs import dump
from streamjoin.quick_partition import partition_of

__all__ = ["QuickOutput", "SendingTopic", "try_send_record"]

#: (``Final``: a C static when compiled, not a module dict lookup per use)
_CURRENT_EVENT: Final = current_event


class SendingTopic(Protocol):
    """What :func:`try_send_record` reads of a :class:`~streamjoin.topics.Topic`."""

    name: str
    key_codec: Codec
    value_codec: Codec
    partitions: int | None
    link: RuntimeLink


def try_send_record(
    topic: SendingTopic,
    key: Any,
    value: Any,
    headers: Any,
    partition: Any,
    timestamp_ms: int | None,
) -> Delivery | None:
    """Encode and send one record to ``topic`` at once, tracked on the event being
    processed; None when it cannot join an open batch now (then ``await topic.send()``
    the same record). ``timestamp_ms`` is checked already; ``headers`` a sequence."""
    link = topic.link
    name = topic.name
    sender = link.sender
    if sender is None:
        sender = link.require_sender(name)
    key_bytes = dump(topic.key_codec, key)
    value_bytes = dump(topic.value_codec, value)
    if partition is None and key_bytes is not None:
        partitions = topic.partitions or link.partitions.get(name)
        if not partitions:
            return None
        partition = partition_of(key_bytes, partitions)
    sent = sender.send_now(
        (name, key_bytes, value_bytes, partition, list(headers) if headers else (), timestamp_ms)
    )
    if sent is not None:
        event = _CURRENT_EVENT.get()
        if event is not None:
            event.track_send(sent)
    return sent


class QuickOutput:
    """One topic's :func:`try_send_record`, with what it reads of the topic resolved
    ahead: its name and codecs (fixed by its declaration) once, its link's sender and its
    partition count once per batch of events by :meth:`ready`. A join sending a result
    for every event of a batch reads the (interpreted) topic's attributes once, not for
    each record."""

    def __init__(self, topic: SendingTopic) -> None:
        self.topic = topic
        self.name = topic.name
        self.key_codec = topic.key_codec
        self.value_codec = topic.value_codec
        self.partitions = 0
        self._send_now: Callable[[Any], Delivery | None] | None = None

    def ready(self) -> bool:
        """Resolve the sender and the partition count now; False when records must take
        the long way (``await topic.send()``: the app is not running, or the topic's
        partition count is not known yet)."""
        topic = self.topic
        link = topic.link
        sender = link.sender
        partitions = topic.partitions or link.partitions.get(self.name)
        if sender is None or not partitions:
            self._send_now = None
            return False
        self._send_now = sender.send_now
        self.partitions = partitions
        return True

    def send(self, key: Any, value: Any, timestamp_ms: int) -> Delivery | None:
        """Encode and send one record (no headers, partitioned by its key) at once, as
        :func:`try_send_record` does, once :meth:`ready` said True; None when it cannot
        join an open batch now (then ``await topic.send()`` it). Not tracked on the event:
        the caller, which has it at hand, does that. ``timestamp_ms`` is checked already."""
        send_now = self._send_now
        if send_now is None:
            return None
        key_bytes = dump(self.key_codec, key)
        value_bytes = dump(self.value_codec, value)
        partition = None if key_bytes is None else partition_of(key_bytes, self.partitions)
        return send_now((self.name, key_bytes, value_bytes, partition, (), timestamp_ms))
