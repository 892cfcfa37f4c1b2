"""Port of Faust's ``examples/windowing/hopping.py``: a counter in hopping windows of 10 s
advancing by 5 s, fed by a reading every 2 s, read back through Faust's windowed-key API.

    streamjoin worker -A examples.from_faust.hopping:app --broker kafka://127.0.0.1:9092

With a reading every 2 s, each 10-second window holds at most 5 of them, so ``now()``,
``current()`` and ``value()`` read between 1 and 5 (Faust's comments say 1-3: its window
is chosen differently), and ``delta(30)``, the window 30 s before the event, reads 0 for
the first 30 s and then 5.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from datetime import timedelta

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.windows import HoppingWindows

log = logging.getLogger(__name__)

PREFIX = os.environ.get("FAUST_PORTS_PREFIX", "")


@dataclass
class Model:
    random: float


app = streamjoin.App(
    f"{PREFIX}windowing", broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092")
)
hopping_topic = app.topic(
    f"{PREFIX}hopping_topic", key_serializer="str", value_serializer=Model, partitions=1
)
# Faust: .hopping(10, 5, expires=timedelta(minutes=10)): kept about 10 minutes from the
# window's start, i.e. 9 min 50 s after its end (streamjoin counts retention from the end)
hopping_table = app.table(
    "hopping_table",
    default=int,
    key_serializer="str",
    copartitioned_with=hopping_topic,
    window=HoppingWindows(
        timedelta(seconds=10),
        timedelta(seconds=5),
        retention=timedelta(minutes=10) - timedelta(seconds=10),
    ),
)


@app.agent(hopping_topic)
async def print_windowed_events(stream: Stream) -> None:
    windows = hopping_table.relative_to_stream()
    async for _event in stream:
        hopping_table.update("counter", lambda n: n + 1)  # (every window of the event)
        value = windows["counter"]
        log.info(
            "now()=%s current()=%s value()=%s delta(30)=%s",
            value.now(),
            value.current(),
            value.value(),
            value.delta(30),
        )


@app.timer(2.0, on_leader=True)
async def publish_every_2secs() -> None:
    # keyed, so the counter's partition is the reading's (Faust sent it without a key)
    await hopping_topic.send(key="counter", value=Model(random=round(random.random(), 2)))
