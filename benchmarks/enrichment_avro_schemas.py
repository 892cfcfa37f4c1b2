"""The Avro schemas of ``enrichment_avro.py`` (stdlib only: Quix's venv imports it too).

Input schemas are registered under fixed subjects before the run (the input is produced
once, framed with their ids); each system registers ``ENRICHED`` for its own output topic
(``<topic>-value``) with its own serializer.
"""

from __future__ import annotations

import json

#: the table topic's rows
USER = json.dumps(
    {
        "type": "record",
        "name": "User",
        "namespace": "bench.enrich",
        "fields": [
            {"name": "user", "type": "string"},
            {"name": "tier", "type": "string"},
            {"name": "country", "type": "string"},
        ],
    }
)
#: the input events
EVENT = json.dumps(
    {
        "type": "record",
        "name": "Event",
        "namespace": "bench.enrich",
        "fields": [
            {"name": "event_id", "type": "long"},
            {"name": "user", "type": "string"},
            {"name": "amount", "type": "long"},
        ],
    }
)
#: the output: an event with its row's fields (null when the row was not there yet)
ENRICHED = json.dumps(
    {
        "type": "record",
        "name": "Enriched",
        "namespace": "bench.enrich",
        "fields": [
            {"name": "event_id", "type": "long"},
            {"name": "amount", "type": "long"},
            {"name": "tier", "type": ["null", "string"], "default": None},
            {"name": "country", "type": ["null", "string"], "default": None},
        ],
    }
)
#: the subjects the input schemas are registered under
SUBJECTS = {"table": "bench-enrich-users-value", "input": "bench-enrich-events-value"}
#: how the apps learn to read and write Avro: BENCH_VALUES=avro, BENCH_REGISTRY_URL=...
VALUES_ENV, REGISTRY_ENV = "BENCH_VALUES", "BENCH_REGISTRY_URL"
