"""The faust-streaming side of ``benchmarks/join_throughput.py`` (runs in Faust's own venv).

This file must not import streamjoin: the benchmark runs it with the Python of a
separate virtual environment that holds faust-streaming::

    <faust venv>/bin/python benchmarks/join_faust_app.py --bootstrap 127.0.0.1:PORT \
        --app-id ID --impressions T1 --clicks T2 --output T3 --inputs N \
        --marks FILE --datadir DIR --store rocksdb:// [--mode join|lookup]

Faust has no stream-stream join (its join classes raise NotImplementedError), so
its nearest equivalent is tables looked up by agents:

* ``--mode join`` (the default, the one the ratio is taken against): an agent on
  impressions stores each impression in a Table keyed by auction id, an agent on
  clicks looks it up and emits the joined record. A click that arrives before
  its impression (arrival is out of order by up to 20 s) waits in a second Table
  until the impression comes, so the output is the exact expected join set. The
  window check is ``|click ts - impression ts| <= 10 min`` on the record
  timestamps, as in streamjoin's join.
* ``--mode lookup``: only the impression table and the click agent's lookup,
  nothing else (clicks that arrive early are lost, so its output is incomplete).
  The least work Faust can do on this data: a lower bound on Faust's time.

What Faust does *not* do here, and streamjoin does: no windows close, nothing is
ever expired (the tables grow without bound), there is no grace/lateness
handling, one value per key (the generator makes at most one impression and one
click per auction id, so that is enough here but not in general), and no
per-event stream-time bookkeeping.

Both tables use raw bytes (an 8-byte timestamp followed by the record's JSON):
the fastest Faust path; JSON is decoded only to build a joined record, as in
streamjoin. Marks: ``FIRST <unix time> <process CPU time>`` when the first input event reaches an
agent and ``DONE <unix time> <process CPU time>`` when the ``--inputs``-th event is processed, in
the file ``--marks`` (the Faust worker redirects stdout into its log).

Faust's internal topics (the tables' changelogs, compacted, with the tables' partition
counts, and the leader assignor's topic) are created here, before the worker starts, and
only once the broker's metadata lists every one of their partitions with a leader does the
worker start. Faust would create them itself while starting, but on Kafka 4.x (KRaft) a
topic created a few milliseconds before the consumer group's first join is often still
missing from the metadata the join is planned on: the assignment then leaves that
changelog out, Faust sees it with 0 partitions, and every event that writes to its table
crashes the agent with ``PartitionsMismatch`` (which looks like a hang: the agent is
restarted, and crashes again, until the benchmark's timeout). Faust does not declare a
topic the broker already lists, which also spares aiokafka < 0.13 its CreateTopics v1
request, a version Kafka 4 no longer accepts (the broker closes the connection).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from typing import Any

WINDOW_MS = 10 * 60_000


def internal_topics(app: Any) -> dict[str, tuple[int, int, dict[str, str]]]:
    """Faust's internal topics of ``app`` as name -> (partitions, replication, config), as
    Faust itself would declare them (``Topic.declare`` and ``faust.transport.drivers.aiokafka``:
    ``cleanup.policy`` from compacting/deleting, ``retention.ms`` from retention)."""
    from mode.utils.times import want_seconds

    topics = [table.changelog_topic for table in app.tables.values()]
    if not app.conf.topic_disable_leader:  # (the topic LeaderAssignor.on_start declares)
        topics.append(app._leader_assignor._leader_topic)
    out: dict[str, tuple[int, int, dict[str, str]]] = {}
    for topic in topics:
        config: dict[str, str] = {}
        policy = [p for p, on in (("compact", topic.compacting), ("delete", topic.deleting)) if on]
        if policy:
            config["cleanup.policy"] = ",".join(policy)
        if topic.retention:
            config["retention.ms"] = str(int(want_seconds(topic.retention) * 1000))
        config.update({k: str(v) for k, v in (topic.config or {}).items()})
        out[topic.get_topic_name()] = (
            topic.partitions or app.conf.topic_partitions,
            topic.replicas or app.conf.topic_replication_factor or 1,
            config,
        )
    return out


async def create_topics(
    bootstrap: str,
    topics: dict[str, tuple[int, int, dict[str, str]]],
    timeout: float = 60,
) -> None:
    """Create ``topics`` (an existing one is kept if its partition count is right) and
    return once a fresh metadata request lists all their partitions with a leader."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, n, r, topic_configs=cfg) for name, (n, r, cfg) in topics.items()]
        )
        for name, code, *reason in response.topic_errors:
            if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS
                raise RuntimeError(f"cannot create topic {name}: error {code} {reason}")
        deadline = time.monotonic() + timeout
        while True:
            # (every topic: naming topics would let the broker auto-create a missing one)
            described = {t.get("topic", t.get("name")): t for t in await admin.describe_topics()}
            ready = True
            for name, (n, _, _) in topics.items():
                found = described.get(name)
                parts = found["partitions"] if found and found["error_code"] == 0 else []
                if parts and len(parts) != n:
                    raise RuntimeError(f"topic {name} has {len(parts)} partitions, not {n}")
                ready = ready and len(parts) == n and all(p["leader"] >= 0 for p in parts)
            if ready:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not all in the broker's metadata: {sorted(topics)}")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--impressions", required=True)
    parser.add_argument("--clicks", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--inputs", type=int, required=True)
    parser.add_argument("--marks", required=True)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--datadir", required=True)
    parser.add_argument("--store", default="rocksdb://")
    parser.add_argument("--mode", choices=("join", "lookup"), default="join")
    parser.add_argument("--loglevel", default="warning")
    args = parser.parse_args()

    import faust

    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        store=args.store,
        datadir=args.datadir,
        topic_partitions=args.partitions,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
    )
    raw = {"key_type": bytes, "value_type": bytes, "partitions": args.partitions}
    impressions = app.topic(args.impressions, **raw)
    clicks = app.topic(args.clicks, **raw)
    output = app.topic(args.output, **raw)
    impression_table = app.Table("impressions-by-auction", **raw)
    pending_clicks = app.Table("pending-clicks", **raw)
    join_mode = args.mode == "join"

    seen = 0

    def mark(what: str) -> None:
        with open(args.marks, "a") as f:
            f.write(f"{what} {time.time():.6f} {time.process_time():.6f}\n")

    def counted() -> None:
        nonlocal seen
        seen += 1
        if seen == 1:
            mark("FIRST")
        if seen == args.inputs:
            mark("DONE")

    def joined(key: bytes, impression: bytes, click: bytes) -> bytes:
        imp = json.loads(impression[8:])
        clk = json.loads(click[8:])
        return json.dumps(
            {
                "auction_id": key.decode(),
                "impression_id": imp["impression_id"],
                "click_id": clk["click_id"],
                "campaign": imp["campaign"],
                "ad_id": imp["ad_id"],
                "cost_micros": imp["bid_micros"],
                "user": clk["user"],
            }
        ).encode()

    def within(a: bytes, b: bytes) -> bool:
        return abs(int.from_bytes(a[:8], "big") - int.from_bytes(b[:8], "big")) <= WINDOW_MS

    def stamped(event: faust.types.EventT) -> bytes:
        ts_ms = round(event.message.timestamp * 1000)
        return ts_ms.to_bytes(8, "big") + event.value

    @app.agent(impressions)
    async def on_impression(stream: faust.StreamT) -> None:
        async for event in stream.events():
            key = event.key
            impression = stamped(event)
            impression_table[key] = impression
            if join_mode:
                click = pending_clicks.get(key)
                if click is not None:
                    del pending_clicks[key]
                    if within(impression, click):
                        await output.send(key=key, value=joined(key, impression, click))
            counted()

    @app.agent(clicks)
    async def on_click(stream: faust.StreamT) -> None:
        async for event in stream.events():
            key = event.key
            click = stamped(event)
            impression = impression_table.get(key)
            if impression is not None:
                if within(impression, click):
                    await output.send(key=key, value=joined(key, impression, click))
            elif join_mode:
                pending_clicks[key] = click
            counted()

    logging.basicConfig(level=args.loglevel.upper())
    # (a loop of its own, never set as the current one: the worker makes its own)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(create_topics(args.bootstrap, internal_topics(app)))
    finally:
        loop.close()
    worker = faust.Worker(app, loglevel=args.loglevel, quiet=True)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
