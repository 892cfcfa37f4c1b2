"""A small stateless streamjoin app: validate raw ad clicks and route them by campaign.

    streamjoin worker -A examples.click_router:app --broker kafka://127.0.0.1:9092

Reads JSON clicks from ``clicks`` (keyed by user id), drops nothing silently:
malformed clicks go to the dead-letter topic ``click-router-route-dead-letters``
with the error in their headers, valid ones are re-keyed by campaign into
``clicks-by-campaign`` (so a downstream per-campaign aggregate is co-partitioned).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream


@dataclass
class Click:
    user: str
    ad: str
    campaign: str
    cost_micros: int


app = streamjoin.App(
    "click-router",
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=0.5,
)
clicks = app.topic("clicks", key_serializer="str", value_serializer=Click, partitions=6)
by_campaign = app.topic(
    "clicks-by-campaign", key_serializer="str", value_serializer=Click, partitions=6
)


@app.agent(clicks, on_error="dead_letter")
async def route(stream: Stream) -> None:
    async for event in stream:
        click: Click = event.value
        if click.cost_micros < 0:
            raise ValueError(f"negative cost {click.cost_micros} for ad {click.ad}")
        await by_campaign.send(key=click.campaign, value=click)
