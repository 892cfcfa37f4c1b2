"""Port of Faust's ``examples/withdrawals.py``: withdrawals summed per user and hour, and per
country in 10-second windows (re-keyed by country first).

    streamjoin worker -A examples.from_faust.withdrawals:app --broker kafka://127.0.0.1:9092
    streamjoin -A examples.from_faust.withdrawals:app produce --max-messages 1000

Faust wrote the window sizes in seconds (``tumbling(3600)``); streamjoin takes a
``timedelta`` (a bare 3600 is refused rather than read as 3.6 s). Faust's
``relative_to_stream()`` is kept: ``user_to_total.relative_to_stream()[user].value()``
reads the window of the event's time.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any

import click

import streamjoin
from streamjoin.aggregations import Count, Sum
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.windows import SessionWindows, SlidingWindows, TumblingWindows

PREFIX = os.environ.get("FAUST_PORTS_PREFIX", "")
PARTITIONS = 8


@dataclass
class Withdrawal:
    user: str
    country: str
    amount: float
    date: datetime | None = None


app = streamjoin.App(
    f"{PREFIX}faust-withdrawals",
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    topic_partitions=PARTITIONS,
)
withdrawals_topic = app.topic(
    f"{PREFIX}withdrawals", key_serializer="str", value_serializer=Withdrawal
)

# Faust: .tumbling(3600).relative_to_stream(): hourly windows, kept one window long
user_to_total = app.table(
    "user_to_total",
    default=float,
    key_serializer="str",
    copartitioned_with=withdrawals_topic,
    window=TumblingWindows(timedelta(hours=1)),
)
#: Faust's relative_to_stream() set the table's reads; here it is a read-only view of it
user_totals = user_to_total.relative_to_stream()

# Faust's `stream.group_by(Withdrawal.country)`: a repartition topic keyed by country
by_country = app.group_by(
    withdrawals_topic,
    "country",
    name="withdrawals-by-country",
    key_serializer="str",
)
# Faust: .tumbling(10.0, expires=10.0): kept about 10 s from the window's start. Records
# re-keyed from 8 partitions reach a country's partition slightly out of order, and Faust
# applied them to any window it had not expired yet: here 5 s of grace says how late one
# may be (later ones are dropped and counted), and the window is kept 5 s after its end.
country_to_total = app.table(
    "country_to_total",
    default=float,
    key_serializer="str",
    copartitioned_with=by_country,
    window=TumblingWindows(
        timedelta(seconds=10), grace=timedelta(seconds=5), retention=timedelta(seconds=5)
    ),
)
country_totals = country_to_total.relative_to_stream()


# Beyond Faust's example (windows Faust does not have): each user's bursts of withdrawals,
# a burst ending after 10 minutes without one (one final result per burst), and the most a
# user withdrew within any 1 minute (sliding windows: one per distinct set of withdrawals).
bursts_topic = app.topic(
    f"{PREFIX}withdrawal-bursts", key_serializer="str", value_serializer="json"
)
user_bursts = app.aggregate(
    withdrawals_topic,
    name="user_bursts",
    window=SessionWindows(timedelta(minutes=10)),
    agg={"withdrawals": Count(), "total": Sum("amount")},
    emit="close",
    emit_to=bursts_topic,
)
user_per_minute = app.aggregate(
    withdrawals_topic,
    name="user_per_minute",
    window=SlidingWindows(timedelta(minutes=1)),
    agg=Sum("amount"),
)


@app.agent(withdrawals_topic)
async def track_user_withdrawal(stream: Stream) -> None:
    withdrawal: Withdrawal
    async for withdrawal in stream.values():
        user_to_total[withdrawal.user] += withdrawal.amount


@app.agent(by_country)
async def track_country_withdrawal(stream: Stream) -> None:
    withdrawal: Withdrawal
    async for withdrawal in stream.values():
        country_to_total[withdrawal.country] += withdrawal.amount


def generate_withdrawals(n: int | None = None) -> Iterator[Withdrawal]:
    """Random withdrawals: 500 users, 5 countries (90% from the first)."""
    countries = [f"country_{i}" for i in range(5)]
    weights = [0.9] + [0.1 / 4] * 4
    users = [f"user_{i}" for i in range(500)]
    for _ in range(n) if n is not None else count():
        yield Withdrawal(
            user=random.choice(users),
            country=random.choices(countries, weights)[0],
            amount=random.uniform(0, 25_000),
            date=datetime.now(UTC),
        )


@app.command(
    click.option(
        "--max-latency",
        type=float,
        default=0.5,
        show_default=True,
        help="Seconds to wait at most between two withdrawals.",
    ),
    click.option("--max-messages", type=int, default=None, help="Stop after this many."),
)
async def produce(self: Any, max_latency: float, max_messages: int | None) -> None:
    """Produce example withdrawals, keyed by user (Faust's produce command)."""
    # (Faust's app.command ran the producer inside the app; app.producing() starts only the
    # producer, not a worker)
    async with app.producing():
        for i, withdrawal in enumerate(generate_withdrawals(max_messages)):
            await withdrawals_topic.send(key=withdrawal.user, value=withdrawal)
            if not i % 10_000:
                self.say(f"+SEND {i}")
            if max_latency:
                await asyncio.sleep(random.uniform(0, max_latency))
