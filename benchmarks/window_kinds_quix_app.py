"""The Quix Streams side of ``window_kinds.py`` (runs in Quix's own venv).

This file must not import streamjoin (only the stdlib module ``progress_marks`` next to it)::

    <quix venv>/bin/python benchmarks/window_kinds_quix_app.py --window=hopping|session \
        --emit=update|close --size-ms=.. --step-ms=.. --gap-ms=.. --grace-ms=.. \
        --retention-ms=.. --bootstrap=127.0.0.1:PORT --app-id=ID --input=T --output=T \
        --state-dir=DIR          # BENCH_MARKS and BENCH_LAST_OFFSETS in the environment

* hopping: ``sdf.hopping_window(size, step, grace_ms=grace).count()``; session:
  ``sdf.session_window(gap, grace_ms=grace).count()``;
* ``--emit=update``: ``.current()``; each update's value is kept in a dict (latest per key
  and window, a merged-away session removed), written as the dump ``[key, start, count]``
  or ``[key, start, last event, count]`` half a second after the last offset of every
  partition is done (Quix's store is not read from outside its processing; the dict is
  charged to Quix);
* ``--emit=close``: ``.final(closing_strategy="partition")`` (windows close on the
  partition's stream time, as in Kafka Streams and streamjoin; Quix's default closes a
  key's windows only on that key's next event) sent to ``--output``.

``--retention-ms`` is accepted for symmetry: Quix keeps a window until it closes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from progress_marks import Marks, parse_last_offsets, write_dump


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    for name in ("window", "emit", "bootstrap", "app-id", "input", "output", "state-dir"):
        parser.add_argument(f"--{name}", required=True)
    for name in ("size-ms", "step-ms", "gap-ms", "grace-ms", "retention-ms"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--loglevel", default="WARNING")
    args = parser.parse_args()
    marks_path = os.environ["BENCH_MARKS"]
    last = parse_last_offsets(os.environ["BENCH_LAST_OFFSETS"])

    from quixstreams import Application, message_context

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.app_id,
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        loglevel=args.loglevel.upper(),
    )
    source = app.topic(args.input, key_deserializer="str", value_deserializer="json")
    session = args.window == "session"
    #: (key, start) -> (end, count, update number)
    latest: dict[tuple[str, int], tuple[int, int, int]] = {}
    updates = itertools.count()

    def dump() -> None:
        write_dump(f"{marks_path}.dump.all", current_windows(latest, session))

    def dump_soon() -> None:
        # (the DONE mark is written before the window update of the last event: the dump
        # waits for it, as the Kafka Streams app's does)
        threading.Timer(0.5, dump).start()

    marks = Marks(marks_path, last, on_done=None if args.emit == "close" else dump_soon)

    def seen(_value: object) -> None:
        ctx = message_context()
        marks.seen(ctx.topic, ctx.partition, ctx.offset)

    sdf = app.dataframe(source).update(seen)
    if session:
        windowed = sdf.session_window(args.gap_ms, grace_ms=args.grace_ms).count()
    else:
        windowed = sdf.hopping_window(args.size_ms, args.step_ms, grace_ms=args.grace_ms).count()

    if args.emit == "close":
        output = app.topic(args.output, key_serializer="str", value_serializer="json")
        windowed.final(closing_strategy="partition").to_topic(output)
    else:

        def keep(window: dict, key: str, _ts: int, _headers: object) -> None:
            latest[(key, window["start"])] = (window["end"], window["value"], next(updates))

        windowed.current().update(keep, metadata=True)
    app.run()


def current_windows(
    latest: dict[tuple[str, int], tuple[int, int, int]], session: bool
) -> list[list[object]]:
    """The dump rows. Sessions: a session that grew or merged keeps the start of its
    earliest event, so older entries it covers are dropped (the newest update wins)."""
    if not session:
        return [[k, s, n] for (k, s), (_e, n, _u) in latest.items()]
    rows: list[list[object]] = []
    by_key: dict[str, list[tuple[int, int, int, int]]] = {}
    for (k, s), (e, n, u) in latest.items():
        by_key.setdefault(k, []).append((u, s, e, n))
    for k, sessions in by_key.items():
        kept: list[tuple[int, int]] = []
        for _u, s, e, n in sorted(sessions, reverse=True):
            if all(e <= ks or s >= ke for ks, ke in kept):
                kept.append((s, e))
                rows.append([k, s, e - 1, n])  # (Quix's end is the last event + 1)
    return rows


if __name__ == "__main__":
    main()
