"""The enrichment floor (benchmarks/enrichment_floor.py) does the enrichment's work: every
event finds its row, and the loop runs."""

from __future__ import annotations

import pytest

from benchmarks import enrichment_floor
from streamjoin.codecs import fast_json_decode


def test_every_event_finds_its_row_and_is_enriched_with_it() -> None:
    rows = enrichment_floor._rows()
    records = enrichment_floor._records(2_000)
    assert len({key for key, _ in records}) > 1_000  # (spread over the table's keys)
    for key, value in records:
        row = rows[key]
        event = fast_json_decode(value)
        assert event["user"] == key.decode()
        joined = enrichment_floor._join(key.decode(), event, row)
        assert joined == {
            "event_id": event["event_id"],
            "amount": event["amount"],
            "tier": row["tier"],
            "country": row["country"],
        }


def test_main_prints_a_median_per_event(capsys: pytest.CaptureFixture[str]) -> None:
    assert enrichment_floor.main(["--events", "500", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "CPU µs/event per round: " in out
    assert out.strip().endswith("CPU µs/event")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        enrichment_floor.main(["--events", "0"])
