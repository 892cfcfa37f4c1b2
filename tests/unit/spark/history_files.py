"""History files for backfill tests: one JSON object per record, as ``FileSource`` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_records(path: Path, records: list[Any]) -> None:
    """``records`` (with ``topic``, ``key``, ``value``, ``timestamp_ms``) as JSON lines."""
    with path.open("w") as f:
        for rec in records:
            row = {
                "topic": rec.topic,
                "key": rec.key,
                "value": rec.value,  # an object: read back as its JSON text
                "timestamp": rec.timestamp_ms,
            }
            f.write(json.dumps(row) + "\n")
