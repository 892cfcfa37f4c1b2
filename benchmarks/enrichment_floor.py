"""The enrichment's essential work per event in one Python loop: a floor to compare with.

    .venv/bin/python -m benchmarks.enrichment_floor [--events 300000] [--rounds 5]

What any Python worker of ``enrichment.py`` must do for an event, with the same libraries
as streamjoin and nothing else: decode the key (UTF-8) and the value (JSON), find the
key's row in a dict and copy it (a caller may change it), call the benchmark's join
function, encode the result (JSON) and the key, compute the key's partition (murmur2)
and append the record to aiokafka's compiled batch builder. No Kafka, no event loop, no
offsets, acknowledgements or metrics. It prints the CPU microseconds per event of each
round and their median. ``enrichment.py`` reports streamjoin's whole cost per event;
the difference is what the runtime adds around this work.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from streamjoin.codecs import fast_json_decode, fast_json_encode
from streamjoin.quick_partition import partition_of

#: as in enrichment.py: users in the table, partitions of the output
USERS = 10_000
PARTITIONS = 8
#: the largest batch aiokafka's producer builds by default
BATCH_BYTES = 1 << 20


def _records(events: int, seed: int = 7) -> list[tuple[bytes, bytes]]:
    """Events shaped as enrichment.py's: (user key, JSON value)."""
    rnd = random.Random(seed)
    out = []
    for n in range(events):
        user = f"user-{rnd.randrange(USERS):05d}"
        event = {"event_id": n, "user": user, "amount": rnd.randrange(1, 10_000)}
        out.append((user.encode(), json.dumps(event).encode()))
    return out


def _rows() -> dict[bytes, dict[str, Any]]:
    """The table's rows by key, decoded (as a table remembers them)."""
    rows = {}
    for n in range(USERS):
        user = f"user-{n:05d}"
        rows[user.encode()] = {"user": user, "tier": "pro", "country": "DE"}
    return rows


def _join(_user: str, event: dict[str, Any], row: dict[str, Any] | None) -> Any:
    """The benchmark's join function (workload_streamjoin_app.enrich, without its marks)."""
    return {
        "event_id": event["event_id"],
        "amount": event["amount"],
        "tier": row and row["tier"],
        "country": row and row["country"],
    }


def one_round(records: list[tuple[bytes, bytes]]) -> float:
    """CPU microseconds per event of the loop over ``records``."""
    rows = _rows()
    builder = DefaultRecordBatchBuilder(2, 0, -1, -1, -1, False, BATCH_BYTES)
    appended = 0
    timestamp = 1_700_000_000_000
    started = time.process_time()
    for key_bytes, value_bytes in records:
        key = key_bytes.decode()
        value = fast_json_decode(value_bytes)
        row = rows.get(key.encode())
        result = _join(key, value, None if row is None else row.copy())
        out_key, out_value = key.encode(), fast_json_encode(result)
        partition_of(out_key, PARTITIONS)
        if builder.append(appended, timestamp, out_key, out_value, []) is None:
            builder = DefaultRecordBatchBuilder(2, 0, -1, -1, -1, False, BATCH_BYTES)
            appended = 0
            builder.append(appended, timestamp, out_key, out_value, [])
        appended += 1
    return (time.process_time() - started) / len(records) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.events < 1 or args.rounds < 1:
        parser.error("--events and --rounds must be at least 1")
    records = _records(args.events)
    rounds = [one_round(records) for _ in range(args.rounds)]
    print("CPU µs/event per round: " + ", ".join(f"{r:.2f}" for r in rounds))
    print(f"median: {statistics.median(rounds):.2f} CPU µs/event")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
