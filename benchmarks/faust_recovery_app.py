"""The faust-streaming side of ``benchmarks/recovery.py`` (runs in Faust's own venv).

This file must not import streamjoin: ``benchmarks.recovery`` runs it with the
Python of a separate virtual environment that holds faust-streaming, as::

    <faust venv>/bin/python benchmarks/faust_recovery_app.py --bootstrap 127.0.0.1:PORT \
        --app-id ID --table NAME --partitions N --datadir DIR --store rocksdb://

It declares one table whose changelog topic is ``<app id>-<table>-changelog`` (the
topic the benchmark produced), with raw key and value serializers, and starts a
worker with a fresh data directory, so Faust restores the whole changelog. When
the table recovery has completed it writes a JSON result to ``--result-file`` and exits.

Timing. ``Recovery._set_recovery_started`` is wrapped to record when it runs:
Faust calls it once when a recovery round begins (before it fetches highwaters
and persisted offsets and seeks) and again right before it resumes the changelog
partitions ("Restoring state from changelog topics..."); ``_set_recovery_ended``
runs when every active changelog partition has reached its highwater and the
buffers are flushed into the store. ``restore_seconds`` is the time from the
*first* call (the same span streamjoin's number covers: planning, seeking,
reading and applying) to the end; ``read_apply_seconds`` starts at the last
call (reading and applying only). Worker start-up, the group join and topic
declaration come before both and are reported separately as
``startup_seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time


def _write_json(path: str, result: dict[str, object]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--datadir", required=True)
    parser.add_argument("--store", default="rocksdb://")
    parser.add_argument("--loglevel", default="warning")
    parser.add_argument("--result-file", required=True, help="where to write the JSON result")
    args = parser.parse_args()

    process_started = time.monotonic()

    import faust
    from faust.tables.recovery import Recovery

    marks: dict[str, list[float]] = {"started": [], "ended": []}
    events: list[tuple[str, float]] = []
    original_started = Recovery._set_recovery_started
    original_ended = Recovery._set_recovery_ended

    def _started(self: Recovery) -> None:
        marks["started"].append(time.monotonic())
        events.append(("started", marks["started"][-1] - process_started))
        original_started(self)

    def _ended(self: Recovery) -> None:
        marks["ended"].append(time.monotonic())
        events.append(("ended", marks["ended"][-1] - process_started))
        original_ended(self)

    Recovery._set_recovery_started = _started  # type: ignore[method-assign]
    Recovery._set_recovery_ended = _ended  # type: ignore[method-assign]

    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        store=args.store,
        datadir=args.datadir,
        topic_partitions=args.partitions,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
    )
    table = app.Table(
        args.table,
        partitions=args.partitions,
        key_type=bytes,
        value_type=bytes,
    )

    @app.task
    async def report() -> None:
        recovery = app.tables.recovery
        await recovery.completed.wait()
        done = time.monotonic()
        started = marks["started"]
        ended = marks["ended"]
        result = {
            "faust_version": faust.__version__,
            "store": args.store,
            "python": sys.version.split()[0],
            "partitions": sorted(tp.partition for tp in recovery.active_tps),
            "recovery_rounds": len(ended),
            "startup_seconds": (started[0] if started else done) - process_started,
            "restore_seconds": (ended[-1] - started[0]) if started and ended else None,
            "read_apply_seconds": (ended[-1] - started[-1]) if started and ended else None,
            "until_completed_seconds": done - process_started,
            "highwaters": {str(tp.partition): hw for tp, hw in recovery.active_highwaters.items()},
            "offsets": {str(tp.partition): off for tp, off in recovery.active_offsets.items()},
            "events": events,
        }
        try:
            result["keys"] = sum(1 for _ in table)
        except Exception as exc:  # report, do not fail the timing
            result["keys_error"] = repr(exc)
        # Not stdout: the Faust worker redirects it into its log.
        _write_json(args.result_file, result)
        # Leave the group politely so a later run does not wait for the session timeout,
        # but never hang here: the numbers are printed already.
        try:
            await asyncio.wait_for(app.consumer.stop(), timeout=10)
        finally:
            os._exit(0)

    logging.basicConfig(level=args.loglevel.upper())
    worker = faust.Worker(app, loglevel=args.loglevel, quiet=True)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
