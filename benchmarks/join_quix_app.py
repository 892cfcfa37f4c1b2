"""The Quix Streams side of ``benchmarks/join_throughput.py`` (runs in Quix's own venv).

This file must not import streamjoin: the benchmark runs it with the Python of a
separate virtual environment that holds quixstreams::

    <quix venv>/bin/python benchmarks/join_quix_app.py --bootstrap 127.0.0.1:PORT \
        --app-id ID --impressions T1 --clicks T2 --output T3 --inputs N \
        --marks FILE --state-dir DIR

The join is ``StreamingDataFrame.join_interval`` (quixstreams 3.x), inner, with
``backward_ms = forward_ms = 10 min`` (streamjoin's symmetric 10-minute window)
and ``grace_ms = 10.5 min`` (how long Quix keeps a record in its store: the same
retention as streamjoin's window + 30 s grace). The merge builds the same
attributed-click record as streamjoin's join function.

Quix's semantics differ in one way that matters on this data: a record only
looks for partners *at or before* its own timestamp (``left_func`` scans the
right side in ``[ts - backward_ms, ts]``, ``right_func`` the left side in
``[ts - forward_ms, ts]``). A click that is processed before its impression
but has a later timestamp (arrival is out of order by up to 20 s) is never
joined. The benchmark reports those missing joins.

Marks: ``FIRST <unix time> <process CPU time>`` when the first input event reaches the app and
``DONE <unix time> <process CPU time>`` when the ``--inputs``-th does, in the file ``--marks``.
"""

from __future__ import annotations

import argparse
import time

WINDOW_MS = 10 * 60_000
GRACE_MS = 30_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--impressions", required=True)
    parser.add_argument("--clicks", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--inputs", type=int, required=True)
    parser.add_argument("--marks", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--loglevel", default="WARNING")
    args = parser.parse_args()

    from quixstreams import Application

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.app_id,
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        loglevel=args.loglevel.upper(),
    )
    impressions = app.topic(args.impressions, key_deserializer="bytes", value_deserializer="json")
    clicks = app.topic(args.clicks, key_deserializer="bytes", value_deserializer="json")
    output = app.topic(args.output, key_serializer="bytes", value_serializer="json")

    seen = 0

    def mark(what: str) -> None:
        with open(args.marks, "a") as f:
            f.write(f"{what} {time.time():.6f} {time.process_time():.6f}\n")

    def counted(_value: object) -> None:
        nonlocal seen
        seen += 1
        if seen == 1:
            mark("FIRST")
        if seen == args.inputs:
            mark("DONE")

    def merge(imp: dict, clk: dict) -> dict:
        return {
            "auction_id": imp["auction_id"],
            "impression_id": imp["impression_id"],
            "click_id": clk["click_id"],
            "campaign": imp["campaign"],
            "ad_id": imp["ad_id"],
            "cost_micros": imp["bid_micros"],
            "user": clk["user"],
        }

    left = app.dataframe(impressions).update(counted)
    right = app.dataframe(clicks).update(counted)
    joined = left.join_interval(
        right,
        how="inner",
        on_merge=merge,
        grace_ms=WINDOW_MS + GRACE_MS,
        backward_ms=WINDOW_MS,
        forward_ms=WINDOW_MS,
    )
    joined.to_topic(output)
    app.run()


if __name__ == "__main__":
    main()
