"""A one-partition counting app for the in-memory driver tests of commits and losses."""

from __future__ import annotations

import streamjoin
from streamjoin.stream import Stream
from streamjoin.tables import Table


def counting_app(name: str) -> tuple[streamjoin.App, Table]:
    """One partition of clicks, counted per key in a table."""
    app = streamjoin.App(name, topic_partitions=1)
    clicks = app.topic("clicks", key_serializer="str", value_serializer="json", partitions=1)
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=clicks)

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1

    return app, counts
