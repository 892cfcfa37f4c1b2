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
"""

from __future__ import annotations

import argparse
import json
import logging
import time

WINDOW_MS = 10 * 60_000


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
    worker = faust.Worker(app, loglevel=args.loglevel, quiet=True)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
