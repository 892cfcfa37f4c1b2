"""The join's own per-event work, without Kafka: join core, join buffer partition, RocksDB.

    .venv/bin/python -m benchmarks.join_core --auctions 20000
    .venv/bin/python -m benchmarks.join_core --baseline-tree ../old-tree --repeat 3

Feeds the demo's traffic (``examples/ad_traffic.py``, keyed by auction id, spread over 10
partitions by a hash of the key) to one ``StreamStreamJoin`` per partition over a
``TablePartition`` on a fresh RocksDB store, the demo's window and grace (inner join).
Every ``--flush-every`` events each partition is flushed as the worker does, minus the
changelog send: the writes are taken, the changelog's records chosen (deletes of keys the
store never had dropped) and the writes applied to the store with an offset. Reports the
process CPU time of the loop per event and checks the number of joins.

It isolates what ``join_throughput`` measures together with the runtime and the producer.
``--baseline-tree`` runs the same loop in an older source tree too (a git worktree, say),
alternating with this one: the loop uses the newer APIs only where the tree has them
(``process_record``, ``group_keys_by``, ``stored_deletes``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

PARTITIONS = 10


def run_once(auctions: int, flush_every: int) -> tuple[float, int, int]:
    """(CPU seconds, events, joins) of one pass, in the ``streamjoin`` importable here."""
    from examples.ad_traffic import GRACE_MS, WINDOW_MS, generate
    from streamjoin.joins import core
    from streamjoin.state.rocksdb import RocksDBStorePartition
    from streamjoin.state.table_partition import TablePartition

    traffic = generate(auctions)
    seqs: dict[tuple[str, int], int] = {}
    records = []
    for r in traffic.records:
        key = r.key.encode()
        partition = zlib.crc32(key) % PARTITIONS
        side = "left" if r.topic == "impressions" else "right"
        seq = seqs.get((side, partition), 0)
        seqs[(side, partition)] = seq + 1
        value = json.dumps(r.value).encode()
        records.append((partition, side, key, value, r.timestamp_ms, seq))

    with tempfile.TemporaryDirectory() as directory:
        views: list[Any] = []
        joins: list[Any] = []
        for p in range(PARTITIONS):
            store = RocksDBStorePartition(f"{directory}/{p}", table="buffer", partition=p)
            view = TablePartition("buffer", p, store)
            # (a core that keeps its buffer's keys asks for the grouping itself, when it
            # needs range reads; an older one needs it from the start, as its join did)
            if hasattr(view, "group_keys_by") and not hasattr(core, "TRACKED_KEYS_MAX"):
                view.group_keys_by(core.BUFFER_GROUP_OF)
            views.append(view)
            joins.append(core.StreamStreamJoin(core.JoinSpec(WINDOW_MS, GRACE_MS), view))
        offset = 0

        def flush() -> None:
            nonlocal offset
            for view in views:
                writes = view.take_pending()
                stored = view.stored_deletes() if hasattr(view, "stored_deletes") else ()
                store = view.store
                sent = [
                    (k, v)
                    for k, v in writes.items()
                    if v is not None or k in stored or store.contains(k)
                ]
                offset += len(sent)
                view.finish_flush(offset)

        joined = 0
        started = time.process_time()
        for i, (p, side, key, value, ts, seq) in enumerate(records):
            join = joins[p]
            if hasattr(join, "process_record"):
                joined += len(join.process_record(side, key, value, ts, seq))
            else:
                joined += len(join.process(core.JoinInput(side, key, value, ts, seq)))
            if i % flush_every == flush_every - 1:
                flush()
        flush()
        seconds = time.process_time() - started
        for view in views:
            view.store.close()
    if joined != len(traffic.expected_joins):
        raise SystemExit(f"{joined} joins, expected {len(traffic.expected_joins)}")
    return seconds, len(records), joined


def _in_tree(tree: str, auctions: int, flush_every: int) -> tuple[float, int, int]:
    """:func:`run_once` in another source tree (its ``streamjoin`` and ``examples``)."""
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [sys.executable, "-P", __file__, "--child", str(auctions), str(flush_every)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    seconds, events, joins = out.split()
    return float(seconds), int(events), int(joins)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        seconds, events, joins = run_once(int(sys.argv[2]), int(sys.argv[3]))
        print(seconds, events, joins)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--auctions", type=int, default=20_000)
    parser.add_argument("--flush-every", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--baseline-tree", default=None)
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    trees = [("streamjoin", here)]
    if args.baseline_tree:
        trees.insert(0, ("streamjoin-base", str(Path(args.baseline_tree).resolve())))
    results: dict[str, list[float]] = {name: [] for name, _ in trees}
    for _ in range(args.repeat):
        for name, tree in trees:
            seconds, events, joins = _in_tree(tree, args.auctions, args.flush_every)
            results[name].append(seconds)
            print(
                f"{name}: {seconds:.3f} s CPU, {seconds / events * 1e6:.1f} µs/event "
                f"({events} events, {joins} joins)",
                flush=True,
            )
    for name, runs in results.items():
        print(f"{name}: median {sorted(runs)[len(runs) // 2]:.3f} s CPU over {len(runs)} runs")


if __name__ == "__main__":
    main()
