"""The table-joins benchmark's inputs and checks (benchmarks/table_joins.py): the answers
it compares systems on must catch every kind of wrong output."""

from __future__ import annotations

import json
import os

from benchmarks.enrichment import check_enriched
from benchmarks.harness import process_cpu_seconds
from benchmarks.table_joins import check_fk, fk_workload, global_workload, joined


def _replay_fk(records: list[tuple[str, bytes, bytes | None, int]]) -> dict[str, object]:
    """The join of the final tables, from the records alone (independent of the generator's
    own bookkeeping)."""
    orders: dict[str, dict[str, object]] = {}
    customers: dict[str, dict[str, object]] = {}
    for topic, key, value, _ in records:
        side = orders if topic == "input" else customers
        if value is None:
            side.pop(key.decode(), None)
        else:
            side[key.decode()] = json.loads(value)
    return {
        o: joined(order, customers[str(order["customer"])])
        for o, order in orders.items()
        if order["customer"] in customers
    }


def test_the_fk_truth_is_the_join_of_the_final_tables() -> None:
    work = fk_workload(4_000, 50, seed=3)
    assert work.truth == _replay_fk(work.records)
    kinds = {(t, v is None) for t, _, v, _ in work.records}
    assert kinds == {("input", False), ("input", True), ("table", False), ("table", True)}


def test_the_fk_check_counts_missing_wrong_and_unexpected_rows() -> None:
    work = fk_workload(2_000, 30, seed=5)
    right = [(k.encode(), json.dumps(v).encode()) for k, v in work.truth.items()]
    assert check_fk(work.truth, right) == {
        "expected": len(work.truth),
        "missing": 0,
        "wrong": 0,
        "unexpected": 0,
    }
    first, second, third = list(work.truth)[:3]
    stale = {**work.truth[second], "name": "stale"}
    outputs = [
        *right,
        (first.encode(), None),  # deleted at the end
        (second.encode(), json.dumps(stale).encode()),  # an older customer row last
        (b"o-none", json.dumps({"order": "o-none"}).encode()),
        (third.encode(), None),
        (third.encode(), json.dumps(work.truth[third]).encode()),  # back again: right
    ]
    assert check_fk(work.truth, outputs) == {
        "expected": len(work.truth),
        "missing": 1,
        "wrong": 1,
        "unexpected": 1,
    }


def test_the_enrichment_check_counts_every_kind_of_wrong_output_once() -> None:
    """(The global workload's check, and enrichment.py's: an output for an event that was
    never produced is ``unexpected`` only, not ``wrong`` as well.)"""
    work = global_workload(200, 20, seed=1)
    rows = {i: {"event_id": i, "tier": t, "country": c} for i, (t, c) in work.truth.items()}
    outputs = [(None, json.dumps(rows[i]).encode()) for i in list(rows)[6:]]
    outputs.append((None, json.dumps({**rows[3], "tier": None, "country": None}).encode()))
    outputs.append((None, json.dumps({**rows[4], "country": "XX"}).encode()))
    outputs += [(None, json.dumps(rows[5]).encode())] * 2
    outputs.append((None, json.dumps({"event_id": 10_000, "tier": "pro"}).encode()))
    assert check_enriched(work.truth, outputs) == {
        "expected": 200,
        "missing": 3,
        "unenriched": 1,
        "wrong": 1,
        "unexpected": 1,
        "duplicates": 1,
    }


def test_process_cpu_seconds_reads_this_process() -> None:
    spent = process_cpu_seconds(os.getpid())
    assert spent is not None and spent > 0
    assert process_cpu_seconds(2**22 + 12_345) is None  # (no such process)
