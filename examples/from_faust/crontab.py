"""Port of Faust's ``examples/crontab/tz_aware.py``: a message published every day at 20:16
Pacific time, by one worker of the group, and printed by an agent.

    streamjoin worker -A examples.from_faust.crontab:app --broker kafka://127.0.0.1:9092

Faust needed ``pytz`` (``tz=pytz.timezone("US/Pacific")``); here ``timezone=`` takes the
IANA name (or any ``tzinfo``), daylight saving included.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from datetime import datetime

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream

log = logging.getLogger(__name__)

PREFIX = os.environ.get("FAUST_PORTS_PREFIX", "")


@dataclass
class Model:
    random: float


app = streamjoin.App(
    f"{PREFIX}tz_aware", broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092")
)
tz_aware_topic = app.topic(f"{PREFIX}tz_aware_topic", value_serializer=Model)


@app.agent(tz_aware_topic)
async def consume(stream: Stream) -> None:
    async for record in stream:
        log.info("record: %s", record.value)


@app.crontab("16 20 * * *", timezone="US/Pacific", on_leader=True)
async def publish_at_8_20_pm_pacific() -> None:
    log.info("sending message at %s (due at 20:16 Pacific time)", datetime.now().isoformat())
    await tz_aware_topic.send(value=Model(random=round(random.random(), 2)))
