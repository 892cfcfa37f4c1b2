"""Port of Faust's ``examples/word_count.py``: posts split into words, words counted in a
table keyed by word, a task that produces sample posts and prints the tally.

    streamjoin worker -A examples.faust_ports.word_count:app --broker kafka://127.0.0.1:9092 \\
        --web-port 6066
    curl -s http://127.0.0.1:6066/tables/word_counts/fox      # Faust's /count/fox/ page

Faust's ``count_words.send(key=word)`` sent to the agent's own hidden topic; here that topic
is declared (``words``), keyed by word, so each word is counted on one partition.
"""

from __future__ import annotations

import asyncio
import logging
import os

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
)
posts_topic = app.topic(f"{PREFIX}posts", key_serializer="str", value_serializer="str")
words_topic = app.topic(f"{PREFIX}words", key_serializer="str", value_serializer="str")
word_counts = app.table(
    "word_counts", default=int, key_serializer="str", copartitioned_with=words_topic
)


@app.agent(posts_topic)
async def shuffle_words(posts: Stream) -> None:
    async for word in posts.values().flat_map(str.split):
        await words_topic.send(key=word, value=word)


@app.agent(words_topic)
async def count_words(words: Stream) -> None:
    """Count words from blog post article body."""
    async for word in words.values():
        word_counts[word] += 1


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
