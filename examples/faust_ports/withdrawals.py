"""Port of Faust's ``examples/withdrawals.py``: withdrawals summed per user and hour, and per
country in 10-second windows (re-keyed by country first).

    streamjoin worker -A examples.faust_ports.withdrawals:app --broker kafka://127.0.0.1:9092
    python -m examples.faust_ports.withdrawals produce --max-messages 1000

Faust wrote the window sizes in seconds (``tumbling(3600)``); streamjoin takes a
``timedelta`` (a bare 3600 is refused rather than read as 3.6 s). Faust's
``relative_to_stream()`` is kept: ``user_to_total.relative_to_stream()[user].value()``
reads the window of the event's time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import count

from aiokafka import AIOKafkaProducer

import streamjoin
from streamjoin.aggregations import Count, Sum
from streamjoin.config import parse_broker_url
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
    lambda event: event.value.country,
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
    async for event in stream:
        withdrawal: Withdrawal = event.value
        user_to_total[withdrawal.user] += withdrawal.amount


@app.agent(by_country)
async def track_country_withdrawal(stream: Stream) -> None:
    async for event in stream:
        withdrawal: Withdrawal = event.value
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


async def produce(max_latency: float, max_messages: int | None) -> None:
    """Faust's ``produce`` command: send withdrawals, keyed by user, with the topic's codecs
    (a plain producer: ``async with app`` would start a whole worker)."""
    broker = parse_broker_url(app.config.broker)
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all")
    await producer.start()
    try:
        for i, withdrawal in enumerate(generate_withdrawals(max_messages)):
            await producer.send(
                withdrawals_topic.name,
                withdrawals_topic.value_codec.dumps(withdrawal),
                key=withdrawals_topic.key_codec.dumps(withdrawal.user),
            )
            if not i % 10_000:
                print(f"+SEND {i}")
            if max_latency:
                await asyncio.sleep(random.uniform(0, max_latency))
        await producer.flush()
    finally:
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.faust_ports.withdrawals")
    command = parser.add_subparsers(dest="command", required=True).add_parser("produce")
    command.add_argument("--max-latency", type=float, default=0.5)
    command.add_argument("--max-messages", type=int, default=None)
    args = parser.parse_args()
    asyncio.run(produce(args.max_latency, args.max_messages))


if __name__ == "__main__":
    main()
