"""Port of Faust's ``examples/word_count.py``: posts split into words, each sent to the
counting agent (Faust's agent channel), words counted in a table keyed by word, a page
answering one word's count from the worker that owns it, a task that produces sample posts
and prints the tally.

    streamjoin worker -A examples.from_faust.word_count:app --broker kafka://127.0.0.1:9092 \\
        --web-port 6066
    curl -s http://127.0.0.1:6066/count/fox

As in Faust, ``count_words`` has no topic of its own making: ``@app.agent()`` gives it one,
``<app id>-count_words``, and ``count_words.send(key=word, value=word)`` writes it, keyed by
word, so each word is counted on one partition.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from aiohttp import web

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream

log = logging.getLogger(__name__)

PREFIX = os.environ.get("FAUST_PORTS_PREFIX", "")
WORDS = ["the", "quick", "brown", "fox"]
#: how many sample posts the sender task produces per word, and when it prints the tally
POSTS_PER_WORD = 1000
TALLY_AFTER_SECONDS = 5.0

app = streamjoin.App(
    f"{PREFIX}word-counts",
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    topic_partitions=8,
    # (Faust's value_type=str on the topic and the agent: the codecs of every topic here)
    key_serializer="str",
    value_serializer="str",
)
posts_topic = app.topic(f"{PREFIX}posts")


@app.agent(posts_topic)
async def shuffle_words(posts: Stream) -> None:
    async for word in posts.values().flat_map(str.split):
        await count_words.send(key=word, value=word)


@app.agent()
async def count_words(words: Stream) -> None:
    """Count words from blog post article body."""
    async for word in words.values():
        word_counts[word] += 1


# (co-partitioned with count_words' topic: the agent uses it by name)
word_counts = app.table("word_counts", default=int, value_serializer="json")


@app.page("/count/{word}")
@app.table_route(word_counts, match_info="word")
async def get_count(request: web.Request, word: str) -> dict[str, Any]:
    """One word's count, answered by the worker owning the word's partition."""
    return {word: word_counts[word]}


def tally() -> dict[str, int]:
    """The counts of this worker's partitions (Faust printed them with ``as_ansitable``)."""
    return dict(sorted(word_counts.local_items()))


@app.task
async def sender() -> None:
    for word in WORDS:
        for _ in range(POSTS_PER_WORD):
            await posts_topic.send(value=word)
    await asyncio.sleep(TALLY_AFTER_SECONDS)
    log.info("$$ TALLY $$ %s", tally())
