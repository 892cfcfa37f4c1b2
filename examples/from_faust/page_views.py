"""Port of Faust's page-views tutorial (``examples/simple.py`` in its docs' words: "count
page views"): views of pages, re-keyed by page id, counted in a table.

    streamjoin worker -A examples.from_faust.page_views:app --broker kafka://127.0.0.1:9092 \\
        --web-port 6066
    curl -s http://127.0.0.1:6066/tables/page_views/home      # the count of page "home"

Faust's ``views.group_by(PageView.id)`` inside the agent becomes ``app.group_by`` declared
beside it: the repartition topic (``<app id>-by-page-repartition``) is visible, keyed by
page id, and the counting agent reads it, so the table is co-partitioned with what it counts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import streamjoin
from streamjoin.events import Event
from streamjoin.runtime.tasks.agent_runtime import Stream

PREFIX = os.environ.get("FAUST_PORTS_PREFIX", "")


@dataclass
class PageView:
    id: str
    user: str


app = streamjoin.App(
    f"{PREFIX}page-views",
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    topic_partitions=4,
)
page_view_topic = app.topic(f"{PREFIX}page_views", key_serializer="str", value_serializer=PageView)


def page_of(event: Event) -> str:
    view: PageView = event.value
    return view.id


# Faust: `async for view in views.group_by(PageView.id)`
by_page = app.group_by(page_view_topic, page_of, name="by-page", key_serializer="str")
page_views = app.table("page_views", default=int, key_serializer="str", copartitioned_with=by_page)


@app.agent(by_page)
async def count_page_views(views: Stream) -> None:
    async for view in views:
        page_views[view.key] += 1
