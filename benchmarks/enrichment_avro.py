"""The enrichment workload with Avro values from a schema registry: streamjoin vs Quix Streams.

    .venv/bin/python -m benchmarks.enrichment_avro                  # starts a broker and a registry
    .venv/bin/python -m benchmarks.enrichment_avro --events 20000 --keys 1000

The data and the check are ``enrichment.py``'s (a left stream-table join of ``--events``
events with ``--keys`` user rows), with every value in Avro in the Confluent wire format
(schemas: ``benchmarks/enrichment_avro_schemas.py``). The input is produced once, framed
with the ids of the input schemas registered beforehand; both systems read it with their
registry deserializer (the writer schema fetched by id, cached) and write their output with
their registry serializer (the output schema registered under ``<output topic>-value``):

* streamjoin: ``AvroCodec`` on the three topics (``benchmarks/workload_streamjoin_app.py``
  with ``BENCH_VALUES=avro``);
* Quix Streams: ``AvroDeserializer`` / ``AvroSerializer`` from
  ``quixstreams.models.serializers.avro`` (fastavro and confluent-kafka's registry client;
  ``benchmarks/workload_quix_app.py``).

Faust has no registry codec, so it is not run. The registry is a local Apicurio
(``streamjoin.local_registry``, started for the run and stopped after it), or the one at
``$STREAMJOIN_SCHEMA_REGISTRY_URL`` (loopback only). Every output record is decoded with the
schema its id names and checked as ``enrichment.py`` checks JSON.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from io import BytesIO
from typing import Any

import fastavro

from benchmarks import enrichment_avro_schemas as schemas
from benchmarks.enrichment import Outputs, enrichment_spec, generate
from benchmarks.harness import workload_arguments, workload_main
from streamjoin.schema_registry import AvroCodec, SchemaRegistryClient
from streamjoin.schema_registry.wire import unframe

Record = tuple[str, bytes, bytes, int]


def to_avro(records: list[Record], registry: SchemaRegistryClient) -> list[Record]:
    """``enrichment.generate``'s JSON records as Avro records framed with the input schemas'
    ids (registered under the fixed subjects of ``SUBJECTS``)."""
    codecs = {
        "table": AvroCodec(schemas.USER, registry, subject=schemas.SUBJECTS["table"]),
        "input": AvroCodec(schemas.EVENT, registry, subject=schemas.SUBJECTS["input"]),
    }
    out = []
    for topic, key, value, ts in records:
        data = codecs[topic].dumps(json.loads(value))
        assert data is not None
        out.append((topic, key, data, ts))
    return out


def as_json(outputs: Outputs, registry: SchemaRegistryClient) -> Outputs:
    """Each Avro output value decoded with the schema its id names, as JSON for the check."""
    parsed: dict[int, Any] = {}
    decoded: Outputs = []
    for key, raw in outputs:
        if raw is None:
            decoded.append((key, raw))
            continue
        schema_id, payload = unframe(raw)
        if schema_id not in parsed:
            parsed[schema_id] = fastavro.parse_schema(
                json.loads(registry.schema_of(schema_id).schema)
            )
        value = fastavro.schemaless_reader(BytesIO(payload), parsed[schema_id], None)
        decoded.append((key, json.dumps(value).encode()))
    return decoded


@contextmanager
def registry_url() -> Iterator[str]:
    """``$STREAMJOIN_SCHEMA_REGISTRY_URL`` (loopback only), else a local registry's URL."""
    given = os.environ.get("STREAMJOIN_SCHEMA_REGISTRY_URL")
    if given:
        host = urllib.parse.urlsplit(given).hostname or ""
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise SystemExit(f"STREAMJOIN_SCHEMA_REGISTRY_URL must be on loopback: {given}")
        yield given
        return
    from streamjoin.local_registry import LocalRegistry

    with LocalRegistry() as registry:
        yield registry.ccompat_url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_arguments(parser, events=300_000, keys=10_000)
    parser.set_defaults(systems="streamjoin,quix")
    args = parser.parse_args(argv)
    records, truth = generate(args.events, args.keys, args.seed)
    with registry_url() as url:
        registry = SchemaRegistryClient(url)
        avro_records = to_avro(records, registry)
        # the apps read these from their environment (the harness passes it on)
        os.environ[schemas.VALUES_ENV], os.environ[schemas.REGISTRY_ENV] = "avro", url
        spec = enrichment_spec(
            args,
            avro_records,
            truth,
            bench="enrichment_avro",
            values=", Avro values (schema registry)",
            decode=lambda outputs: as_json(outputs, registry),
        )
        return workload_main(args, spec)


if __name__ == "__main__":
    raise SystemExit(main())
