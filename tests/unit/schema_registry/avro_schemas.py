"""Avro schemas and values the unit and real-registry tests share: every Avro type, and
two versions of a record (v2 adds a field with a default)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

ALL_TYPES: dict[str, Any] = {
    "type": "record",
    "name": "AllTypes",
    "namespace": "test",
    "fields": [
        {"name": "nothing", "type": "null"},
        {"name": "flag", "type": "boolean"},
        {"name": "small", "type": "int"},
        {"name": "big", "type": "long"},
        {"name": "single", "type": "float"},
        {"name": "double", "type": "double"},
        {"name": "blob", "type": "bytes"},
        {"name": "text", "type": "string"},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "numbers", "type": {"type": "array", "items": "long"}},
        {"name": "labels", "type": {"type": "map", "values": "string"}},
        {"name": "either", "type": ["null", "string", "long"]},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3},
        },
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {
            "name": "inner",
            "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]},
        },
    ],
}


def all_types_value(n: int) -> dict[str, Any]:
    """A value of ALL_TYPES, different for each ``n``, that reads back equal."""
    utc = dt.timezone.utc
    return {
        "nothing": None,
        "flag": n % 2 == 0,
        "small": -(2**31) + n,
        "big": 2**62 + n,
        "single": 1.5 + n,  # exact in a float
        "double": 0.1 * n,
        "blob": bytes([n % 256, 0, 255]),
        "text": f"héllo {n} ✓",
        "color": "GREEN" if n % 2 else "RED",
        "numbers": list(range(n % 4)),
        "labels": {"k": str(n)},
        "either": [None, f"s{n}", n][n % 3],
        "digest": bytes([n % 256]) * 4,
        "price": decimal.Decimal(f"{n}.125"),
        "id": uuid.UUID(int=n + 1),
        "day": dt.date(2024, 2, 29) + dt.timedelta(days=n),
        "at_ms": dt.time(1, 2, 3, 4000),
        "at_us": dt.time(1, 2, 3, 4567),
        "ts_ms": dt.datetime(2024, 1, 1, 1, 1, 1, 123000, tzinfo=utc) + dt.timedelta(hours=n),
        "ts_us": dt.datetime(2024, 1, 1, 1, 1, 1, 123456, tzinfo=utc) + dt.timedelta(hours=n),
        "inner": {"x": n},
    }


ORDER_V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
}
ORDER_V2: dict[str, Any] = {
    **ORDER_V1,
    "fields": [*ORDER_V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}],
}
#: v2 plus a field without a default: a v3 reader cannot read older records (not BACKWARD)
ORDER_V3: dict[str, Any] = {
    **ORDER_V2,
    "fields": [*ORDER_V2["fields"], {"name": "customer", "type": "string"}],
}
